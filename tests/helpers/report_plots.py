"""Run folders for the report's figures, written by the runner's own writers with known curves and client
scores (the fixture ``runs``: two seeds of client.lr 0.1 and one of 0.05), and what a figure drew."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from matplotlib.figure import Figure

from pfl.runner.outputs import RunFiles

# Two seeds of client.lr 0.1 and one of 0.05: per round (1, 2, 3) their P-model and global accuracy.
CURVES = {
    "a0": {"pm.l_acc.mean": [0.2, 0.4, 0.5], "gm.acc": [0.1, 0.3, 0.35]},
    "a1": {"pm.l_acc.mean": [0.3, 0.5, 0.9], "gm.acc": [0.2, 0.2, 0.45]},
    "b0": {"pm.l_acc.mean": [0.1, 0.2, 0.3], "gm.acc": [0.1, 0.1, 0.2]},
}


CLIENTS = {"a0": [0.5, 0.7, 0.1], "a1": [0.9, 0.95, 0.2], "b0": [0.3, 0.35, 0.4]}


SETTING = {"a0": (0, 0.1), "a1": (1, 0.1), "b0": (0, 0.05)}  # seed, client.lr


def write_run(
    root: Path, name: str, seed: int, lr: float, curves: dict, clients: list[float], method: str = "fedavg"
) -> Path:
    """A run folder as `fit` writes it (the runner's own writers), with known numbers."""
    files = RunFiles(root / name)
    config = {
        "seed": seed,
        "method": {"name": method},
        "client": {"lr": lr, "epochs": 1},
        "data": {"source": "digits", "alpha": 0.5},
        "tracking": {"root": str(root), "name": name, "wandb": False},
    }
    files.write_config(yaml.safe_dump(config))
    rounds = len(next(iter(curves.values())))
    history = [{"round": r + 1, **{k: v[r] for k, v in curves.items()}} for r in range(rounds)]
    files.write_metrics(history)
    files.write_clients([{"client": i, "n_train": 10, "pm.l_acc": v, "gm.l_acc": v / 2} for i, v in enumerate(clients)])
    files.write_summary({"method": method, "seed": seed, "select": "final", "metrics": history[-1]})
    return files.dir


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    return [write_run(tmp_path, name, *SETTING[name], CURVES[name], CLIENTS[name]) for name in CURVES]


def drawn(fig: Figure, gid: str) -> list:
    (ax,) = fig.axes
    return [a for a in [*ax.lines, *ax.collections] if a.get_gid() == gid]


def band_edges(band) -> dict[float, set[float]]:
    """x -> the y values of the band's outline at x (its lower and upper edge)."""
    edges: dict[float, set[float]] = {}
    for x, y in band.get_paths()[0].vertices:
        edges.setdefault(round(float(x), 9), set()).add(round(float(y), 9))
    return edges
