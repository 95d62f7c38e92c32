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

from pfl.errors import ConfigError
from pfl.metrics.report import build_table, render
from pfl.runner.args import default_config

FIX = "pass a folder written by pfl.fit or `python -m pfl fit`"


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
    (``per_run``: one row per run), a column per setting that differs, and per metric its mean over the
    runs (``key``), the std over runs (``key_std``, ddof 1), the mean std over clients (``key_client_std``,
    where runs have one), the best row (``key_best``) and, where a group misses runs, ``key_n``."""
    loaded = [run if isinstance(run, Run) else load(run) for run in runs]
    if not loaded:
        raise ConfigError("runs", "is empty", "pass the runs to compare, e.g. pfl.compare([run_a, run_b])")
    header, rows, best = build_table(
        [r.summary for r in loaded],
        [r.path.name for r in loaded],
        metrics,
        [r.config or None for r in loaded],  # None: a folder without config.yaml, described by its summary
        group=not per_run,
        defaults=default_config,  # an option added after a run was made counts at its default
    )
    return pd.read_csv(io.StringIO(render(header, rows, best, "csv")))  # the report's own numbers, exact (repr)
