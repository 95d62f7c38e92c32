"""Method registry: one module per method family."""

from __future__ import annotations

from pfl.errors import ConfigError
from pfl.methods.base import ClientContext, Method, weighted_mean
from pfl.methods.ditto import Ditto
from pfl.methods.fedavg import FedAvg
from pfl.methods.fedprox import FedProx
from pfl.methods.local import Local

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (Local, FedAvg, FedProx, Ditto)}


def method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise ConfigError("method.name", f"unknown method {name!r}", f"choose one of {', '.join(METHODS)}")
    return METHODS[name]


__all__ = ["METHODS", "ClientContext", "Method", "method_class", "weighted_mean"]
