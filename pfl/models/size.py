"""A model's size, counted before it is allocated: a width typo (``--model.hidden [100000000]``) or
a data set with millions of classes is refused with one line, not an allocator traceback or the
kernel's out-of-memory kill."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn

from pfl.errors import ConfigError
from pfl.memory import available_memory, gigabytes

# Training holds at least three model-sized tensors at once: the weights, their gradients, the server's model.
COPIES = 3


def model_bytes(build: Callable[[], nn.Module]) -> int | None:
    """Bytes of the parameters and buffers ``build()`` creates, built on the meta device (shapes only:
    nothing is allocated and no random number is drawn); None when it cannot be built there."""
    try:
        with torch.device("meta"):
            net = build()
    except ConfigError:
        raise
    except Exception:  # a module that needs real tensors to build is measured by building it for real
        return None
    return sum(t.numel() * t.element_size() for t in itertools.chain(net.parameters(), net.buffers()))


def check_model_fits(build: Callable[[], nn.Module], what: str, available: int | None = None) -> None:
    """Refuse ``what`` (the model, its input and classes, for the message) when ``COPIES`` times its
    size exceeds the memory available (``available``, default: the system's)."""
    size = model_bytes(build)
    available = available_memory() if available is None else available
    if size is None or available is None or COPIES * size <= available:
        return
    raise ConfigError(
        "model",
        f"{what} has {gigabytes(size)} of parameters; training holds at least {COPIES} copies "
        f"({gigabytes(COPIES * size)}), but {gigabytes(available)} of memory is available",
        "choose smaller widths (model.hidden, model.channels, model.fc) or a smaller model.name",
    )
