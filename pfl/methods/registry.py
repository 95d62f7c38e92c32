"""One registration per method: ``@register`` on the class, under its ``name``.

Every module of ``pfl.methods`` is imported on first use, so a new built-in method is one new file.
A user's method needs no registration at all: ``--method mypkg.mymodule.MyMethod`` imports the class
by its path (the run's ``config.yaml`` records that path, so ``--resume`` and sweeps find it again).
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from pfl.errors import ConfigError
from pfl.registry import import_fix
from pfl.suggest import did_you_mean

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


class Listed(NamedTuple):
    """A built-in method as its source declares it: the module that registers it and its description."""

    module: str
    description: str


@functools.cache
def catalogue() -> dict[str, Listed] | None:
    """Every built-in method by name, sorted, read from the sources of ``pfl.methods`` without importing
    them (torch and Lightning take seconds); None when only importing can tell (``scan_sources``)."""
    return scan_sources(Path(__file__).parent, __package__)


def scan_sources(folder: Path, package: str) -> dict[str, Listed] | None:
    """The ``@register`` classes of the modules in ``folder`` by name, sorted, when every one declares its
    ``name`` and ``description`` as string literals in its own body; None when one does not, or when
    there is none."""
    found: dict[str, Listed] = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or not any(_is_register(d) for d in node.decorator_list):
                continue
            literals = _string_attributes(node)
            if "name" not in literals or "description" not in literals:
                return None
            found[literals["name"]] = Listed(f"{package}.{path.stem}", literals["description"])
    return dict(sorted(found.items())) or None  # none found: no sources to read (e.g. compiled files only)


def _is_register(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Name) and decorator.id == register.__name__


def _string_attributes(cls: ast.ClassDef) -> dict[str, str]:
    out = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and isinstance(stmt.value, ast.Constant):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if isinstance(stmt.value.value, str):
                out.update({t.id: stmt.value.value for t in targets if isinstance(t, ast.Name)})
    return out


def method_names() -> list[str]:
    """The built-in methods' names (from the catalogue when it can tell, without importing them)."""
    listed = catalogue()
    return list(listed) if listed is not None else list(methods())


def registered_descriptions() -> dict[str, str]:
    """Every method's description by name, sorted: the built-ins from the catalogue (no import when it can
    tell) and any method registered in this process (a user's, through ``register``)."""
    listed = catalogue()
    if listed is None:
        return {n: c.description or "" for n, c in methods().items()}
    own = {n: c.description or "" for n, c in _REGISTRY.items()}
    return dict(sorted({**{n: m.description for n, m in listed.items()}, **own}.items()))


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

    listed = catalogue()
    if name not in _REGISTRY:
        if listed is None:
            methods()
        elif name in listed:
            importlib.import_module(listed[name].module)  # only its own module (and the ones it imports)
    if name in _REGISTRY:
        return _REGISTRY[name]
    if "." not in name:
        known = sorted({*method_names(), *_REGISTRY})
        raise ConfigError(
            "method.name",
            f"unknown method {name!r}",
            did_you_mean(name, known)
            or "python -m pfl methods lists them; or give package.module.Class of your own Method subclass",
        )
    module_name, _, attr = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            "method.name",
            f"cannot import {name!r} ({err})",
            import_fix(module_name, "give package.module.Class importable from the working directory or PYTHONPATH"),
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
