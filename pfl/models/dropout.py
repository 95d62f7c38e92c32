"""Keyed dropout: a mask that is a function of a key, so a client's masks are the same whether it
trains alone or stacked with other clients under ``torch.func.vmap``.

``nn.Dropout`` draws from torch's global generator, and under ``vmap(randomness="different")`` one draw
covers every client of the stack, so no stacked step can reproduce a client's sequential masks. A
``KeyedDropout`` instead hashes (the step's key, the layer's index, the element's index) with integer
arithmetic that is exact on every device and under ``vmap``: the engine sets each training step's key
(``dropout_key``; one per client, derived from the run's seed, the round, the client, the fit's
purpose and the step), as a 0-d int64 tensor for one client (a tensor, not an int, so that a compiled
forward does not specialise on it) or as a batched int64 tensor inside a stacked step, and both
paths compute the same bits. Without a key (a method's own loop of ``gradient`` calls)
it draws from torch's global generator, as ``nn.Dropout``. The index of an element counts along its
tensor in row-major order, so the rows of a batch padded at the end (the stacked step pads short
batches) get the masks of the unpadded batch. A layer called twice in one forward gets the same mask
both times; every pass of one step (SAM's second pass at w + ε) uses the step's masks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pfl.seeding import derive_seed

IntOrTensor = TypeVar("IntOrTensor", int, Tensor)

_MASK32 = 0xFFFFFFFF
_BITS = 24  # a draw is the hash's top 24 bits: p is resolved to 2^-24
_state = threading.local()


def _mul32(x: IntOrTensor, c: int) -> IntOrTensor:
    """``x * c mod 2^32`` for ``x`` in [0, 2^32), in 16-bit halves of ``c`` so that no int64 product
    overflows (exact for Python ints and int64 tensors alike)."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _MASK32


def mix32(x: IntOrTensor) -> IntOrTensor:
    """A 32-bit integer hash of ``x`` in [0, 2^32) (lowbias32: xor-shift, multiply, twice)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def step_key(*keys: int | str) -> int:
    """A step's 32-bit dropout key from (seed, round, client, purpose, step, ...)."""
    return derive_seed("dropout", *keys) & _MASK32


def step_key_tensor(*keys: int | str) -> Tensor:
    """``step_key`` as a 0-d int64 tensor (on the CPU: it combines with tensors on any device)."""
    return torch.tensor(step_key(*keys), dtype=torch.int64)


@contextmanager
def dropout_key(key: int | Tensor | None) -> Iterator[None]:
    """Every ``KeyedDropout`` of this thread draws its mask from ``key`` inside the block."""
    before = getattr(_state, "key", None)
    _state.key = key
    try:
        yield
    finally:
        _state.key = before


def set_dropout_key(key: int | Tensor | None) -> None:
    """Set (None: clear) this thread's dropout key, for a loop that sets one per step."""
    _state.key = key


class KeyedDropout(nn.Dropout):
    """``nn.Dropout`` whose mask is drawn from the step's key (module docstring); ``index`` tells the
    layers of one network apart (``number_keyed_dropouts``)."""

    index: int = 0

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        key = getattr(_state, "key", None)
        if key is None:
            return F.dropout(x, self.p, True, self.inplace)
        if self.p == 1:  # every element dropped, as nn.Dropout (the rescaling below would divide by 0)
            return x * 0
        layer = mix32(key ^ mix32(self.index + 1))
        element = mix32(torch.arange(x.numel(), device=x.device).view(x.shape) & _MASK32)
        keep = (mix32(element ^ layer) >> (32 - _BITS)) >= round(self.p * (1 << _BITS))
        return x * keep.to(x.dtype).div(1 - self.p)


def number_keyed_dropouts(net: nn.Module) -> bool:
    """Give each ``KeyedDropout`` of ``net`` its index (module order); whether any of them is active."""
    active = False
    for i, m in enumerate(m for m in net.modules() if isinstance(m, KeyedDropout)):
        m.index = i
        active = active or m.p > 0
    return active


__all__ = [
    "KeyedDropout",
    "dropout_key",
    "mix32",
    "number_keyed_dropouts",
    "set_dropout_key",
    "step_key",
    "step_key_tensor",
]
