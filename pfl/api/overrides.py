"""``pfl.fit``'s arguments as the command line's: ``fit(config, **overrides)`` -> ``python -m pfl fit`` argv.

Keys are the CLI's (``method``, ``seed``, ``resume``, ``trainer.rounds``, ``method.lam``); a mapping value
is a group (``trainer={"rounds": 20}``, ``method={"name": "ditto", "lam": 0.3}`` or Lightning's
``method={"class_path": ..., "init_args": {...}}``) and becomes one option per leaf. Values are written
as YAML/JSON text, which the CLI's parser reads back to the same values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

from pfl.errors import ConfigError

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
        argv += ["--config", str(path)]
    for key, value in _leaves(overrides):
        if key in NOT_FOR_FIT:
            raise ConfigError(key, "is not an option of pfl.fit", f"use the command line: python -m pfl fit --{key}")
        argv += [f"--{key}", value_text(key, value)]
    return argv


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, value)`` per leaf; a mapping under ``init_args`` of the model is a value, not a group."""
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{prefix}{key}", "is not an option name", "keys are strings like trainer.rounds")
        dotted = prefix + key
        if isinstance(value, Mapping) and dotted != "model.init_args":
            out += _leaves(value, dotted + ".")
        else:
            out.append((dotted, value))
    return out


def value_text(key: str, value: Any) -> str:
    """``value`` as the command line would spell it: strings as they are, everything else as JSON
    (true/false/null, lists and mappings); non-finite floats as YAML's .inf/.nan."""
    if isinstance(value, str):
        return value
    if isinstance(value, PathLike):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise ConfigError(
            key, f"{value!r} is no config value", "use numbers, strings, booleans, None, lists or dicts"
        ) from None
