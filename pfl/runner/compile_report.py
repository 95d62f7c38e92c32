"""``trainer.compile``'s line in the log: how long compiling took (``pfl.engine.compile_clock``),
said once, after the first evaluated round that compiled (or at the end of the run)."""

from __future__ import annotations

from typing import Any

from pfl.federation.loop import Callback, FederatedLoop
from pfl.runner.training_path import announce


class CompileReport(Callback):
    """Announces the worker's compile seconds once (rank 0's loop only: ``build_loop`` adds it there)."""

    def __init__(self) -> None:
        self.said = False

    def _say(self, loop: FederatedLoop) -> None:
        seconds = loop.worker.compile_clock.seconds
        if self.said or seconds is None:
            return
        announce(f"compiling took {seconds:.1f} s (first compiled step)")
        self.said = True

    def on_evaluation(self, loop: FederatedLoop, metrics: dict[str, Any]) -> None:
        self._say(loop)

    def on_fit_end(self, loop: FederatedLoop, summary: dict[str, Any]) -> None:
        self._say(loop)


__all__ = ["CompileReport"]
