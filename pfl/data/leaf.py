"""LEAF json (Shakespeare, FEMNIST): ``ROOT/train/*.json`` and ``ROOT/test/*.json``, each
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``.
Users are natural clients and keep LEAF's own train/test split. A damaged file or a user whose
samples do not fit the format is a ConfigError naming the file and the user."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pfl.data.bundled import LEAF_LETTERS, encode_text
from pfl.data.validate import Part, pool_parts, validate_source
from pfl.errors import ConfigError

LAYOUT = (
    'ROOT/train/*.json and ROOT/test/*.json in LEAF format: {"users": [...], "user_data": {user: {"x": [...], '
    '"y": [...]}}} (what LEAF\'s preprocess.sh writes to data/<name>/data/{train,test})'
)


FIELD = "data.root"
FEMNIST_PIXELS = 28 * 28
Users = dict[str, dict[str, list]]


def _read_users(folder: Path) -> tuple[Users, dict[str, str]]:
    """Every user's samples across the json files of ``folder``, and the file each user came from."""
    users: Users = {}
    files: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            blob = json.loads(path.read_text())
            for user in blob["users"]:
                entry = users.setdefault(user, {"x": [], "y": []})
                entry["x"].extend(blob["user_data"][user]["x"])
                entry["y"].extend(blob["user_data"][user]["y"])
                files.setdefault(user, str(path))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(FIELD, f"{path} is not readable JSON ({err})", f"expected layout: {LAYOUT}") from None
        except (KeyError, TypeError) as err:
            raise ConfigError(
                FIELD, f"{path} is not a LEAF file (missing or malformed entry {err})", f"expected layout: {LAYOUT}"
            ) from None
    return users, files


def _encode(kind: str, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    if kind == "leaf_shakespeare":
        x = np.stack([encode_text(s) for s in xs]) if xs else np.zeros((0, 80), dtype=np.int64)
        y = encode_text("".join(ys)) if ys else np.zeros(0, dtype=np.int64)
        return x, y
    x = np.asarray(xs, dtype=np.float32)
    if len(x) and x.shape[1:] != (FEMNIST_PIXELS,):
        raise ValueError(f"samples have shape {x.shape[1:]}, FEMNIST's have {FEMNIST_PIXELS} pixels")
    return x.reshape(-1, 1, 28, 28), np.asarray(ys)


def leaf_parts(kind: str, root: Path) -> tuple[list[Part], int, list[str]]:
    """One Part per user and split (train, test), users in sorted order; num_classes; user names."""
    train_dir, test_dir = root / "train", root / "test"
    if not train_dir.is_dir() or not any(train_dir.glob("*.json")):
        raise ConfigError(FIELD, f"{kind}: no LEAF json files in {train_dir}", f"expected layout: {LAYOUT}")
    tables = [_read_users(train_dir), _read_users(test_dir) if test_dir.is_dir() else ({}, {})]
    parts, names = [], sorted(tables[0][0])
    for user in names:
        for split, (users, files) in zip(("train", "test"), tables, strict=True):
            entry = users.get(user, {"x": [], "y": []})
            file = files.get(user, f"{test_dir} (user absent)")
            try:
                x, y = _encode(kind, entry["x"], entry["y"])
            except (ValueError, TypeError, AttributeError) as err:
                raise ConfigError(FIELD, f"{file} (client {user}, {split}): samples are malformed ({err})") from None
            parts.append(Part(x, y, file, user, split))
    num_classes = len(LEAF_LETTERS) if kind == "leaf_shakespeare" else 62
    return parts, num_classes, names


def load_leaf(
    kind: str, root: Path
) -> tuple[np.ndarray, np.ndarray, int, list[str], list[tuple[np.ndarray, np.ndarray]]]:
    """Validated and pooled: (x, y, num_classes, user names, per-user (train, test) indices into x)."""
    parts, num_classes, names = leaf_parts(kind, root)
    validate_source(parts, num_classes, fixed_splits=True)
    x, y, index = pool_parts(parts)
    return x, y, num_classes, names, [(index[2 * k], index[2 * k + 1]) for k in range(len(names))]
