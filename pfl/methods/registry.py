"""One registration per method: ``@register`` on the class, under its ``name``.

Every module of ``pfl.methods`` is imported on first use, so a new built-in method is one new file.
A user's method needs no registration at all: ``--method mypkg.mymodule.MyMethod`` imports the class
by its path (the run's ``config.yaml`` records that path, so ``--resume`` and sweeps find it again).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pfl.errors import ConfigError

if TYPE_CHECKING:
    from pfl.methods.base import Method

M = TypeVar("M", bound="type[Method]")

_REGISTRY: dict[str, type[Method]] = {}
_LOADED = False


def register(cls: M) -> M:
    """Class decorator: make ``cls`` available as ``--method <cls.name>``."""
    if not cls.name or cls.name_from_class:
        raise ValueError(f"{cls.__qualname__} needs a class attribute `name` to be registered")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        other = _REGISTRY[cls.name].__qualname__
        raise ValueError(f"two methods are named {cls.name!r}: {other} and {cls.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def methods() -> dict[str, type[Method]]:
    """Every built-in method (and any user method registered so far) by name, sorted."""
    global _LOADED
    if not _LOADED:
        for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
            importlib.import_module(f"{__package__}.{info.name}")
        _LOADED = True
    return dict(sorted(_REGISTRY.items()))


def method_class(name: str) -> type[Method]:
    """A registered name, or the import path of a Method subclass (``package.module.Class``)."""
    from pfl.methods.base import Method

    registry = methods()
    if name in registry:
        return registry[name]
    if "." not in name:
        raise ConfigError(
            "method.name",
            f"unknown method {name!r}",
            f"choose one of {', '.join(registry)}, or give the import path of your own Method subclass",
        )
    module_name, _, attr = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            "method.name",
            f"cannot import {name!r} ({err})",
            "give package.module.Class importable from the working directory or PYTHONPATH",
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ConfigError("method.name", f"{name!r} is not a subclass of pfl.methods.Method")
    return cls


def class_path(cls: type[Method]) -> str:
    """How a config names ``cls``: a built-in's registered name, else its import path. A class that is
    registered from outside ``pfl.methods`` is named by its path too: another process (a resume, a
    sweep run) finds it only by importing its module."""
    if _REGISTRY.get(cls.name) is cls and cls.__module__.startswith(f"{__package__}."):
        return cls.name
    return f"{cls.__module__}.{cls.__qualname__}"
