"""Methods: one module per method (or family of variants), each registered with ``@register``."""

from __future__ import annotations

from pfl.methods.base import (
    ClientContext,
    ClientOptimizerMethod,
    Method,
    ServerContext,
    State,
    Upload,
    weighted_mean,
    weighted_mean_of,
)
from pfl.methods.registry import class_path, method_class, methods, register

__all__ = [
    "ClientContext",
    "ClientOptimizerMethod",
    "Method",
    "ServerContext",
    "State",
    "Upload",
    "class_path",
    "method_class",
    "methods",
    "register",
    "weighted_mean",
    "weighted_mean_of",
]
