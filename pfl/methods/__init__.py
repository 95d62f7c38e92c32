"""Methods: one module per method (or family of variants), each registered with ``@register``.

The base classes (``pfl.methods.base``: torch, Lightning) load on first use, so the registry's
catalogue (``python -m pfl methods``, "did you mean" for a method name) costs no torch import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pfl.methods.registry import class_path, method_class, methods, register

if TYPE_CHECKING:
    from pfl.methods.base import (
        ClientContext,
        ClientOptimizerMethod,
        Method,
        MethodFlagWarning,
        ServerContext,
        State,
        StateValue,
        Upload,
        Weighting,
        upload_weight,
        weighted_mean,
        weighted_mean_of,
    )

__all__ = [
    "ClientContext",
    "ClientOptimizerMethod",
    "Method",
    "MethodFlagWarning",
    "ServerContext",
    "State",
    "StateValue",
    "Upload",
    "Weighting",
    "class_path",
    "method_class",
    "methods",
    "register",
    "upload_weight",
    "weighted_mean",
    "weighted_mean_of",
]


def __getattr__(name: str) -> Any:
    if name in __all__:  # the registry's names are already here: the rest are the base's
        from pfl.methods import base

        return getattr(base, name)
    raise AttributeError(f"module 'pfl.methods' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
