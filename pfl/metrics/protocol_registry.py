"""Evaluation protocols (``eval.protocols``) by name: the built-ins, and ``@protocol`` for one's own.

The four built-ins share one pass over the clients (``pfl.metrics.evaluate``: every P-model runs
once over the union of the sets it is scored on), so they are registered without a ``measure`` of
their own. A protocol added with ``@protocol(name)`` is a function of the evaluated round
(``ProtocolContext``) that returns metrics, every key starting with ``<name>.``; it runs at every
evaluation after the built-ins, in the order of ``eval.protocols``, on every process of a run (it
must give the same values on each). docs/metrics.md, "Adding a protocol".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pfl.config import PROTOCOLS
from pfl.engine.trainer import ClientTrainer
from pfl.methods.base import ClientContext, Method, ServerContext
from pfl.metrics.row_keys import RowKeys


@dataclass(frozen=True)
class ProtocolContext:
    """An evaluated round: the method, the server, the worker (its ``data`` and model), a client's
    context by id (``client(cid)``, read-only) and the number of rounds done."""

    method: Method
    server: ServerContext
    worker: ClientTrainer
    client: Callable[[int], ClientContext]
    round: int


Measure = Callable[[ProtocolContext], dict[str, float]]


@dataclass(frozen=True)
class RegisteredProtocol:
    """An entry of ``PROTOCOLS``; ``measure`` None: a built-in of the shared pass (``pfl.metrics.evaluate``)."""

    name: str
    description: str
    measure: Measure | None = None


def protocol(name: str, description: str = "") -> Callable[[Measure], Measure]:
    """Decorator: register ``measure(ctx) -> {"<name>.<key>": value}`` as ``eval.protocols: [.., <name>]``."""

    def register(measure: Measure) -> Measure:
        PROTOCOLS.add(name, RegisteredProtocol(name, description or (measure.__doc__ or "").strip(), measure))
        return measure

    return register


_KEYS = RowKeys("classification")  # the keys each built-in fills in a client's row (pfl.metrics.row_keys)
BUILT_IN = {
    "local": f"P-models on their own test and validation ({', '.join(_KEYS.protocol('local'))}); always measured",
    "sg": f"FedPG's S- and G-tests of every P-model ({', '.join(_KEYS.protocol('sg'))})",
    "global": f"the global model on every client's test ({', '.join(_KEYS.protocol('global'))}) and on the "
    f"global test set ({', '.join(_KEYS.gm_global)})",
    "new": "held-out clients after Method.adapt_new_client, at the end of the run (new.*)",
}
for _name, _description in BUILT_IN.items():
    PROTOCOLS.add(_name, RegisteredProtocol(_name, _description))


def measure_protocols(names: Sequence[str], ctx: ProtocolContext) -> dict[str, float]:
    """The metrics of the protocols in ``names`` that have a ``measure`` (the ones added with ``@protocol``)."""
    out: dict[str, float] = {}
    for name in names:
        entry: RegisteredProtocol = PROTOCOLS.get(name)
        if entry.measure is not None:
            out.update(checked(entry.name, entry.measure(ctx)))
    return out


def checked(name: str, metrics: Any) -> dict[str, float]:
    """``metrics`` as floats, each key under the protocol's own prefix (no protocol overwrites another's keys)."""
    if not isinstance(metrics, dict):
        raise TypeError(f"protocol {name!r} must return a dict of metrics (got {type(metrics).__name__})")
    stray = [k for k in metrics if not str(k).startswith(f"{name}.")]
    if stray:
        raise ValueError(f"protocol {name!r} returned keys outside its prefix {name + '.'!r}: {stray}")
    return {k: float(v) for k, v in metrics.items()}


__all__ = ["ProtocolContext", "RegisteredProtocol", "measure_protocols", "protocol"]
