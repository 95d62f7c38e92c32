"""Evaluate models that many clients share (the global model, the common initialisation) once for
all clients: one batched pass over every client's split instead of one small forward per client."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from pfl.client import EvalStats, Worker


class SharedStates:
    """Per-client stats where ``state`` is one of ``shared`` (by identity) come from one batched pass,
    computed on first use; any other state is evaluated on the client's split alone."""

    def __init__(self, worker: Worker, splits: Sequence[Tensor], shared: Sequence[Tensor | None]):
        self.worker, self.splits = worker, splits
        self.shared = [s for s in shared if s is not None]
        self._stats: dict[int, list[EvalStats]] = {}

    def stats(self, state: Tensor, cid: int) -> EvalStats:
        for i, s in enumerate(self.shared):
            if state is s:
                if i not in self._stats:
                    self._stats[i] = self.worker.evaluate_many(s, self.splits)
                return self._stats[i][cid]
        return self.worker.evaluate(state, self.splits[cid])
