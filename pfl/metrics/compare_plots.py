"""Figures that compare runs, grouped as ``pfl report`` groups them (runs that differ only in their seed
are one group, labelled by the settings that differ between groups):

- ``curve_figure``: one per-round metric of each group over the rounds (``metrics.csv``), the mean over
  the group's runs as a line and their min–max as a band;
- ``clients_figure``: the reported round's per-client scores (``clients.csv``), one box per group with
  the clients of all its runs pooled, every client a dot.

``pfl report --plot/--plot-clients`` and the reproduction suite's claim reports draw with these.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

import numpy as np
from matplotlib import rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pfl.errors import ConfigError
from pfl.metrics.plots import LABELS, new_figure
from pfl.metrics.report import Defaults, group_runs, load_config, load_summary, setting_text, swept_settings, table_runs

HISTORY_FILE = "metrics.csv"  # one row per evaluated round (pfl.runner.outputs)
CLIENTS_FILE = "clients.csv"  # one row per client of the reported round
# The main metric when none is asked for: the first that every run logged.
CURVE_KEYS = ("pm.l_acc.mean", "gm.acc", "pm.mae.mean", "gm.mae")
CLIENT_KEYS = ("pm.l_acc", "pm.mae")
BAND = "band: min–max over seeds"
BOX_INCHES = 1.6  # figure width per group of the client figure, beyond the default width
BOX_WIDTH = 0.5  # of a box, in units of the distance between boxes
INDEX = ("round", "client")  # columns that say where a row belongs, never drawn


@dataclass
class PlotGroup:
    """Runs drawn as one: their label and folders, in the order given."""

    label: str
    run_dirs: list[Path]


def plot_groups(
    run_dirs: list[Path],
    names: list[str] | None = None,
    *,
    group: bool = True,
    label_by_name: bool = False,
    defaults: Defaults | None = None,
) -> list[PlotGroup]:
    """The runs grouped as ``pfl report`` groups them (``group=False``: one per run; ``defaults`` fills
    options a config lacks), each labelled by its method and the settings that differ between groups
    (``label_by_name``: by its first run's name)."""
    dirs = [Path(d) for d in run_dirs]
    names = list(names) if names is not None else [d.name for d in dirs]
    runs = table_runs([load_summary(d) for d in dirs], names, [load_config(d) for d in dirs], group, defaults)
    folder = {id(run): d for run, d in zip(runs, dirs, strict=True)}  # names need not be unique
    groups = group_runs(runs)
    swept = swept_settings(groups)
    return [
        PlotGroup(
            g.runs[0].name if label_by_name else settings_label(g.settings, swept), [folder[id(r)] for r in g.runs]
        )
        for g in groups
    ]


def settings_label(settings: dict, swept: list[str]) -> str:
    """``method, key=value, ...`` over the settings that differ (``-``: a setting the group lacks)."""
    parts = [setting_text(settings.get("method", ""))]
    parts += [f"{k}={setting_text(settings[k]) if k in settings else '-'}" for k in swept]
    return ", ".join(parts)


def check_output(path: Path, flag: str) -> Path:
    """``path`` if a figure can be written there (a known image suffix, not a folder, under a writable
    folder); else a ConfigError naming ``flag``. Checked before anything is read or drawn."""
    path = Path(path)
    kinds = FigureCanvasAgg.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in kinds:
        raise ConfigError(flag, f"{path} has no image suffix", "end the name in .png (or .pdf, .svg)")
    if path.is_dir():
        raise ConfigError(flag, f"{path} is a folder", "give a file name, e.g. runs/compare.png")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the folder is made when the figure is saved
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"cannot write {path}: {folder} is not a writable folder", "choose another path")
    return path


def read_rows(path: Path) -> list[dict[str, float]]:
    """A csv the runner writes, each row's finite numbers by column (blank and non-numeric cells left out)."""
    if not path.exists():
        raise ConfigError(
            "RUN_DIR", f"{path.parent} has no {path.name}", "pass directories written by `python -m pfl fit`"
        )
    with open(path, newline="") as fh:
        return [{k: float(v) for k, v in row.items() if _finite(v)} for row in csv.DictReader(fh)]


def _finite(text: str | None) -> bool:
    try:
        return math.isfinite(float(text))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def pick_key(
    tables: dict[Path, list[dict[str, float]]], key: str | None, defaults: tuple[str, ...], flag: str, file: str
) -> str:
    """``key`` (or ``key.mean``) if every run's ``file`` has it, else the first of ``defaults`` that every
    run has; otherwise a ConfigError naming ``flag``, the runs without it and the keys all runs share."""
    present = {d: {k for row in rows for k in row} for d, rows in tables.items()}
    first = list(dict.fromkeys(k for rows in tables.values() for row in rows for k in row))
    common = [k for k in first if k not in INDEX and all(k in p for p in present.values())]
    for k in (key, f"{key}.mean") if key else defaults:
        if k in common:
            return k
    lacking = [d.name for d, p in present.items() if not ({key, f"{key}.mean"} if key else set(defaults)) & p]
    what = f"{key!r} is not" if key else f"none of {', '.join(defaults)} is"
    raise ConfigError(
        flag,
        f"{what} in every run's {file} (missing in {', '.join(lacking) or 'some run'}; "
        f"available in all: {', '.join(common) or 'none'})",
        "choose an available key",
    )


def curve_points(histories: list[list[dict[str, float]]], key: str) -> tuple[np.ndarray, ...]:
    """(rounds, mean, min, max) of ``key`` over the runs, per round that any run evaluated (over the
    runs that did)."""
    series = [{row["round"]: row[key] for row in rows if key in row and "round" in row} for rows in histories]
    rounds = sorted(set().union(*series))
    values = [[s[r] for s in series if r in s] for r in rounds]
    return (
        np.array(rounds, dtype=float),
        np.array([fmean(v) for v in values]),
        np.array([min(v) for v in values]),
        np.array([max(v) for v in values]),
    )


def curve_figure(groups: list[PlotGroup], key: str | None = None, title: str | None = None) -> tuple[Figure, str]:
    """Each group's ``key`` (default: the runs' main accuracy) against the round: the mean over its runs,
    a min–max band where it has several. Returns the figure and the key drawn."""
    histories = {d: read_rows(d / HISTORY_FILE) for g in groups for d in g.run_dirs}
    key = pick_key(histories, key, CURVE_KEYS, "--plot-metric", HISTORY_FILE)
    fig, ax = new_figure(tuple(rcParams["figure.figsize"]))
    for g in groups:
        x, mean, low, high = curve_points([histories[d] for d in g.run_dirs], key)
        (line,) = ax.plot(x, mean, marker=".", gid="mean", label=f"{g.label} ({_runs(g)})")
        if len(g.run_dirs) > 1:
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, gid="band")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"{LABELS[key]} ({key})" if key in LABELS else key)
    ax.set_title(f"{title + chr(10) if title else ''}{key}: mean over seeds, {BAND}", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig, key


def _runs(group: PlotGroup) -> str:
    return f"{len(group.run_dirs)} run{'s' * (len(group.run_dirs) > 1)}"


def clients_figure(groups: list[PlotGroup], key: str | None = None, title: str | None = None) -> tuple[Figure, str]:
    """The reported round's per-client ``key`` (default: own-test accuracy, MAE for regression), one box
    per group over the clients of all its runs (whiskers at min and max), every client a dot."""
    tables = {d: read_rows(d / CLIENTS_FILE) for g in groups for d in g.run_dirs}
    key = pick_key(tables, key, CLIENT_KEYS, "--plot-clients", CLIENTS_FILE)
    pooled = [[row[key] for d in g.run_dirs for row in tables[d] if key in row] for g in groups]
    width, height = rcParams["figure.figsize"]
    fig, ax = new_figure((max(width, BOX_INCHES * len(groups)), height))  # labels side by side
    parts = ax.boxplot(pooled, whis=(0, 100), showmeans=True, widths=BOX_WIDTH)
    for name in ("boxes", "medians", "whiskers", "means"):
        for artist in parts[name]:
            artist.set_gid(name)
    for i, values in enumerate(pooled, start=1):  # the clients themselves, spread inside their box
        spread = np.linspace(-BOX_WIDTH / 4, BOX_WIDTH / 4, len(values))
        ax.plot(i + spread, values, ".", color="black", alpha=0.4, gid="clients")
    ticks = [f"{g.label}\n{len(v)} clients, {_runs(g)}" for g, v in zip(groups, pooled, strict=True)]
    ax.set_xticks(range(1, len(groups) + 1), ticks, fontsize="small")
    ax.set_ylabel(f"{key} per client")
    heading = f"{key} per client of the reported round, seeds pooled\nbox: quartiles, whiskers: min–max, ▲ mean"
    ax.set_title(f"{title}\n{heading}" if title else heading, fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    return fig, key
