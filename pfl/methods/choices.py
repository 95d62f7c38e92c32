"""Choice-valued hyper-parameters: a method annotates one ``Literal["a", "b"]`` (or ``Literal[...] | None``)
and jsonargparse refuses other values on the command line and in configs; ``check_choices`` gives a
method constructed in Python the same one-line ``ConfigError``, from the same annotations.
"""

from __future__ import annotations

import inspect
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pfl.errors import ConfigError
from pfl.suggest import choice_fix


def literal_values(hint: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` annotation allows (None among them for an optional one), else None."""
    if get_origin(hint) is Literal:
        return get_args(hint)
    if get_origin(hint) in (Union, UnionType):
        parts = [literal_values(a) for a in get_args(hint) if a is not NoneType]
        if parts and all(p is not None for p in parts):
            optional = (None,) if NoneType in get_args(hint) else ()
            return tuple(v for p in parts for v in p) + optional  # type: ignore[union-attr]
    return None


def _inits(cls: type) -> list[Any]:
    """The ``__init__`` functions of ``cls``'s hierarchy, the most basic first."""
    return [vars(k)["__init__"] for k in reversed(cls.__mro__) if k is not object and "__init__" in vars(k)]


def choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """Every ``__init__`` argument of ``cls`` and its bases annotated with a ``Literal``: its allowed values."""
    out: dict[str, tuple[Any, ...]] = {}
    for init in _inits(cls):
        for name, hint in get_type_hints(init).items():
            allowed = literal_values(hint)
            if allowed is not None:
                out[name] = allowed
    return out


def check_choices(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a choice-valued argument of ``cls(*args, **kwargs)`` outside its ``Literal`` (arguments
    not given take the default of the most derived ``__init__`` that declares them)."""
    allowed = choices(cls)
    if not allowed:
        return
    values: dict[str, Any] = {}
    for init in _inits(cls):
        for p in inspect.signature(init).parameters.values():
            if p.default is not p.empty:
                values[p.name] = p.default
    signature = inspect.signature(cls.__init__)  # type: ignore[misc]
    try:
        bound = signature.bind(None, *args, **kwargs).arguments  # None for self
    except TypeError:
        return  # a call __init__ itself refuses, with Python's message
    for name, value in bound.items():
        values.update(value if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD else {name: value})
    for name, options in allowed.items():
        if name in values and values[name] not in options:
            raise ConfigError(
                f"method.{name}", f"unknown value {values[name]!r}", choice_fix(str(values[name]), map(str, options))
            )
