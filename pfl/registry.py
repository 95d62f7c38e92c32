"""Named extension points: aggregators (``server.aggregator``), data sources (``data.source``) and
evaluation protocols (``eval.protocols``) are each a ``Registry`` that their built-ins and a user's
own entries join by a decorator.

The allowed choices of a config field are the registry's names: validation, "did you mean"
suggestions and error messages read them from it. A registry may name the modules that define its
built-ins (``builtins``); they are imported on its first lookup, so a field is validated before the
module that implements it is otherwise needed. A user's entry is registered by importing the user's
module: in-process (``import my_rules`` before ``pfl.fit``), or by giving the entry's import path as
the field's value (``server.aggregator: my_rules.coordinate_max``), which every process (a resume, a
sweep run, another rank) can import again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from pfl.errors import ConfigError, require
from pfl.suggest import choice_fix, did_you_mean

T = TypeVar("T")


def require_choice(value: str, options: Sequence[str], field: str, what: str = "value") -> None:
    """A field whose choices are a fixed list, not a registry: a ConfigError naming ``field``
    ("unknown <what> <value>", and the closest of ``options``) unless ``value`` is one of them."""
    require(value in options, field, f"unknown {what} {value!r}", choice_fix(value, options))


def origin(obj: Any) -> str:
    """Where ``obj`` is defined: ``module.qualname`` (or its repr when it has none)."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(obj)


def import_fix(module: str, fix: str) -> str:
    """The fix for an import path under ``module`` that did not import: ``fix``, or for ``__main__`` (a
    script run as a program, a notebook), what its failure here means."""
    if module != "__main__":
        return fix
    return (
        "__main__ is the script or notebook that started the run: what it defines is found only in that "
        "process, not by a resume, a sweep run or Run.model() in another one; define it in a module and give "
        "package.module.name"
    )


class Registry(Generic[T]):
    """Entries of one kind by name, set by the field ``field`` and registered with ``@decorator(name)``.
    ``implementation(entry)`` gives the object that defines an entry
    (its function or class): an entry registered again from the same definition (a module imported
    twice) replaces itself; another definition under a taken name is refused."""

    def __init__(
        self,
        kind: str,
        field: str,
        decorator: str,
        builtins: Sequence[str] = (),
        implementation: Callable[[T], Any] = lambda entry: entry,
        other_choices: Sequence[str] = (),
    ):
        self.kind, self.field, self.decorator = kind, field, decorator
        self.builtins = tuple(builtins)
        self.implementation = implementation
        self.other_choices = tuple(other_choices)  # valid values the registry does not hold (prefixes, ...)
        self._entries: dict[str, T] = {}
        self._loaded = not self.builtins

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``; a name taken by another definition is refused in one line."""
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"a {self.kind} name is a non-empty string without dots (got {name!r})")
        old = self._entries.get(name)
        if old is not None and origin(self.implementation(old)) != origin(self.implementation(entry)):
            raise ValueError(
                f"two {self.kind}s are named {name!r}: {origin(self.implementation(old))} and "
                f"{origin(self.implementation(entry))}"
            )
        self._entries[name] = entry
        return entry

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: a built-in module may look itself up while it is imported
            for module in self.builtins:
                importlib.import_module(module)

    def entries(self) -> dict[str, T]:
        """Every registered entry by name, in the order of registration (built-ins first)."""
        self._load()
        return dict(self._entries)

    def names(self) -> list[str]:
        return list(self.entries())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.entries() or self._by_path(name, quiet=True) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.entries())

    def get(self, name: str) -> T:
        """The entry registered as ``name``, or the one defined at the import path ``name``
        (``package.module.attribute``, imported here); a ConfigError naming the field otherwise."""
        entries = self.entries()
        if name in entries:
            return entries[name]
        if isinstance(name, str) and "." in name:
            found = self._by_path(name, quiet=False)
            assert found is not None
            return found
        raise ConfigError(self.field, f"unknown {self.kind} {name!r}", self.fix(name))

    def fix(self, name: str) -> str:
        """The fix for an unknown ``name``: the close registered name, else every choice and the import
        path of a user's own."""
        close = did_you_mean(name, self.names())
        choices = ", ".join([*self.names(), *self.other_choices])
        return close or f"choose one of {choices}, or package.module.name of one of your own"

    def help(self) -> str:
        """The field's choices for ``--help``."""
        choices = ", ".join([*self.names(), *self.other_choices])
        return f"one of: {choices}; or package.module.name of one of your own"

    def check(self, name: str) -> None:
        """A ConfigError unless ``name`` is a registered name or the import path of an entry."""
        self.get(name)

    def _by_path(self, path: str, *, quiet: bool) -> T | None:
        module_name, _, attr = path.rpartition(".")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as err:
            if quiet:
                return None
            raise ConfigError(
                self.field,
                f"cannot import {path!r} ({err})",
                import_fix(module_name, "give package.module.name importable from the working directory or PYTHONPATH"),
            ) from None
        for entry in self._entries.values():
            if self.implementation(entry) is target:
                return entry
        if quiet:
            return None
        raise ConfigError(
            self.field,
            f"{path!r} is not a registered {self.kind}",
            f"decorate it with @{self.decorator}(name)",
        )


__all__ = ["Registry", "import_fix", "origin"]
