"""LEAF json (Shakespeare, FEMNIST): ``ROOT/train/*.json`` and ``ROOT/test/*.json``, each
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``.
Users are natural clients and keep LEAF's own train/test split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pfl.data.bundled import LEAF_LETTERS, encode_text
from pfl.errors import ConfigError

LAYOUT = (
    'ROOT/train/*.json and ROOT/test/*.json in LEAF format: {"users": [...], "user_data": {user: {"x": [...], '
    '"y": [...]}}} (what LEAF\'s preprocess.sh writes to data/<name>/data/{train,test})'
)


def _read_users(folder: Path) -> dict[str, dict[str, list]]:
    users: dict[str, dict[str, list]] = {}
    for path in sorted(folder.glob("*.json")):
        blob = json.loads(path.read_text())
        for user in blob["users"]:
            entry = users.setdefault(user, {"x": [], "y": []})
            entry["x"].extend(blob["user_data"][user]["x"])
            entry["y"].extend(blob["user_data"][user]["y"])
    return users


def _encode(kind: str, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
    if kind == "leaf_shakespeare":
        x = np.stack([encode_text(s) for s in xs]) if xs else np.zeros((0, 80), dtype=np.int64)
        y = encode_text("".join(ys)) if ys else np.zeros(0, dtype=np.int64)
        return x, y
    x = np.asarray(xs, dtype=np.float32).reshape(-1, 1, 28, 28)
    return x, np.asarray(ys, dtype=np.int64)


def load_leaf(
    kind: str, root: Path
) -> tuple[np.ndarray, np.ndarray, int, list[str], list[tuple[np.ndarray, np.ndarray]]]:
    """Returns (x, y, num_classes, user names, per-user (train, test) indices into x)."""
    train_dir, test_dir = root / "train", root / "test"
    if not train_dir.is_dir() or not any(train_dir.glob("*.json")):
        raise ConfigError("data.root", f"{kind}: no LEAF json files in {train_dir}", f"expected layout: {LAYOUT}")
    train = _read_users(train_dir)
    test = _read_users(test_dir) if test_dir.is_dir() else {}
    xs, ys, splits, names, offset = [], [], [], [], 0
    for user in sorted(train):
        parts = []
        for table in (train, test):
            entry = table.get(user, {"x": [], "y": []})
            x, y = _encode(kind, entry["x"], entry["y"])
            xs.append(x)
            ys.append(y)
            parts.append(np.arange(offset, offset + len(y)))
            offset += len(y)
        names.append(user)
        splits.append((parts[0], parts[1]))
    num_classes = len(LEAF_LETTERS) if kind == "leaf_shakespeare" else 62
    return np.concatenate(xs), np.concatenate(ys), num_classes, names, splits
