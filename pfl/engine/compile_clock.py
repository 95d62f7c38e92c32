"""How long ``trainer.compile`` spent compiling: the first call of each compiled function (the
vectorized step, the model's forward) timed, since that call traces and compiles before it runs.
On CUDA the clock is read after a device sync, so it stops when the work is done, not when it is queued.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pfl.engine.device_wait import wait_for


class CompileClock:
    """Seconds of the compiled functions' first calls (``seconds``: None until one has run)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: float | None = None

    def _now(self) -> float:
        wait_for(self.device)
        return time.perf_counter()

    def _add(self, seconds: float) -> None:
        self.seconds = (self.seconds or 0.0) + seconds

    def first_call(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` whose first call is timed (later calls go straight through)."""
        timed = False

        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal timed
            if timed:
                return fn(*args, **kwargs)
            start = self._now()
            out = fn(*args, **kwargs)
            self._add(self._now() - start)
            timed = True
            return out

        return call

    def first_forward(self, module: nn.Module) -> None:
        """Time ``module``'s first forward (hooks that remove themselves: the module stays as it is)."""
        started: list[float] = []

        def before(_module: nn.Module, _args: Any) -> None:
            started.append(self._now())

        def after(_module: nn.Module, _args: Any, _out: Any) -> None:
            self._add(self._now() - started[0])
            pre.remove()
            post.remove()

        pre = module.register_forward_pre_hook(before)
        post = module.register_forward_hook(after)


__all__ = ["CompileClock"]
