"""The line a vectorized run adds when its clients' fits stacked none: ``trainer.vectorize`` then only
adds lockstep's handoffs. ``vectorize_problems`` can name before the run only what a method declares
(``one_at_a_time``); a fit's own terms, loss or objective show only when it runs (``Lockstep.stacks``)."""

from __future__ import annotations

from typing import Any

from pfl.federation.dispatch import MultiProcessDispatcher, VectorizedDispatcher
from pfl.federation.loop import Callback, FederatedLoop
from pfl.runner.training_path import announce


class LockstepReport(Callback):
    """Says once, at the first evaluation (or the end of the run), that no fit was trained together and
    why (rank 0's loop only: ``build_loop`` adds it to vectorized runs there)."""

    def __init__(self) -> None:
        self.said = False

    def _say(self, loop: FederatedLoop) -> None:
        dispatcher = loop.dispatcher
        if isinstance(dispatcher, MultiProcessDispatcher):
            dispatcher = dispatcher.local
        if self.said or not isinstance(dispatcher, VectorizedDispatcher):
            return
        self.said = True
        why = dispatcher.lockstep.stacked_nothing()
        if why is not None:
            announce(
                f"no fit was trained together: {loop.method.name}'s fits ran one client at a time (the first "
                f"with {why}), so trainer.vectorize gains nothing (set trainer.vectorize false; a method whose "
                "fits never stack says why in its one_at_a_time, which auto and true read before the run)"
            )

    def on_evaluation(self, loop: FederatedLoop, metrics: dict[str, Any]) -> None:
        self._say(loop)

    def on_fit_end(self, loop: FederatedLoop, summary: dict[str, Any]) -> None:
        self._say(loop)


__all__ = ["LockstepReport"]
