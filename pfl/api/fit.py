"""``pfl.fit``: ``python -m pfl fit`` from Python, one path with the command line (its parsing, validation,
errors and run folder), leaving the calling process as it found it."""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from typing import Any

from pfl.api.overrides import to_argv
from pfl.api.runs import Run, load
from pfl.api.state import preserved_global_state
from pfl.runner.experiment import run_argv


def fit(config: str | PathLike | Sequence[str | PathLike] | None = None, **overrides: Any) -> Run:
    """Run an experiment as ``python -m pfl fit --config CONFIG --KEY VALUE ...`` does; returns its ``Run``.

    ``config``: a YAML file or a list of them (later wins). ``overrides``: the command line's keys, dotted
    (``**{"method.lam": 0.5}``) or as groups (``trainer={"rounds": 20}``); ``method="ditto"`` chooses the
    method. Bad input raises ``pfl.errors.ConfigError`` naming the field, before anything is written.
    """
    argv = to_argv(config, overrides)
    with preserved_global_state():
        summary = run_argv(argv)
    return load(summary["run_dir"])
