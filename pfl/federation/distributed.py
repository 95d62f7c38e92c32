"""Multi-process rounds: split the sampled clients across ranks, train, gather, aggregate everywhere.

Every rank holds the whole federation (data, server state, client store). In a round each rank
trains only its share of the sampled clients; the uploads, the client-store entries those clients
changed and their fit statistics are then gathered, so that every rank runs the method's
``aggregate`` on the same full result dict and ends the round with identical server *and* client
state. Evaluation and checkpoints therefore see the same federation on every rank, and only
rank 0 writes files.

Because every random draw is keyed by (seed, round, client, purpose), a client trains the same
way on whichever rank it lands: 2 processes give the 1-process result up to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from pfl.engine.trainer import FitStats
from pfl.methods.base import State

Gather = Callable[[Any], list[Any]]


def balance(clients: Sequence[int], sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Greedy balance by client size: largest first onto the least-loaded rank (ties: lowest
    client id first, then lowest rank). Returns each rank's clients, sorted by id."""
    loads = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for cid in sorted(clients, key=lambda c: (-sizes[c], c)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(cid)
        loads[rank] += sizes[cid]
    return [sorted(s) for s in shares]


def move(obj: Any, device: torch.device | str) -> Any:
    """``obj`` with every tensor inside dicts/lists/tuples moved to ``device``."""
    if isinstance(obj, Tensor):
        return obj.to(device)
    if is_dataclass(obj) and not isinstance(obj, type):  # an Upload
        return replace(obj, **{f.name: move(getattr(obj, f.name), device) for f in fields(obj)})
    if isinstance(obj, dict):
        return {k: move(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move(v, device) for v in obj)
    return obj


def _all_gather_object(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class Cohort:
    """This process's place among the ranks that share a federation."""

    def __init__(self, rank: int = 0, world_size: int = 1, gather: Gather | None = None):
        if world_size > 1 and gather is None:
            raise ValueError("a cohort of several ranks needs a gather function")
        self.rank, self.world_size = rank, world_size
        self._gather = gather

    @classmethod
    def from_fabric(cls, fabric: Any | None) -> Cohort:
        if fabric is None or fabric.world_size == 1:
            return cls()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("trainer.devices > 1 needs fabric.launch() before the loop is built")
        return cls(fabric.global_rank, fabric.world_size, _all_gather_object)

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable Python objects; tensors on the CPU)."""
        if self.world_size == 1:
            return [obj]
        assert self._gather is not None
        return self._gather(obj)

    def share(self, clients: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """The sampled clients this rank trains (all of them, in the given order, on one rank)."""
        if self.world_size == 1:
            return list(clients)
        return balance(clients, sizes, self.world_size)[self.rank]

    def exchange(
        self,
        results: dict[int, Any],
        states: dict[int, State],
        fits: list[FitStats],
        device: torch.device,
    ) -> tuple[dict[int, Any], dict[int, State], list[FitStats]]:
        """Every rank's uploads, client-store entries and fit stats, merged and sorted by client id.

        Tensors travel through host memory (pickled by ``all_gather_object``) so that a CUDA tensor
        never arrives on another rank's device index."""
        if self.world_size == 1:
            return dict(sorted(results.items())), states, fits
        assert self._gather is not None
        parts = self._gather(move((results, states, fits), "cpu"))
        all_results: dict[int, Any] = {}
        all_states: dict[int, State] = {}
        all_fits: list[FitStats] = []
        for rank, (r, s, f) in enumerate(parts):
            # A rank's own tensors stay as they are; only the other ranks' are copied in.
            if rank == self.rank:
                r, s = results, states
            else:
                r, s = move(r, device), move(s, device)
            all_results.update(r)
            all_states.update(s)
            all_fits += f
        return dict(sorted(all_results.items())), all_states, all_fits
