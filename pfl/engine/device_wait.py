"""Waiting for a device's queued work before reading a clock. CUDA runs kernels asynchronously: a clock
read right after launching them times their queueing, not the work. The CPU runs synchronously."""

from __future__ import annotations

import torch


def wait_for(device: torch.device) -> None:
    """Returns when the work queued on ``device`` is done (at once for the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


__all__ = ["wait_for"]
