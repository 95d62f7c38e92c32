"""Package-level names imported on first use (PEP 562): a package that re-exports heavy modules' names
(torch, Lightning) stays cheap to import for what only needs a light submodule of it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_names(package: str, module_of: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: name -> the attribute of ``package.<module_of[name]>``,
    imported when first read and then kept in the package (the next read is a plain attribute); any
    other name is an AttributeError, as for a module without ``__getattr__``."""

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{module_of[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
