"""Communication: bytes in the payloads the server sends and the results the clients return.

Counted from what a method really exchanges: every tensor counts numel × element size, every
float/int scalar 4 bytes (sent as a 32-bit number), containers are walked. A payload that is the
same tensor for every client is counted once per client: each client receives its own copy.

An upload (a dataclass) counts its fields. Not counted: the ``weight`` of an upload (a client's
train-set size, fixed for the whole run, so the server knows it after the first contact) and None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import is_dataclass
from typing import Any

import torch

from pfl.trees import field_names

SCALAR_BYTES = 4
STATIC_KEYS = frozenset({"weight"})


def nbytes(obj: Any) -> int:
    """Bytes on the wire for one payload or result (see the module docstring for the rules)."""
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, bool | int | float):
        return SCALAR_BYTES
    if is_dataclass(obj) and not isinstance(obj, type):
        return sum(nbytes(getattr(obj, name)) for name in field_names(type(obj)) if name not in STATIC_KEYS)
    if isinstance(obj, Mapping):
        return sum(nbytes(v) for k, v in obj.items() if k not in STATIC_KEYS)
    if isinstance(obj, list | tuple):
        return sum(nbytes(v) for v in obj)
    raise TypeError(f"cannot count the bytes of a {type(obj).__name__} in a payload or result")


class CommCounter:
    """Running totals of downloaded (server -> client) and uploaded (client -> server) bytes."""

    def __init__(self) -> None:
        self.up = 0
        self.down = 0

    def exchange(self, payload: Any, result: Any) -> None:
        """One client's round trip: the payload it received and the result it returned."""
        self.down += nbytes(payload)
        self.up += nbytes(result)

    def extra(self, up: int = 0, down: int = 0) -> None:
        """Exchanges outside the payload/result pair (e.g. a line search asking clients for losses)."""
        self.up += up
        self.down += down

    def metrics(self, rounds: int) -> dict[str, float]:
        """Totals so far and their mean over the ``rounds`` completed."""
        r = max(rounds, 1)
        return {
            "comm.up_bytes.total": float(self.up),
            "comm.down_bytes.total": float(self.down),
            "comm.up_bytes.per_round": self.up / r,
            "comm.down_bytes.per_round": self.down / r,
        }

    def state_dict(self) -> dict[str, int]:
        return {"up": self.up, "down": self.down}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.up, self.down = state["up"], state["down"]
