"""The PFLlib / PGFed ``.npz`` layout, so a partition can be compared across libraries.

``DIR/train/<id>.npz`` and ``DIR/test/<id>.npz`` (client ids 0..N-1) each hold one pickled dict
``data = {'x': array, 'y': array}``, read with ``np.load(f, allow_pickle=True)['data'].tolist()``.
pfl adds ``DIR/val/<id>.npz`` when clients have validation splits, ``DIR/global_test.npz`` for the
server's test set, and ``DIR/config.json`` (PFLlib's ``num_clients``/``num_classes`` plus the ids of
held-out new clients, which follow the training clients' ids).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pfl.data.federated import FederatedData
from pfl.errors import ConfigError

LAYOUT = "DIR/train/<id>.npz and DIR/test/<id>.npz (ids 0..N-1), each np.savez(f, data={'x': ..., 'y': ...})"


def _save(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, data={"x": x, "y": y})


def _load(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        data = np.load(f, allow_pickle=True)["data"].tolist()
    return np.asarray(data["x"]), np.asarray(data["y"], dtype=np.int64)


def export_npz(data: FederatedData, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``data`` in the npz layout; returns what ``config.json`` holds."""
    x, y = data.x.cpu().numpy(), data.y.cpu().numpy()
    everyone = [*data.clients, *data.new_clients]
    for cid, split in enumerate(everyone):
        for name in ("train", "test", "val"):
            idx = getattr(split, name).cpu().numpy()
            if name != "val" or any(len(s.val) for s in everyone):
                _save(out_dir / name / f"{cid}.npz", x[idx], y[idx])
    if len(data.global_test):
        idx = data.global_test.cpu().numpy()
        _save(out_dir / "global_test.npz", x[idx], y[idx])
    config = {
        "num_clients": len(everyone),
        "num_classes": data.num_classes,
        "dataset": data.name,
        "new_clients": list(range(data.num_clients, len(everyone))),
        "input_shape": list(data.input_shape),
        **(extra or {}),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return config


def load_npz_dir(root: Path) -> tuple[np.ndarray, np.ndarray, int, list[tuple[np.ndarray, ...]], np.ndarray, list[int]]:
    """Read a directory in the npz layout.

    Returns (x, y, num_classes, per-client (train, test, val) indices, global test indices, new-client ids).
    """
    train_dir = root / "train"
    files = sorted(train_dir.glob("*.npz"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    if not files:
        raise ConfigError("data.root", f"npz_dir: no client files in {train_dir}", f"expected layout: {LAYOUT}")
    ids = [int(p.stem) for p in files if p.stem.isdigit()]
    if ids != list(range(len(ids))):
        raise ConfigError("data.root", f"npz_dir: client ids in {train_dir} are not 0..N-1", LAYOUT)
    config = json.loads((root / "config.json").read_text()) if (root / "config.json").exists() else {}
    xs, ys, splits, offset = [], [], [], 0
    for cid in ids:
        parts = []
        for name in ("train", "test", "val"):
            path = root / name / f"{cid}.npz"
            if not path.exists():
                if name == "test":
                    raise ConfigError("data.root", f"npz_dir: {path} is missing", f"expected layout: {LAYOUT}")
                parts.append(np.zeros(0, dtype=np.int64))
                continue
            x, y = _load(path)
            xs.append(x)
            ys.append(y)
            parts.append(np.arange(offset, offset + len(y)))
            offset += len(y)
        splits.append(tuple(parts))
    global_test = np.zeros(0, dtype=np.int64)
    if (root / "global_test.npz").exists():
        x, y = _load(root / "global_test.npz")
        xs.append(x)
        ys.append(y)
        global_test = np.arange(offset, offset + len(y))
    y_all = np.concatenate(ys)
    num_classes = int(config.get("num_classes", int(y_all.max()) + 1))
    return np.concatenate(xs), y_all, num_classes, splits, global_test, list(config.get("new_clients", []))
