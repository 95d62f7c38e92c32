"""PNG figures in the run directory: per-round curves, the per-client score histogram and the
per-client scatter of personalized against LOCAL accuracy.

A figure without an explicit ``title`` takes one from the ``summary.json`` (and ``config.yaml``) next to it
when there is one (``fit`` writes the summary before its figures): "method on dataset, partition (seed,
clients)". Axes and legends name metrics in words (``LABELS``, ``CLIENT_LABELS``), a series keeps one colour
in every panel (``series_color``), and round axes are ticked at evaluated rounds (``set_round_ticks``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pfl.data.sources import is_natural
from pfl.safe_files import write_atomic

if TYPE_CHECKING:  # the data's figures import torch when they are drawn; a run's curves never do
    from pfl.data.federated import FederatedData

# (panel title, y label, keys in drawing order): one subplot per family present in the history.
FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "accuracy",
        "accuracy",
        ("pm.l_acc.mean", "pm.s_acc.mean", "pm.g_acc.mean", "pm.val_acc.mean", "gm.acc", "gm.l_acc.mean"),
    ),
    (
        "error",
        "mean absolute error",
        ("pm.mae.mean", "pm.s_mae.mean", "pm.g_mae.mean", "pm.val_mae.mean", "gm.mae", "gm.l_mae.mean"),
    ),
    ("loss", "loss", ("train.loss", "pm.l_loss.mean", "pm.val_loss.mean", "gm.loss", "gm.l_loss.mean")),
    ("against LOCAL", "score", ("r_acc.mean", "ptr", "gain.mean", "r_mae.mean", "ptr_mae", "gain_mae.mean")),
)
CURVE_KEYS = tuple(key for _, _, keys in FAMILIES for key in keys)
LABELS = {
    "pm.l_acc.mean": "P-models, own test (L-acc)",
    "pm.s_acc.mean": "P-models, S-test (S-acc)",
    "pm.g_acc.mean": "P-models, G-test (G-acc)",
    "pm.val_acc.mean": "P-models, validation",
    "gm.acc": "global model, global test",
    "gm.l_acc.mean": "global model, clients' tests",
    "pm.mae.mean": "P-models, own test",
    "pm.s_mae.mean": "P-models, S-test",
    "pm.g_mae.mean": "P-models, G-test",
    "pm.val_mae.mean": "P-models, validation",
    "gm.mae": "global model, global test",
    "gm.l_mae.mean": "global model, clients' tests",
    "train.loss": "training",
    "pm.l_loss.mean": "P-models, own test",
    "pm.val_loss.mean": "P-models, validation",
    "gm.loss": "global model, global test",
    "gm.l_loss.mean": "global model, clients' tests",
    "r_acc.mean": "R-Acc",
    "ptr": "PTR",
    "gain.mean": "gain over LOCAL",
    "r_mae.mean": "relative MAE change",
    "ptr_mae": "PTR (MAE)",
    "gain_mae.mean": "MAE gain over LOCAL",
}
BANDS = ("pm.l_acc.mean", "pm.mae.mean")  # the headline curve gets its spread over clients
# Per-client scores (clients.csv), in words; ``ref.KEY`` is the LOCAL reference's score.
CLIENT_LABELS = {
    "pm.l_acc": "P-model accuracy, own test",
    "pm.mae": "P-model MAE, own test",
    "gm.l_acc": "global model accuracy, own test",
    "gm.l_mae": "global model MAE, own test",
    "pm.s_acc": "P-model accuracy, S-test",
    "pm.g_acc": "P-model accuracy, G-test",
}
# One colour per series (which model, scored on which data) in every panel: the P-models' own-test accuracy
# and loss are one colour, the global model's another.
SERIES_COLORS = {
    ("pm.l_acc.mean", "pm.mae.mean", "pm.l_loss.mean"): "C0",
    ("gm.acc", "gm.mae", "gm.loss"): "C1",
    ("gm.l_acc.mean", "gm.l_mae.mean", "gm.l_loss.mean"): "C2",
    ("pm.val_acc.mean", "pm.val_mae.mean", "pm.val_loss.mean"): "C3",
    ("pm.s_acc.mean", "pm.s_mae.mean"): "C4",
    ("pm.g_acc.mean", "pm.g_mae.mean"): "C5",
    ("train.loss",): "C7",
    ("r_acc.mean", "r_mae.mean"): "C6",
    ("ptr", "ptr_mae"): "C8",
    ("gain.mean", "gain_mae.mean"): "C9",
}
MAX_ROUND_TICKS = 10
MAX_CLIENT_ROWS = 60  # labelled rows of the data heatmap (every k-th beyond)


def series_color(key: str) -> str | None:
    """The colour of ``key``'s series (None: a key without one, e.g. a newly logged loss)."""
    return next((color for keys, color in SERIES_COLORS.items() if key in keys), None)


def metric_label(key: str) -> str:
    """A per-round metric in words, with what it measures: "accuracy: P-models, own test (L-acc)",
    "loss: global model, global test"; a key without words stays as it is."""
    if key not in LABELS:
        return key
    family = next(ylabel for name, ylabel, keys in FAMILIES if key in keys)
    return LABELS[key] if family == "score" else f"{family}: {LABELS[key]}"


def client_label(key: str) -> str:
    """A per-client score in words: ``pm.l_acc`` -> "P-model accuracy, own test" (``ref.``: LOCAL's)."""
    if key.startswith("ref."):
        return "LOCAL " + client_label(key[len("ref.") :]).replace("P-model ", "")
    return CLIENT_LABELS.get(key, key)


def set_round_ticks(ax: Any, rounds: Any) -> None:
    """Ticks at evaluated rounds only (every k-th when there are more than ``MAX_ROUND_TICKS``, counted
    back from the last, the reported one), never between two evaluations."""
    evaluated = sorted({int(r) for r in rounds})
    if not evaluated:
        return
    step = math.ceil(len(evaluated) / MAX_ROUND_TICKS)
    ax.set_xticks(evaluated[::-1][::step][::-1])


def data_setting(data: dict[str, Any]) -> str:
    """How a run's ``data:`` group splits the clients, in words: "Dirichlet α=0.5", "pathological, 2 classes
    per client", "IID", or nothing for a naturally federated source (its own clients)."""
    if is_natural(data.get("source")):
        return ""
    partition = data.get("partition", "dirichlet")
    if partition == "dirichlet":
        return f"Dirichlet α={data.get('alpha', 0.5)}"
    if partition == "pathological":
        k = data.get("classes_per_client", 2)
        return f"pathological, {k} class{'es' * (k != 1)} per client"
    return "IID" if partition == "iid" else str(partition)


SAVE_DPI = 100  # the resolution pfl writes its figures at


def new_figure(figsize: tuple[float, float], rows: int = 1, cols: int = 1, squeeze: bool = True) -> tuple[Figure, Any]:
    """A figure and its axes outside pyplot: no matplotlib backend is chosen or changed, so a notebook's
    inline plots keep working after a run, and nothing needs closing."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, cols, squeeze=squeeze)


def save_figure(fig: Figure, path: Path, dpi: int = SAVE_DPI) -> None:
    """Lay out and write a figure (creating the folder): the one way pfl saves a plot."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # replaced whole, never written through a link planted at ``path``
    write_atomic(path, lambda fh: fig.savefig(fh, dpi=dpi, format=path.suffix.lstrip(".") or "png"))


def run_title(run_dir: Path) -> str | None:
    """ "method on dataset, partition (seed s, n clients)" from ``run_dir/summary.json`` (the partition from
    ``config.yaml``, where there is one); None without a summary."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary_title(summary, _config_data(Path(run_dir)))


def summary_title(summary: dict[str, Any], data: dict[str, Any] | None = None) -> str:
    """A run's figure title from its summary and its config's ``data:`` group."""
    title = str(summary.get("method", "run"))
    if summary.get("dataset"):
        title += f" on {summary['dataset']}"
    setting = data_setting(data) if data else ""
    title += f", {setting}" if setting else ""
    details = [f"{k} {summary[k]}" for k in ("seed",) if k in summary]
    details += [f"{summary['num_clients']} clients"] if "num_clients" in summary else []
    return title + (f" ({', '.join(details)})" if details else "")


def _config_data(run_dir: Path) -> dict[str, Any] | None:
    """The ``data:`` group of ``run_dir/config.yaml`` (None: no readable one)."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    data = config.get("data") if isinstance(config, dict) else None
    return data if isinstance(data, dict) else None


def _title(title: str | None, path: Path) -> str | None:
    return title if title is not None else run_title(path.parent)


def curve_families(history: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """The families with at least one key in ``history``; any other ``*loss`` key (not a std) joins
    the loss panel, so a newly logged loss is drawn without a change here."""
    present = {k for row in history for k in row}
    extra_losses = sorted(
        k for k in present if "loss" in k and not k.endswith(".std") and k not in CURVE_KEYS and k != "round"
    )
    out = []
    for name, ylabel, keys in FAMILIES:
        drawn = [k for k in keys if k in present] + (extra_losses if name == "loss" else [])
        if drawn:
            out.append((name, ylabel, drawn))
    return out


def _style(key: str) -> dict[str, Any]:
    if key.startswith("gm."):
        return {"linestyle": "--", "marker": "s"}
    if key.startswith("train"):
        return {"linestyle": ":", "marker": "^"}
    return {"linestyle": "-", "marker": "o"}


def plot_curves(history: list[dict[str, Any]], path: Path, title: str | None = None) -> list[str]:
    """One subplot per metric family (accuracy or error, loss, against LOCAL) against the round, the
    P-models' own-test curve with a ± std over clients band; returns the keys drawn."""
    families = curve_families(history)
    cols = min(len(families), 2) or 1
    rows = math.ceil(len(families) / cols) or 1
    fig, axes = new_figure((5.2 * cols, 3.6 * rows), rows, cols, squeeze=False)
    drawn: list[str] = []
    for ax, (name, ylabel, keys) in zip(axes.flat, families, strict=False):
        for key in keys:
            points = [(row["round"], row[key]) for row in history if row.get(key) is not None]
            x = np.array([p[0] for p in points], dtype=float)
            y = np.array([p[1] for p in points], dtype=float)
            color = {"color": series_color(key)} if series_color(key) else {}
            (line,) = ax.plot(x, y, markersize=3, label=f"{LABELS.get(key, key)}", **color, **_style(key))
            std_key = key.replace(".mean", ".std")
            if key in BANDS and all(std_key in row for row in history if row.get(key) is not None):
                sd = np.array([row[std_key] for row in history if row.get(key) is not None], dtype=float)
                ax.fill_between(x, y - sd, y + sd, color=line.get_color(), alpha=0.15, label="± std over clients")
            drawn.append(key)
        ax.set_title(name)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        set_round_ticks(ax, [row["round"] for row in history if any(row.get(k) is not None for k in keys)])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(families) :]:
        ax.set_visible(False)
    if not families:
        axes.flat[0].text(0.5, 0.5, "no per-round metrics", ha="center", va="center")
        axes.flat[0].set_axis_off()
    heading = _title(title, path)
    if heading:
        fig.suptitle(heading)
    save_figure(fig, path)
    return drawn


def _finite(rows: list[dict[str, Any]], key: str) -> np.ndarray:
    values = np.array([float(r[key]) for r in rows if r.get(key) not in (None, "")], dtype=float)
    return values[np.isfinite(values)]


def _score_name(keys: list[str]) -> str:
    if all("mae" in k for k in keys):
        return "mean absolute error"
    if all("acc" in k for k in keys):
        return "accuracy"
    return "score"


def plot_client_histogram(
    rows: list[dict[str, Any]], path: Path, keys: tuple[str, ...], title: str | None = None
) -> list[str]:
    """Histogram over clients of each per-client score in ``keys`` present in ``rows``: side-by-side
    bars on shared bin edges (series that coincide, e.g. FedAvg's P-model and global model, both stay
    visible), the mean of each as a dashed line."""
    present = [k for k in keys if rows and k in rows[0]]
    series = {k: _finite(rows, k) for k in present}
    present = [k for k in present if series[k].size]
    fig, ax = new_figure((6.4, 4))
    if present:
        edges = np.histogram_bin_edges(np.concatenate([series[k] for k in present]), bins=min(20, max(5, len(rows))))
        labels = [f"{client_label(k)} (mean {series[k].mean():.3f})" for k in present]
        _, _, patches = ax.hist([series[k] for k in present], bins=edges, label=labels, alpha=0.85, rwidth=0.9)
        for k, bars in zip(present, patches if len(present) > 1 else [patches], strict=True):
            color = bars[0].get_facecolor()
            ax.axvline(series[k].mean(), color=color, linestyle="--", linewidth=1.2)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no per-client scores", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(f"{_score_name(present)} per client")
    ax.set_ylabel("clients")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="y", alpha=0.3)
    heading = _title(title, path)
    ax.set_title(f"{heading}\nper-client scores, {len(rows)} clients" if heading else f"{len(rows)} clients")
    save_figure(fig, path)
    return present


def plot_client_scatter(
    rows: list[dict[str, Any]],
    path: Path,
    own_key: str = "pm.l_acc",
    ref_key: str = "ref.pm.l_acc",
    title: str | None = None,
) -> dict[str, float] | None:
    """Each client's personalized score (y) against its LOCAL score (x), the diagonal y = x: a client
    on or above it (below, for MAE) passes, PTR is the share that pass (FedORA), the mean vertical
    distance is PGFed's mean gain. Returns ``{"ptr", "gain.mean", "clients"}``; None (and no file)
    when no row has both keys."""
    from pfl.metrics.protocols import reference_metrics

    both = [r for r in rows if r.get(own_key) not in (None, "") and r.get(ref_key) not in (None, "")]
    if not both:
        return None
    own = np.array([float(r[own_key]) for r in both])
    ref = np.array([float(r[ref_key]) for r in both])
    higher = "mae" not in own_key
    comp = reference_metrics(own, ref, higher_is_better=higher)
    passed = own >= ref if higher else own <= ref
    lo, hi = float(min(own.min(), ref.min())), float(max(own.max(), ref.max()))
    pad = 0.05 * (hi - lo) or 0.05
    lo, hi = lo - pad, hi + pad
    fig, ax = new_figure((5.2, 5.2))
    region = "on or above: passes" if higher else "on or below: passes"
    ax.fill_between([lo, hi], [lo, hi], hi if higher else lo, color="tab:green", alpha=0.08, linewidth=0, label=region)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x (as good as LOCAL)")
    word = "≥" if higher else "≤"
    ax.scatter(ref[passed], own[passed], color="tab:green", alpha=0.7, label=f"{passed.sum()} clients {word} LOCAL")
    others = "<" if higher else ">"
    ax.scatter(
        ref[~passed], own[~passed], color="tab:red", marker="x", label=f"{(~passed).sum()} clients {others} LOCAL"
    )
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel(client_label(ref_key))
    ax.set_ylabel(client_label(own_key))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    name = "PTR" if higher else "PTR (MAE)"
    gain = "mean gain" if higher else "mean MAE change"
    summary = f"{name} = {comp['ptr']:.2f} ({passed.sum()}/{len(own)}), {gain} {comp['gain.mean']:+.3f}"
    heading = _title(title, path)
    ax.set_title(f"{heading}\n{summary}" if heading else summary, fontsize=10)
    save_figure(fig, path)
    return {"ptr": comp["ptr"], "gain.mean": comp["gain.mean"], "clients": float(len(own))}


def plot_heatmap(data: FederatedData, path: Path, setting: str = "") -> None:
    """A clients x classes heatmap of sample counts (training clients, then new clients), titled with the
    data's ``setting`` (``data_setting``), every client's row labelled (its id, or its name in a
    naturally federated source; ``new i`` for held-out clients) when they fit."""
    from pfl.data.stats import label_histograms

    hist = label_histograms(data, [*data.clients, *data.new_clients])
    fig, ax = new_figure((min(max(5, 2 + 0.25 * data.num_classes), 20), min(2 + 0.15 * len(hist), 30)))
    image = ax.imshow(hist, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    rows = client_rows(data)
    step = math.ceil(len(rows) / MAX_CLIENT_ROWS)
    ax.set_yticks(range(0, len(rows), step), rows[::step], fontsize="small" if len(rows) > 20 else None)
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(f"{data.name}{', ' + setting if setting else ''}\nsamples per client and class", fontsize="medium")
    if data.new_clients:
        ax.axhline(data.num_clients - 0.5, color="red", linewidth=1)
    fig.colorbar(image, ax=ax, label="samples")
    save_figure(fig, path)


def client_rows(data: FederatedData) -> list[str]:
    """The heatmap's row labels: each training client's id (or name), then ``new i`` per held-out client."""
    labels = [str(i) for i in range(data.num_clients)] + [f"new {i}" for i in range(len(data.new_clients))]
    if len(data.client_names) == len(labels):
        labels = [f"{label} {name}" for label, name in zip(labels, data.client_names, strict=True)]
    return labels
