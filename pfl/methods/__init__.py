"""Method registry: one module per method family."""

from __future__ import annotations

from pfl.errors import ConfigError
from pfl.methods.apfl import APFL
from pfl.methods.base import ClientContext, Method, weighted_mean
from pfl.methods.ditto import Ditto
from pfl.methods.fedavg import FedAvg
from pfl.methods.feddyn import FedDyn
from pfl.methods.fedfomo import FedFomo
from pfl.methods.fedprox import FedProx
from pfl.methods.fedrod import FedRoD
from pfl.methods.local import Local
from pfl.methods.meta import PerFedAvg, PFedMe
from pfl.methods.partial import FedBABU, FedPer, FedRep, LGFedAvg
from pfl.methods.pgfed import PGFed, PGFedCE, PGFedMo

METHODS: dict[str, type[Method]] = {
    cls.name: cls
    for cls in (
        Local,
        FedAvg,
        FedProx,
        Ditto,
        PGFed,
        PGFedMo,
        PGFedCE,
        APFL,
        PFedMe,
        PerFedAvg,
        FedRep,
        FedPer,
        LGFedAvg,
        FedRoD,
        FedBABU,
        FedFomo,
        FedDyn,
    )
}


def method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise ConfigError("method.name", f"unknown method {name!r}", f"choose one of {', '.join(METHODS)}")
    return METHODS[name]


__all__ = ["METHODS", "ClientContext", "Method", "method_class", "weighted_mean"]
