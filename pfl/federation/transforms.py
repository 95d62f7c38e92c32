"""Upload transforms: what happens to a round's uploads between the clients' local updates and the
method's aggregation, as one ordered list the loop applies in one place.

A transform is client-side (``client_side = True``: it changes what clients send, e.g. an attack,
``pfl.federation.attacks``) or server-side (it rewrites what the method's aggregation combines, e.g.
a robust aggregator, ``pfl.federation.robust``). Client-side transforms come first; the server
observes the uploads as they leave the last of them (bytes exchanged, the trained models it keeps,
the conflict share), and the method aggregates the uploads as they leave the last transform.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pfl.methods.base import Method, ServerContext, Upload


@dataclass(frozen=True)
class UploadStep:
    """One round as a transform sees it: the method, the server before this round's aggregation, what
    every sampled client was sent, and the round's index."""

    method: Method
    server: ServerContext
    payloads: dict[int, Any]
    round: int


class UploadTransform(Protocol):
    client_side: bool

    def transform(self, uploads: dict[int, Upload], step: UploadStep) -> dict[int, Upload]: ...


@dataclass(frozen=True)
class Transformed:
    """A round's uploads as the server received them (``received``: after the client-side transforms)
    and as the method's aggregation combines them (``combined``: after every transform)."""

    received: dict[int, Upload]
    combined: dict[int, Upload]


def check_order(transforms: Sequence[UploadTransform]) -> None:
    """Client-side transforms before server-side ones: the server cannot rewrite what it has not received."""
    sides = [t.client_side for t in transforms]
    if sides != sorted(sides, reverse=True):
        names = ", ".join(f"{type(t).__name__} ({'client' if t.client_side else 'server'})" for t in transforms)
        raise ValueError(f"upload transforms must list the client-side ones first (got {names})")


def apply_transforms(
    transforms: Sequence[UploadTransform], uploads: dict[int, Upload], step: UploadStep
) -> Transformed:
    """Apply ``transforms`` in order (client-side first, ``check_order``)."""
    received = uploads
    for t in transforms:
        uploads = t.transform(uploads, step)
        if t.client_side:
            received = uploads
    return Transformed(received, uploads)


__all__ = ["Transformed", "UploadStep", "UploadTransform", "apply_transforms", "check_order"]
