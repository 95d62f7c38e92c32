"""``pfl.fit``'s arguments as the command line's: ``fit(config, **overrides)`` -> ``python -m pfl fit`` argv.

Keys are the CLI's (``method``, ``seed``, ``resume``, ``trainer.rounds``, ``method.lam``); a mapping value
is a group (``trainer={"rounds": 20}``, ``method={"name": "ditto", "lam": 0.3}`` or Lightning's
``method={"class_path": ..., "init_args": {...}}``) and becomes one option per leaf
(``pfl.runner.options``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from pfl.api.classes import class_form
from pfl.errors import ConfigError
from pfl.runner.config_files import shipped_config
from pfl.runner.options import option_args

# Options of the command line that print instead of running a fit.
NOT_FOR_FIT = ("help", "print_config")


def to_argv(config: str | PathLike | Sequence[str | PathLike] | None, overrides: Mapping[str, Any]) -> list[str]:
    """The ``python -m pfl fit`` arguments of ``pfl.fit(config, **overrides)``: the config files in order,
    then each override (later keys win over earlier ones and over the files, as on the command line)."""
    files = [] if config is None else [config] if isinstance(config, (str, PathLike)) else list(config)
    argv: list[str] = []
    for path in files:
        if not isinstance(path, (str, PathLike)):
            raise ConfigError("config", f"expected a path to a YAML file, got {path!r}", 'e.g. "conf/default.yaml"')
        argv += ["--config", str(config_path(path))]
    for key in overrides:
        if key in NOT_FOR_FIT:
            raise ConfigError(key, "is not an option of pfl.fit", f"use the command line: python -m pfl fit --{key}")
    return argv + option_args({key: class_form(key, value) for key, value in overrides.items()})


def config_path(path: str | PathLike) -> Path:
    """A config file as given when it exists (relative to the working directory), else the shipped one of
    that name: ``conf/default.yaml``, ``default.yaml`` or ``default``, ``method/ditto``; else as given
    (the command line then says it is not found)."""
    given = Path(path)
    return given if given.exists() else shipped_config(given) or given
