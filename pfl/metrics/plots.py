"""PNG figures in the run directory: per-round curves and the per-client score histogram."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

CURVE_KEYS = (
    "pm.l_acc.mean",
    "pm.s_acc.mean",
    "pm.g_acc.mean",
    "pm.val_acc.mean",
    "gm.acc",
    "gm.l_acc.mean",
    "pm.mae.mean",
    "gm.mae",
    "r_acc.mean",
    "ptr",
)


def save_figure(fig: plt.Figure, path: Path, dpi: int = 100) -> None:
    """Lay out, write (creating the folder) and close a figure: the one way pfl saves a plot."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot_curves(history: list[dict[str, Any]], path: Path) -> list[str]:
    """One line per metric present in ``history`` against the round; returns the keys drawn."""
    keys = [k for k in CURVE_KEYS if any(k in row for row in history)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in keys:
        points = [(row["round"], row[key]) for row in history if key in row]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=key)
    ax.set_xlabel("round")
    ax.set_ylabel("value")
    ax.grid(alpha=0.3)
    if keys:
        ax.legend(fontsize=8)
    save_figure(fig, path)
    return keys


def plot_client_histogram(rows: list[dict[str, Any]], path: Path, keys: tuple[str, ...]) -> list[str]:
    """Histogram over clients of each per-client score in ``keys`` present in ``rows``."""
    present = [k for k in keys if rows and k in rows[0]]
    fig, ax = plt.subplots(figsize=(6, 4))
    if present:  # shared bin edges so the series line up
        values = [float(r[k]) for k in present for r in rows]
        edges = np.histogram_bin_edges(values, bins=min(20, max(5, len(rows))))
    for key in present:
        ax.hist([r[key] for r in rows], bins=edges, alpha=0.6, label=key)
    ax.set_xlabel("score per client")
    ax.set_ylabel("clients")
    if present:
        ax.legend(fontsize=8)
    save_figure(fig, path)
    return present
