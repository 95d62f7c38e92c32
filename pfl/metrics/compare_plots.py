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
import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

import numpy as np
from matplotlib import rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

from pfl.errors import ConfigError
from pfl.metrics.plots import SAVE_DPI, client_label, data_setting, metric_label, new_figure, set_round_ticks
from pfl.metrics.report import Defaults, group_runs, load_config, load_summary, setting_text, swept_settings, table_runs

HISTORY_FILE = "metrics.csv"  # one row per evaluated round (pfl.runner.outputs)
CLIENTS_FILE = "clients.csv"  # one row per client of the reported round
# The main metric when none is asked for: the first that every run logged.
CURVE_KEYS = ("pm.l_acc.mean", "gm.acc", "pm.mae.mean", "gm.mae")
CLIENT_KEYS = ("pm.l_acc", "pm.mae")
BAND = "band: min–max over seeds"
BOX_INCHES = 1.6  # figure width per group of the client figure, beyond the default width
AXIS_INCHES = 1.0  # the client figure's width left of its axes (the y label and ticks)
LABEL_GAP_INCHES = 0.15  # between neighbouring groups' labels of the client figure
BOX_WIDTH = 0.5  # of a box, in units of the distance between boxes
LEGEND_INSIDE_INCHES = 2.5  # a legend line wider than this goes below the axes, where it has the figure's width
LEGEND_MARGIN_INCHES = 1.0  # a legend's width besides its text (the line drawn before it, padding, frame)
LEGEND_LINE_INCHES = 0.2  # what a line of the legend below adds to the figure's height
INDEX = ("round", "client")  # columns that say where a row belongs, never drawn


@dataclass
class PlotGroup:
    """Runs drawn as one: their label and folders, in the order given."""

    label: str
    run_dirs: list[Path]


def shared_setting(groups: list[PlotGroup]) -> str:
    """The dataset and partition every drawn run shares ("digits, Dirichlet α=0.5"); "" where they differ
    (the labels then tell the runs apart)."""
    settings = set()
    for d in (d for g in groups for d in g.run_dirs):
        given = (load_config(d) or {}).get("data")
        data = given if isinstance(given, dict) else {}  # none: a folder without config.yaml
        dataset = load_summary(d).get("dataset") or data.get("source", "")
        partition = data_setting(data) if data else ""
        settings.add(", ".join(p for p in (str(dataset), partition) if p))
    return settings.pop() if len(settings) == 1 else ""


def _heading(title: str | None, groups: list[PlotGroup]) -> str:
    """The caller's title, else the setting the runs share."""
    return title if title is not None else shared_setting(groups)


def _seeds(group: PlotGroup) -> str:
    n = len(group.run_dirs)
    return f"{n} seed{'s' * (n > 1)}"


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
    groups = group_runs(runs, group)
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
    width, height = rcParams["figure.figsize"]
    labels = [wrapped(f"{g.label} ({_seeds(g)})", width - LEGEND_MARGIN_INCHES) for g in groups]
    below = widest_line(labels) > LEGEND_INSIDE_INCHES
    lines = sum(label.count("\n") + 1 for label in labels)
    fig, ax = new_figure((width, height + (LEGEND_LINE_INCHES * lines if below else 0.0)))
    rounds: list[float] = []
    for i, g in enumerate(groups):
        x, mean, low, high = curve_points([histories[d] for d in g.run_dirs], key)
        ax.plot(x, mean, marker=".", color=group_color(i), gid="mean", label=labels[i])
        if len(g.run_dirs) > 1:
            ax.fill_between(x, low, high, color=group_color(i), alpha=0.2, gid="band")
        rounds += list(x)
    ax.set_xlabel("round")
    set_round_ticks(ax, rounds)
    name = metric_label(key)
    ax.set_ylabel(name)
    heading = _heading(title, groups)
    ax.set_title(f"{heading + chr(10) if heading else ''}mean over seeds, {BAND}", fontsize="medium")
    ax.grid(alpha=0.3)
    if below:  # long labels (runs that differ in several settings) get the figure's width, under the axes
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14))
    else:
        ax.legend(fontsize="small")
    return fig, key


def wrapped(label: str, inches: float) -> str:
    """``label`` broken at its spaces into lines at most ``inches`` wide at matplotlib's small font; a
    setting such as ``client.lr=0.1`` is never split (one longer than ``inches`` is a line of its own)."""
    lines: list[str] = []
    for word in label.split(" "):
        if lines and text_inches(f"{lines[-1]} {word}") <= inches:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


def text_inches(text: str) -> float:
    """How wide ``text`` is drawn at matplotlib's small font, by the renderer that writes the figures."""
    width, _, _ = _renderer().get_text_width_height_descent(text, FontProperties(size="small"), ismath=False)
    return float(width) / SAVE_DPI


def widest_line(texts: list[str]) -> float:
    """How wide the widest line of ``texts`` is drawn at matplotlib's small font, in inches."""
    return max(text_inches(line) for text in texts for line in text.split("\n"))


@functools.cache
def _renderer() -> RendererAgg:
    return RendererAgg(1, 1, SAVE_DPI)


def group_color(i: int) -> str:
    """Group ``i``'s colour, the same in the curve and the client figure."""
    return f"C{i % 10}"


def clients_figure(groups: list[PlotGroup], key: str | None = None, title: str | None = None) -> tuple[Figure, str]:
    """The reported round's per-client ``key`` (default: own-test accuracy, MAE for regression), one box
    per group over the clients of all its runs (whiskers at min and max), every client a dot."""
    tables = {d: read_rows(d / CLIENTS_FILE) for g in groups for d in g.run_dirs}
    key = pick_key(tables, key, CLIENT_KEYS, "--plot-clients", CLIENTS_FILE)
    pooled = [[row[key] for d in g.run_dirs for row in tables[d] if key in row] for g in groups]
    width, height = rcParams["figure.figsize"]
    fig_width = max(width, BOX_INCHES * len(groups))  # labels side by side
    room = (fig_width - AXIS_INCHES) / len(groups) - LABEL_GAP_INCHES  # a label's width at most
    names = [wrapped(g.label, room) for g in groups]
    widest = widest_line(names)
    if widest > room:  # a setting too long to break widens every box to it
        fig_width = (widest + LABEL_GAP_INCHES) * len(groups) + AXIS_INCHES
    fig, ax = new_figure((fig_width, height))
    parts = ax.boxplot(pooled, whis=(0, 100), showmeans=True, widths=BOX_WIDTH)
    for name in ("boxes", "medians", "whiskers", "means"):
        for artist in parts[name]:
            artist.set_gid(name)
    for i, box in enumerate(parts["boxes"]):
        box.set_color(group_color(i))
    for median in parts["medians"]:
        median.set_color("black")
    for i, values in enumerate(pooled, start=1):  # the clients themselves, spread inside their box
        spread = np.linspace(-BOX_WIDTH / 4, BOX_WIDTH / 4, len(values))
        ax.plot(i + spread, values, ".", color=group_color(i - 1), alpha=0.5, gid="clients")
    ticks = [f"{name}\n{_clients(g, tables, key)}" for name, g in zip(names, groups, strict=True)]
    ax.set_xticks(range(1, len(groups) + 1), ticks, fontsize="small")
    ax.set_ylabel(f"{client_label(key)}, per client")
    heading = f"{client_label(key)} per client of the reported round, seeds pooled\n"
    heading += "box: quartiles, whiskers: min–max, ▲ mean"
    setting = _heading(title, groups)
    ax.set_title(f"{setting}\n{heading}" if setting else heading, fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    return fig, key


def _clients(group: PlotGroup, tables: dict[Path, list[dict[str, float]]], key: str) -> str:
    """ "20 clients × 2 seeds" (each run's clients, then the runs); "20 + 18 clients" where runs differ."""
    counts = [sum(key in row for row in tables[d]) for d in group.run_dirs]
    if len(counts) == 1:
        return f"{counts[0]} clients"
    if len(set(counts)) == 1:
        return f"{counts[0]} clients × {_seeds(group)}"
    return f"{' + '.join(map(str, counts))} clients, {_seeds(group)}"
