"""A finished run folder as Python objects (``pfl.load``) and the report's table of runs (``pfl.compare``)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from torch import nn

from pfl.api.models import global_model, personal_model
from pfl.api.state import preserved_global_state
from pfl.errors import ConfigError
from pfl.metrics.report import build_table, group_runs, render, table_runs
from pfl.runner.fit_help import method_defaults

FIX = "pass a folder written by pfl.fit or `python -m pfl fit`"
MEAN = ".mean"  # a per-client metric's mean over the clients, in summary.json and metrics.csv
BEST_TEST = " [best_test]"  # the report's mark of a run reported at its best test round
SUFFIXES = ("", "_std", "_client_std", "_best", "_n")  # the columns of one metric in the report's csv


@dataclass(frozen=True)
class Run:
    """One run folder: ``summary`` (summary.json), ``metrics`` (metrics.csv: one row per evaluated round),
    ``clients`` (clients.csv: one row per client of the reported round), ``config`` (config.yaml; empty
    for a folder written without one) and ``path``."""

    path: Path
    summary: dict[str, Any]
    metrics: pd.DataFrame
    clients: pd.DataFrame
    config: dict[str, Any]

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}: {self.summary.get('method')} on {self.summary.get('dataset')})"

    def model(self) -> nn.Module:
        """The trained global model, read back from the run's checkpoint: the config's network on the CPU,
        in eval mode (``pfl.api.models``). A ConfigError for a method without a global model."""
        with preserved_global_state():
            return global_model(self.path)  # rebuilding the run seeds the global RNGs

    def personal_model(self, cid: int) -> nn.Module:
        """Client ``cid``'s trained P-model (the method's ``personal_state``, which the run's evaluation
        scores), read back from the run's checkpoint like ``model()``."""
        with preserved_global_state():
            return personal_model(self.path, cid)


def load(run_dir: str | PathLike) -> Run:
    """The run in ``run_dir``; a missing or unreadable file is a ConfigError naming it."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError("run_dir", f"{path} is not a directory", FIX)
    summary = _read(path / "summary.json", lambda p: json.loads(p.read_text()))
    if not isinstance(summary, dict):
        raise ConfigError(str(path / "summary.json"), "does not hold a JSON object", FIX)
    config = (
        _read(path / "config.yaml", lambda p: yaml.safe_load(p.read_text())) if (path / "config.yaml").exists() else {}
    )
    if not isinstance(config, dict):
        raise ConfigError(str(path / "config.yaml"), "does not hold a mapping of groups", FIX)
    return Run(
        path, summary, _read(path / "metrics.csv", pd.read_csv), _read(path / "clients.csv", pd.read_csv), config
    )


def _read(path: Path, reader: Callable[[Path], Any]) -> Any:
    if not path.is_file():
        raise ConfigError(str(path), "not found (a run writes it when it evaluates and when it finishes)", FIX)
    try:
        return reader(path)
    except (
        OSError,
        UnicodeDecodeError,
        ValueError,
        yaml.YAMLError,
    ) as err:  # pandas' and json's errors are ValueErrors
        problem = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(str(path), f"cannot be read: {problem}", FIX) from None


def compare(
    runs: Iterable[Run | str | PathLike], metrics: list[str] | None = None, per_run: bool = False
) -> pd.DataFrame:
    """``python -m pfl report``'s table as a DataFrame: runs that differ only in their seed are one row
    (``per_run``: one row per run), labelled with their folders' names (``run``; ``n`` counts them), a
    column per setting that differs, and per metric, named as in summary.json and metrics.csv
    (``pm.l_acc.mean``), its mean over the runs (``key``), the std over runs (``key_std``, ddof 1), the
    mean std over clients (``key_client_std``, where runs have one), the best row (``key_best``) and,
    where a group misses runs, ``key_n``."""
    loaded = [run if isinstance(run, Run) else load(run) for run in runs]
    if not loaded:
        raise ConfigError("runs", "is empty", "pass the runs to compare, e.g. pfl.compare([run_a, run_b])")
    summaries, names = [r.summary for r in loaded], [r.path.name for r in loaded]
    configs = [r.config or None for r in loaded]  # None: a folder without config.yaml, described by its summary
    # The report's keys name a per-client mean by its metric (pm.l_acc): ``.mean`` off, then back on.
    keys = None if metrics is None else [_report_key(k) for k in metrics]
    header, rows, best = build_table(summaries, names, keys, configs, group=not per_run, defaults=method_defaults)
    groups = group_runs(table_runs(summaries, names, configs, not per_run, method_defaults), group=not per_run)
    for row, group in zip(rows, groups, strict=True):
        row[0] = ", ".join(run.name for run in group.runs) + (BEST_TEST if row[0].endswith(BEST_TEST) else "")
    table = pd.read_csv(io.StringIO(render(header, rows, best, "csv")))  # the report's own numbers, exact (repr)
    measured = [s.get("metrics", {}) for s in summaries]
    return table.rename(columns=_column_names(header, measured))


def _report_key(key: str) -> str:
    return key.removesuffix(MEAN)


def _column_names(header: list[str], measured: list[dict[str, Any]]) -> dict[str, str]:
    """Each metric column under the summary's name of the metric: ``pm.l_acc`` -> ``pm.l_acc.mean``
    where the runs hold the per-client mean (not a metric of that name itself), with its suffixed columns."""
    out: dict[str, str] = {}
    for key in header:
        if any(key + MEAN in m for m in measured) and not any(key in m for m in measured):
            out.update({key + suffix: key + MEAN + suffix for suffix in SUFFIXES})
    return out
