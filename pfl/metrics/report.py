"""The papers' table: runs that differ only in their seed are one row, ``mean ± std`` over seeds.

A run's *settings* are everything that defines the experiment except the seed: its resolved
``config.yaml`` (without ``seed``, ``tracking.*`` and the bookkeeping options in ``BOOKKEEPING``), or,
for run directories without one, the ``method``, ``dataset``, ``task``, ``num_clients``, ``rounds``,
``select`` and ``hparams`` of ``summary.json``. Runs with equal settings form a group (a row); a
setting that differs between groups is a column (a method's own hyper-parameters ``method.*`` only
when they differ between groups of the same method).

A cell of a group of several runs is the mean over its runs of the run-level value, ± the sample
standard deviation over runs (ddof = 1: the seeds are a sample; the std over clients inside one run
is ddof = 0, the clients being the whole population). A group of one run shows the run's value with
its std over clients in parentheses, as ``summary.json`` has it. The best group of each column is
marked (bold in markdown, ``\\textbf`` in LaTeX, a 0/1 ``_best`` column in csv).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pfl import numeric_platform
from pfl.errors import ConfigError

# The config.yaml a run of a method with every option at its default would write (None: unknown method).
Defaults = Callable[[str], dict[str, Any] | None]

DEFAULT_METRICS = (
    "pm.l_acc",
    "pm.l_acc.top5",
    "pm.l_acc.bottom5",
    "pm.s_acc",
    "pm.g_acc",
    "gm.acc",
    "gm.l_acc",
    "r_acc.mean",
    "ptr",
    "gain",
    "pm.mae",
    "r_mae.mean",
    "ptr_mae",
    "new.acc",
    "rounds_to_target",
    "comm.up_bytes.per_round",
    "comm.down_bytes.per_round",
    "throughput.samples_per_s",
)
# Columns where smaller is better; every other column is best at its maximum.
LOWER_IS_BETTER = ("loss", "mae", "rounds_to_target", "comm.")
FORMATS = ("markdown", "csv", "latex")
# Config entries that do not change what a run computes: runs differing only in these are repeats.
BOOKKEEPING = ("seed", "tracking.", "trainer.progress", "trainer.checkpoint_every")
SUMMARY_SETTINGS = ("method", "dataset", "task", "num_clients", "rounds", "select")
_MISSING = object()


# -- reading runs ---------------------------------------------------------------------------------
def load_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise ConfigError(
            "RUN_DIR", f"{run_dir} has no summary.json", "pass directories written by `python -m pfl fit`"
        )
    return json.loads(path.read_text())


def platform_note(run_dirs: list[Path]) -> str | None:
    """A note when the runs computed their numbers on more than one platform (None: on one), for a
    table of them (``pfl report``, ``pfl sweep``): the same run can give other numbers on another."""
    counts = numeric_platform.platform_counts(load_summary(folder).get("platform") for folder in run_dirs)
    return numeric_platform.where_computed(counts) if len(counts) > 1 else None


def load_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's resolved ``config.yaml`` (None when the directory has none)."""
    path = Path(run_dir) / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: ``{"client": {"lr": 0.1}}`` -> ``{"client.lr": 0.1}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + str(key)] = value
    return out


def run_settings(
    summary: dict[str, Any], config: dict[str, Any] | None, keep_seed: bool = False, defaults: Defaults | None = None
) -> dict[str, Any]:
    """What defines a run's experiment: the flattened config minus bookkeeping (``method.name`` is
    ``method``), or the summary's description when there is no config. ``keep_seed`` keeps the seed
    (one group per run). ``defaults`` fills the options a run's config lacks (written by a pfl that had
    no such option yet) with their defaults, so such a run groups with today's runs of the same setting."""
    if config is not None:
        flat = flatten(config)
        method = config.get("method", {}).get("name") if isinstance(config.get("method"), dict) else None
        default = defaults(method) if defaults is not None and isinstance(method, str) else None
        flat = {**flatten(default), **flat} if default else flat
        out = {k: v for k, v in flat.items() if not k.startswith(BOOKKEEPING)}
        out = {"method": out.pop("method.name", summary.get("method", "")), **out}
    else:
        out = {k: summary[k] for k in SUMMARY_SETTINGS if k in summary}
        out.update({f"method.{k}": v for k, v in summary.get("hparams", {}).items()})
    if keep_seed:
        out["seed"] = (config or {}).get("seed", summary.get("seed"))
    return out


def _same(value: Any) -> str:
    """A comparable, hashable form of a setting (lists and mappings included)."""
    return "\0missing" if value is _MISSING else json.dumps(value, sort_keys=True, default=str)


@dataclass
class Run:
    name: str
    summary: dict[str, Any]
    settings: dict[str, Any]


@dataclass
class Group:
    """Runs with the same settings; in the order they were given."""

    runs: list[Run]

    @property
    def settings(self) -> dict[str, Any]:
        return self.runs[0].settings

    @property
    def label(self) -> str:
        first = self.runs[0]
        label = first.name if len(self.runs) == 1 else f"{first.name} +{len(self.runs) - 1}"
        return label + (" [best_test]" if first.summary.get("select") == "best_test" else "")


def group_runs(runs: list[Run], group: bool = True) -> list[Group]:
    """Runs with the same settings as one group; ``group=False``: one group per run (repeats of a seed
    included, which the seed in their settings does not tell apart)."""
    if not group:
        return [Group([run]) for run in runs]
    groups: dict[str, Group] = {}
    for run in runs:
        key = _same(run.settings)
        if key in groups:
            groups[key].runs.append(run)
        else:
            groups[key] = Group([run])
    return list(groups.values())


def swept_settings(groups: list[Group]) -> list[str]:
    """Settings that differ between groups: the method's own first, then in first-seen order. ``method``
    has its own column, and a method's own hyper-parameters (``method.*``) count only when they differ
    between groups of that method (FedProx's mu is not a column because Ditto has none)."""
    keys: dict[str, None] = {}
    for g in groups:
        keys.update(dict.fromkeys(g.settings))
    swept = []
    for key in keys:
        if key == "method":
            continue
        seen: dict[str, set[str]] = {}
        for g in groups:
            scope = g.settings.get("method", "") if key.startswith("method.") else ""
            seen.setdefault(scope, set()).add(_same(g.settings.get(key, _MISSING)))
        if any(len(values) > 1 for values in seen.values()):
            swept.append(key)
    return sorted(swept, key=lambda k: not k.startswith("method."))  # the method's own first, stable otherwise


def setting_text(value: Any) -> str:
    if value is _MISSING:
        return "-"
    return value if isinstance(value, str) else json.dumps(value, default=str)


# -- cells ----------------------------------------------------------------------------------------
def lookup(metrics: dict[str, Any], key: str, prefix: str = "") -> tuple[float | None, float | None]:
    """(value, std) of ``key``: the key itself, or ``key.mean`` with ``key.std`` (a None value is
    a metric that was measured but not reached, e.g. rounds_to_target)."""
    for k in (prefix + key, key):
        if k in metrics:
            return metrics[k], None
        if f"{k}.mean" in metrics:
            return metrics[f"{k}.mean"], metrics.get(f"{k}.std")
    return None, None


def lower_is_better(key: str) -> bool:
    if key.startswith(("ptr", "best_test.ptr")):  # a pass rate, also when it is computed on MAE
        return False
    return any(part in key for part in LOWER_IS_BETTER)


@dataclass
class Cell:
    """One metric of one group: the run-level values of the runs that have it."""

    n: int  # runs in the group
    values: list[float] = field(default_factory=list)
    client_stds: list[float] = field(default_factory=list)  # each run's std over clients, when it has one
    never: int = 0  # runs where it was measured but not reached (rounds_to_target: null)

    @property
    def mean(self) -> float | None:
        return math.fsum(self.values) / len(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        """Sample std over the runs (ddof = 1); None for fewer than two."""
        if len(self.values) < 2:
            return None
        m = self.mean
        return math.sqrt(math.fsum((v - m) ** 2 for v in self.values) / (len(self.values) - 1))

    @property
    def client_std(self) -> float | None:
        """Mean over the runs of their std over clients."""
        return math.fsum(self.client_stds) / len(self.client_stds) if self.client_stds else None

    @property
    def complete(self) -> bool:
        """Every run of the group has a value (only complete cells compete for best)."""
        return len(self.values) == self.n and self.mean is not None and not math.isnan(self.mean)

    @property
    def counts(self) -> bool:
        return bool(self.values) and all(isinstance(v, int) and not isinstance(v, bool) for v in self.values)

    def text(self, fmt: str = "markdown", digits: int = 4) -> str:
        if not self.values:
            return "never" if self.never else "-"
        pm = " $\\pm$ " if fmt == "latex" else " ± "
        if len(self.values) == 1:
            v, sd = self.values[0], self.client_std
            out = str(v) if self.counts else _number(v, digits) + ("" if sd is None else f" ({_number(sd, digits, v)})")
        else:
            places = 1 if self.counts else digits  # a mean of counts (rounds) needs one decimal, not four
            out = _number(self.mean, places) + pm + _number(self.std, places, self.mean)
        if len(self.values) < self.n:
            out += f" [{len(self.values)}/{self.n}]"
        if fmt == "latex":  # 1.045e+06 -> $1.045\times10^{6}$
            out = re.sub(r"(-?\d\.?\d*)e([+-])0*(\d+)", _tex_power, out)
        return out


def _tex_power(match: re.Match) -> str:
    sign = "-" if match.group(2) == "-" else ""
    return f"${match.group(1)}\\times10^{{{sign}{match.group(3)}}}$"


def _number(v: float, digits: int, scale: float | None = None) -> str:
    """``digits`` decimals, or ``digits`` significant digits from 1000 up; a spread takes the style
    of the value it belongs to (``scale``), so ``1.936e+04 ± 0`` rather than ``1.936e+04 ± 0.0000``."""
    if math.isnan(v):
        return "nan"
    big = abs(v if scale is None or math.isnan(scale) else scale) >= 1000
    return f"{v:.{digits}g}" if big else f"{v:.{digits}f}"


def group_cells(group: Group, keys: list[str]) -> list[Cell]:
    cells = [Cell(len(group.runs)) for _ in keys]
    for run in group.runs:
        prefix = "best_test." if run.summary.get("select") == "best_test" else ""
        metrics = run.summary.get("metrics", {})
        for key, cell in zip(keys, cells, strict=True):
            value, sd = lookup(metrics, key, prefix)
            if value is not None:
                cell.values.append(value)
                if sd is not None:
                    cell.client_stds.append(sd)
            elif metrics.get(key, 0) is None:
                cell.never += 1
    return cells


def best_flags(keys: list[str], cells: list[list[Cell]]) -> list[list[bool]]:
    """Per row, per key: the row holds the column's best mean (ties all marked; needs two rows)."""
    best = [[False] * len(keys) for _ in cells]
    for j, key in enumerate(keys):
        means = [row[j].mean if row[j].complete else None for row in cells]
        present = [m for m in means if m is not None]
        if len(present) < 2:
            continue
        target = min(present) if lower_is_better(key) else max(present)
        for i, m in enumerate(means):
            best[i][j] = m == target
    return best


# -- the table ------------------------------------------------------------------------------------
def table_runs(
    summaries: list[dict[str, Any]],
    names: list[str],
    configs: list[dict[str, Any] | None] | None = None,
    group: bool = True,
    defaults: Defaults | None = None,
) -> list[Run]:
    """The runs as the table tells them apart: settings from the configs when every run has one, else
    from the summaries for all; ``group=False`` keeps the seed (one group per run); ``defaults`` fills
    the options a config lacks (``run_settings``)."""
    configs = list(configs) if configs is not None else [None] * len(summaries)
    if any(c is None for c in configs):  # compare like with like: summary descriptions for all
        configs = [None] * len(summaries)
    return [
        Run(name, s, run_settings(s, c, keep_seed=not group, defaults=defaults))
        for name, s, c in zip(names, summaries, configs, strict=True)
    ]


def build_table(
    summaries: list[dict[str, Any]],
    names: list[str],
    metrics: list[str] | None = None,
    configs: list[dict[str, Any] | None] | None = None,
    group: bool = True,
    defaults: Defaults | None = None,
) -> tuple[list[str], list[list[Any]], list[list[bool]]]:
    """(header, rows, best flags). A row is ``[run, method, *swept settings, n, *cells]``: strings,
    then one ``Cell`` per metric; ``best[i][j]`` marks row i's cell of metric j. ``configs`` (one per
    summary, None where a run has no config.yaml) tell settings apart; settings come from the
    summaries unless every run has a config. ``group=False``: one row per run (the seed a setting).
    Without ``metrics``, the default keys no run has are dropped. ``defaults``: see ``run_settings``."""
    groups = group_runs(table_runs(summaries, names, configs, group, defaults), group)
    keys = list(metrics) if metrics else list(DEFAULT_METRICS)
    cells = [group_cells(g, keys) for g in groups]
    if metrics is None:  # the default list shows only what was measured
        keep = [j for j in range(len(keys)) if any(row[j].values or row[j].never for row in cells)]
        keys = [keys[j] for j in keep]
        cells = [[row[j] for j in keep] for row in cells]
    swept = swept_settings(groups)
    header = ["run", "method", *swept, "n", *keys]
    rows = [
        [
            g.label,
            setting_text(g.settings.get("method", "")),
            *(setting_text(g.settings.get(k, _MISSING)) for k in swept),
            str(len(g.runs)),
            *row,
        ]
        for g, row in zip(groups, cells, strict=True)
    ]
    return header, rows, best_flags(keys, cells)


def render(
    header: list[str], rows: list[list[Any]], best: list[list[bool]], fmt: str = "markdown", digits: int = 4
) -> str:
    """The table as markdown (best in bold), csv (numbers only, ``key``, ``key_std``, ``key_best``
    columns) or a booktabs LaTeX tabular (best in ``\\textbf``)."""
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r}", f"choose one of {', '.join(FORMATS)}")
    labels = len(header) - len(best[0]) if best else len(header)
    if fmt == "csv":
        return _csv(header, rows, best, labels)
    texts = [
        [str(c) for c in row[:labels]]
        + [_mark(c.text(fmt, digits), b, fmt) for c, b in zip(row[labels:], flags, strict=True)]
        for row, flags in zip(rows, best, strict=True)
    ]
    if fmt == "latex":
        return _latex(header, texts, labels)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in texts]
    return "\n".join(lines) + "\n"


def _mark(text: str, is_best: bool, fmt: str) -> str:
    if not is_best:
        return text
    return f"\\textbf{{{text}}}" if fmt == "latex" else f"**{text}**"


def _csv(header: list[str], rows: list[list[Any]], best: list[list[bool]], labels: int) -> str:
    """Numbers only: ``key`` (mean over runs), ``key_std`` (std over runs), ``key_client_std`` (mean
    std over clients, where runs have one), ``key_best`` (0/1), ``key_n`` (runs the value is over,
    where some group misses runs). Blank: no value."""
    keys = header[labels:]
    columns: list[list[tuple[str, Any]]] = []
    for j, key in enumerate(keys):
        col = [row[labels + j] for row in rows]
        parts = [(key, "mean"), (f"{key}_std", "std")]
        if any(c.client_stds for c in col):
            parts.append((f"{key}_client_std", "client_std"))
        parts.append((f"{key}_best", None))
        if any(len(c.values) < c.n for c in col):
            parts.append((f"{key}_n", "count"))
        columns.append(parts)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*header[:labels], *(name for parts in columns for name, _ in parts)])
    for row, flags in zip(rows, best, strict=True):
        out = [str(c) for c in row[:labels]]
        for j, parts in enumerate(columns):
            cell = row[labels + j]
            for _, what in parts:
                if what is None:
                    out.append(int(flags[j]))
                elif what == "count":
                    out.append(len(cell.values))
                else:
                    value = getattr(cell, what)
                    out.append("" if value is None else repr(value))
        writer.writerow(out)
    return buf.getvalue()


LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex_escape(text: str) -> str:
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)


def _latex(header: list[str], texts: list[list[str]], labels: int) -> str:
    """A booktabs tabular without the ``run`` column (directory names are not for papers); labels are
    escaped, cells already carry their own markup."""
    cols = range(1, len(header))  # the settings, n and metrics
    spec = "l" * (labels - 2) + "r" * (len(header) - labels + 1)  # text settings left, n and numbers right
    lines = [
        "% needs \\usepackage{booktabs}",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
        " & ".join(tex_escape(header[j]) for j in cols) + " \\\\",
        "\\midrule",
    ]
    for row in texts:
        cells = [tex_escape(row[j]) if j < labels else row[j] for j in cols]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def report(
    run_dirs: list[Path],
    metrics: list[str] | None = None,
    fmt: str = "markdown",
    *,
    group: bool = True,
    digits: int = 4,
    defaults: Defaults | None = None,
) -> str:
    """The table of ``run_dirs`` (each with summary.json, optionally config.yaml) in ``fmt``; ``defaults``
    fills the options a run's config.yaml lacks (``run_settings``)."""
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r}", f"choose one of {', '.join(FORMATS)}")
    if digits < 0:
        raise ConfigError("--digits", f"must be >= 0, got {digits}", "e.g. --digits 2")
    dirs = [Path(d) for d in run_dirs]
    summaries = [load_summary(d) for d in dirs]
    configs = [load_config(d) for d in dirs]
    header, rows, best = build_table(summaries, [d.name for d in dirs], metrics, configs, group, defaults)
    return render(header, rows, best, fmt, digits)
