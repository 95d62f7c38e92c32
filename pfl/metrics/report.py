"""The papers' table: one row per run, ``mean (std)`` cells, the best value of each column marked."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from pfl.errors import ConfigError

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
FORMATS = ("markdown", "csv")


def load_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise ConfigError(
            "RUN_DIR", f"{run_dir} has no summary.json", "pass directories written by `python -m pfl fit`"
        )
    return json.loads(path.read_text())


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


def _fmt(v: float) -> str:
    if isinstance(v, int):  # counts (rounds_to_target) stay integers
        return str(v)
    if math.isnan(v):
        return "nan"
    return f"{v:.4g}" if abs(v) >= 1000 else f"{v:.4f}"


def build_table(summaries: list[dict[str, Any]], names: list[str], metrics: list[str] | None = None):
    """(header, rows of cells, best flags). Columns no run has are dropped; ``best_test`` runs are
    read from their ``best_test.`` keys and their row name says so."""
    keys = list(metrics) if metrics else list(DEFAULT_METRICS)
    values: list[list[tuple[float | None, float | None]]] = []
    never: set[tuple[int, int]] = set()  # measured but not reached (rounds_to_target: null)
    for i, s in enumerate(summaries):
        prefix = "best_test." if s.get("select") == "best_test" else ""
        m = s.get("metrics", {})
        values.append([lookup(m, k, prefix) for k in keys])
        never |= {(i, j) for j, k in enumerate(keys) if k in m and m[k] is None}
    if metrics is None:  # the default list shows only what was measured
        keep = [
            j for j in range(len(keys)) if any(v[j][0] is not None or (i, j) in never for i, v in enumerate(values))
        ]
        never = {(i, keep.index(j)) for i, j in never if j in keep}
        keys = [keys[j] for j in keep]
        values = [[row[j] for j in keep] for row in values]
    best = [[False] * len(keys) for _ in values]
    for j, key in enumerate(keys):
        col = [row[j][0] for row in values]
        present = [v for v in col if v is not None and not math.isnan(v)]
        if len(present) < 2:
            continue
        target = min(present) if lower_is_better(key) else max(present)
        for i, v in enumerate(col):
            best[i][j] = v == target
    rows = []
    for i, (s, name, row) in enumerate(zip(summaries, names, values, strict=True)):
        label = name + (" [best_test]" if s.get("select") == "best_test" else "")
        cells = [label, s.get("method", "")]
        for j, (v, sd) in enumerate(row):
            if v is None:
                cells.append("never" if (i, j) in never else "-")
            else:
                cells.append(_fmt(v) + ("" if sd is None else f" ({_fmt(sd)})"))
        rows.append(cells)
    return ["run", "method", *keys], rows, best


def render(header: list[str], rows: list[list[str]], best: list[list[bool]], fmt: str = "markdown") -> str:
    """Markdown marks the best cell of a column in bold, csv with a trailing ``*``."""
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r}", f"choose one of {', '.join(FORMATS)}")
    marked = [
        cells[:2] + [_mark(c, b, fmt) for c, b in zip(cells[2:], flags, strict=True)]
        for cells, flags in zip(rows, best, strict=True)
    ]
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(marked)
        return buf.getvalue()
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in marked]
    return "\n".join(lines) + "\n"


def _mark(cell: str, is_best: bool, fmt: str) -> str:
    if not is_best:
        return cell
    return f"{cell}*" if fmt == "csv" else f"**{cell}**"


def report(run_dirs: list[Path], metrics: list[str] | None = None, fmt: str = "markdown") -> str:
    summaries = [load_summary(Path(d)) for d in run_dirs]
    header, rows, best = build_table(summaries, [Path(d).name for d in run_dirs], metrics)
    return render(header, rows, best, fmt)
