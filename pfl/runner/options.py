"""Nested settings as command-line options: ``{"trainer": {"rounds": 20}}`` -> ``--trainer.rounds 20``.

One spelling for ``pfl.fit``'s keyword arguments and for the mappings Lightning's form gives an option
(``--method '{class_path: ..., init_args: {...}}'``). Values are written as YAML/JSON text, which the
command line's parser reads back to the same values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from os import PathLike
from typing import Any

from pfl.errors import ConfigError

# Settings whose value is itself a mapping: one option holding it, not one option per key.
MAPPING_SETTINGS = ("model.init_args",)


def option_args(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``["--key", "value", ...]``, one option per leaf of ``tree`` (keys dotted below ``prefix``)."""
    out: list[str] = []
    for key, value in tree.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{prefix}{key}", "is not an option name", "keys are strings like trainer.rounds")
        dotted = prefix + key
        if isinstance(value, Mapping) and dotted not in MAPPING_SETTINGS:
            out += option_args(value, dotted + ".")
        else:
            out += [f"--{dotted}", value_text(dotted, value)]
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
