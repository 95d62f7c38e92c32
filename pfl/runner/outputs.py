"""Run outputs as loop callbacks: config, per-round metrics, per-client table, summary and plots on
disk (``FileOutputs``); the same to W&B is ``pfl.runner.wandb_run.WandbRun``."""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
from pathlib import Path
from typing import Any

from pfl.errors import ConfigError
from pfl.federation.loop import Callback, FederatedLoop
from pfl.metrics.plots import plot_client_histogram, plot_client_scatter, plot_curves, run_title
from pfl.runner.rundir import REPLACED
from pfl.safe_files import write_atomic


def run_dir_under(root: str | Path, name: str) -> Path:
    """``root/name``, refused (ConfigError naming tracking.name) unless it lies strictly inside
    ``root``: an absolute name or one whose ``..`` climbs out would write a run anywhere on disk.
    The check is lexical (``..`` resolved against the name itself, symlinks not followed), so a run
    folder that is a symlink inside ``root`` stays usable. Sub-folders (``sweep/run001``) are fine."""
    if not name or "\0" in name:
        raise ConfigError("tracking.name", f"{name!r} is not a usable folder name", "give a plain name, e.g. my-run")
    relative = os.path.normpath(name)
    if os.path.isabs(relative) or relative.split(os.sep)[0] in ("..", "."):
        raise ConfigError(
            "tracking.name",
            f"{name!r} leaves tracking.root ({root}): run folders must lie inside it",
            "use a relative name without '..' (sub-folders are fine: sweep/run001), or change tracking.root",
        )
    if relative.split(os.sep)[0] == REPLACED:
        raise ConfigError(
            "tracking.name",
            f"{name!r} lies in {REPLACED}/, where --tracking.overwrite keeps the runs it replaced",
            f"choose another --tracking.name (continue a replaced run with --resume {Path(root) / relative})",
        )
    return Path(root) / relative


def json_safe(value: Any) -> Any:
    """``value`` with every NaN/inf float (Python or numpy, at any depth) replaced by None, tuples as
    lists: what strict JSON can hold. A metric that could not be computed reads null, not NaN."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def strict_json(value: Any) -> str:
    """RFC 8259 JSON (no bare NaN/Infinity, which Python's json writes by default but other readers reject)."""
    return json.dumps(json_safe(value), indent=2, sort_keys=True, allow_nan=False)


class RunFiles:
    """Everything a run writes into ``runs/<name>/``; files are rewritten whole, so a resumed run
    never leaves duplicate or partial rows."""

    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)

    def write_config(self, text: str) -> None:
        write_atomic(self.dir / "config.yaml", text)  # a kill never leaves a half config that --resume reads

    def write_metrics(self, history: list[dict[str, Any]]) -> None:
        _write_csv(self.dir / "metrics.csv", history)

    def write_clients(self, rows: list[dict[str, Any]]) -> None:
        _write_csv(self.dir / "clients.csv", rows)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.dir / "summary.json", strict_json(summary))


class FileOutputs(Callback):
    """metrics.csv and clients.csv after every evaluation; at the end the reported round's clients,
    summary.json, curves.png and clients_hist.png."""

    def __init__(self, files: RunFiles):
        self.files = files

    def on_evaluation(self, loop: FederatedLoop, metrics: dict[str, Any]) -> None:
        self.files.write_metrics(loop.history)
        self.files.write_clients(loop.client_rows)

    def on_fit_end(self, loop: FederatedLoop, summary: dict[str, Any]) -> None:
        self.files.write_clients(loop.selected_rows)
        self.files.write_summary(summary)
        title = run_title(self.files.dir)  # from the summary just written and config.yaml (the partition)
        plot_curves(loop.history, self.files.dir / "curves.png", title=title)
        keys = (loop.own_key, "gm.l_acc", "gm.l_mae")
        plot_client_histogram(loop.selected_rows, self.files.dir / "clients_hist.png", keys, title=title)
        # Personalized vs LOCAL per client (written only when a LOCAL reference was compared).
        scatter = self.files.dir / "clients_vs_local.png"
        plot_client_scatter(loop.selected_rows, scatter, loop.own_key, f"ref.{loop.own_key}", title=title)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, text.getvalue())
