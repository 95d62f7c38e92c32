"""Dispatchers: how a round's local updates run — one after another, vectorized, or split across processes.

A dispatcher takes the sampled clients and their payloads, runs ``method.local_update`` for each (in
client-id order), checks the results for divergence and returns the uploads (sorted by id) and the
fits' statistics. Which one a run uses is decided once, when the run is assembled
(``pfl.runner.assembly.build_loop``); the loop only calls ``dispatch``.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from pfl.engine.lockstep import Lockstep, LockstepTrainer
from pfl.engine.stacked import StackedTrainer, model_problems
from pfl.engine.trainer import ClientTrainer, FitStats
from pfl.federation import divergence
from pfl.federation.distributed import Cohort
from pfl.federation.store import ClientStore
from pfl.methods.base import ClientContext, Method, MethodFlagWarning, Upload


@dataclass
class LocalUpdates:
    """One process's local updates of a round."""

    uploads: dict[int, Upload] = field(default_factory=dict)
    fits: list[FitStats] = field(default_factory=list)
    client_fits: dict[int, list[FitStats]] = field(default_factory=dict)
    sums: list[Tensor] | None = None  # per client: the divergence test's sum (None: computed on demand)

    def losses(self) -> dict[int, list[float]]:
        return {cid: [f.loss for f in fits] for cid, fits in self.client_fits.items()}


def client_context(
    cid: int, round_idx: int, worker: ClientTrainer | LockstepTrainer, clients: ClientStore, init_state: Tensor
) -> ClientContext:
    """Client ``cid`` as its local update sees it: its stored state (created empty), which the method
    may change. The one place a trained client's context is built (the dispatchers and the loop)."""
    return ClientContext(cid, round_idx, worker, clients.setdefault(cid, {}), init_state)  # type: ignore[arg-type]


class Dispatcher(ABC):
    """Runs a round's local updates on this process's share of the sampled clients."""

    def __init__(self, worker: ClientTrainer, clients: ClientStore, init_state: Tensor):
        self.worker, self.clients, self.init_state = worker, clients, init_state
        self.first_round_checked = False  # check_personal_models runs on this process's first round

    @abstractmethod
    def train(self, method: Method, round_idx: int, cids: Sequence[int], payloads: dict[int, Any]) -> LocalUpdates:
        """``method.local_update`` of each of ``cids``, in order, on this process."""

    def dispatch(
        self, method: Method, round_idx: int, sampled: Sequence[int], payloads: dict[int, Any]
    ) -> tuple[dict[int, Upload], list[FitStats]]:
        """The uploads of every sampled client (by id) and the fits' statistics; a diverged client is
        named (``pfl.federation.divergence``)."""
        updates = self.train(method, round_idx, sampled, payloads)
        divergence.check_round(round_idx + 1, sampled, updates.uploads, self.clients, updates.losses(), updates.sums)
        self.check_personal_models(method, round_idx, sampled)
        return updates.uploads, updates.fits

    def check_personal_models(self, method: Method, round_idx: int, cids: Sequence[int]) -> None:
        """Once, after the first round: warn when a method that says it has personal models and scores the
        base ``personal_state`` stored none for a client it trained, whose P-model (pm.*) is then its
        initial model. A user's global-model method that leaves ``has_personal_model`` at its default
        True would otherwise report the untrained model's accuracy as its personalized one."""
        if self.first_round_checked:
            return
        self.first_round_checked = True
        if not method.has_personal_model or type(method).personal_state is not Method.personal_state:
            return
        missing = [cid for cid in cids if "personal" not in self.clients.peek(cid, {})]
        if missing:
            code = type(method).local_update.__code__  # the warning points at the method's own code
            warnings.warn_explicit(
                f"{method.name} has has_personal_model = True and the default personal_state, but its "
                f"local_update stored no client.state['personal'] for client {missing[0]} in round "
                f"{round_idx + 1}, so that client's P-model (pm.*) is its initial model: set the class "
                "attribute has_personal_model = False if its P-model is the global model, else store the "
                "personal model in client.state['personal'] or override personal_state",
                MethodFlagWarning,
                code.co_filename,
                code.co_firstlineno,
            )


class SequentialDispatcher(Dispatcher):
    """One client after another on this process's worker."""

    def train(self, method: Method, round_idx: int, cids: Sequence[int], payloads: dict[int, Any]) -> LocalUpdates:
        out = LocalUpdates(sums=[])
        for cid in cids:
            ctx = client_context(cid, round_idx, self.worker, self.clients, self.init_state)
            out.uploads[cid] = method.local_update(ctx, payloads[cid])
            out.fits += ctx.fits
            out.client_fits[cid] = ctx.fits
            # The divergence test's sum, taken while this client's tensors are still in cache.
            out.sums.append(divergence.finite_sum([out.uploads[cid], ctx.state]))  # type: ignore[union-attr]
        return out


class VectorizedDispatcher(Dispatcher):
    """The local updates run in lockstep (``pfl.engine.lockstep``): each client's code as in sequential
    mode, one client at a time, while the fits they reach together are trained as one stacked step
    (``trainer.vectorize``)."""

    def __init__(
        self,
        worker: ClientTrainer,
        clients: ClientStore,
        init_state: Tensor,
        trained: ClientStore,
        compile: bool,
        graphs: bool = False,
    ):
        super().__init__(worker, clients, init_state)
        self.trained = trained  # the evaluation's store of trained models, pinned alongside
        self.lockstep = Lockstep(worker, StackedTrainer(worker, compile=compile, graphs=graphs))

    def train(self, method: Method, round_idx: int, cids: Sequence[int], payloads: dict[int, Any]) -> LocalUpdates:
        out = LocalUpdates(sums=[])
        contexts: dict[int, ClientContext] = {}

        def update(cid: int) -> Any:
            def run(worker: LockstepTrainer) -> Upload:
                ctx = contexts[cid] = client_context(cid, round_idx, worker, self.clients, self.init_state)
                return method.local_update(ctx, payloads[cid])

            return run

        with self.clients.pin(cids), self.trained.pin(cids):
            uploads = self.lockstep.run([update(cid) for cid in cids])
        for cid, upload in zip(cids, uploads, strict=True):
            ctx = contexts[cid]
            out.uploads[cid] = upload
            out.fits += ctx.fits
            out.client_fits[cid] = ctx.fits
            out.sums.append(divergence.finite_sum([upload, ctx.state]))  # type: ignore[union-attr]
        return out


class MultiProcessDispatcher(Dispatcher):
    """Each rank trains its share of the sampled clients (balanced by size) with ``local``; every rank
    then holds every upload and every trained client's new state (``Cohort.exchange``)."""

    def __init__(self, local: Dispatcher, cohort: Cohort, sizes: Sequence[int]):
        super().__init__(local.worker, local.clients, local.init_state)
        self.local, self.cohort, self.sizes = local, cohort, sizes

    def train(self, method: Method, round_idx: int, cids: Sequence[int], payloads: dict[int, Any]) -> LocalUpdates:
        return self.local.train(method, round_idx, self.cohort.share(cids, self.sizes), payloads)

    def dispatch(
        self, method: Method, round_idx: int, sampled: Sequence[int], payloads: dict[int, Any]
    ) -> tuple[dict[int, Upload], list[FitStats]]:
        updates = self.train(method, round_idx, sampled, payloads)
        states = {cid: self.clients.get(cid, {}) for cid in updates.uploads}
        uploads, states, fits = self.cohort.exchange(updates.uploads, states, updates.fits, self.worker.device)
        self.clients.update(states)
        divergence.check_round(round_idx + 1, sampled, uploads, self.clients, {})  # the same on every rank
        divergence.check_losses(round_idx + 1, [f.loss for f in fits])
        self.check_personal_models(method, round_idx, sampled)
        return uploads, fits


def vectorize_problems(method: Method, worker: ClientTrainer, precision: str) -> list[str]:
    """Why ``trainer.vectorize`` cannot train this run's clients together (empty: it can)."""
    return method.vectorize_problems() + model_problems(worker, precision)


def make_dispatcher(
    worker: ClientTrainer,
    clients: ClientStore,
    init_state: Tensor,
    *,
    cohort: Cohort,
    sizes: Sequence[int],
    vectorize: bool = False,
    trained: ClientStore | None = None,
    compile: bool = False,
    graphs: bool = False,
) -> Dispatcher:
    """The dispatcher of a run: vectorized or sequential on each process, split across several ones;
    ``graphs``: the vectorized step replayed from CUDA graphs (``trainer.cuda_graphs``)."""
    local: Dispatcher
    if vectorize:
        assert trained is not None
        local = VectorizedDispatcher(worker, clients, init_state, trained, compile, graphs)
    else:
        local = SequentialDispatcher(worker, clients, init_state)
    return local if cohort.world_size == 1 else MultiProcessDispatcher(local, cohort, sizes)


__all__ = [
    "Dispatcher",
    "MultiProcessDispatcher",
    "SequentialDispatcher",
    "LocalUpdates",
    "client_context",
    "VectorizedDispatcher",
    "make_dispatcher",
    "vectorize_problems",
]
