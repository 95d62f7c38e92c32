"""Lockstep local updates: a round's clients run their own code one at a time, and their fits are
trained together (``trainer.vectorize``).

Each sampled client's local update runs in its own thread, but only one thread runs at a time (an
explicit handoff), in the order given, so the code between fits runs exactly as in sequential mode.
The update sees a ``LockstepTrainer``: the client trainer itself for everything (evaluation, batches,
fits that cannot be stacked: those run right there, one client at a time, exactly), except a ``fit``
that ``StackedTrainer`` can train, a ``mean_gradient`` (PGFed's full pass) and a ``gradient`` call of the
method's own loop (pFedMe, Per-FedAvg, FedALA): those post a request and wait. When every client waits on
a request or has finished, the pending fits are trained together (``StackedTrainer.train``), the pending
mean gradients and batch gradients computed together (``StackedTrainer.mean_gradients``,
``batch_gradients``), and the waiting clients resume, one at a time in order, each
finding the worker as its own sequential call would have left it: after a batch gradient its parameters,
the gradient, its augmentation generator and torch's global generator as before the call; after a fit the trained state
loaded (``snapshot()``), its momentum (``momentum_buffer()``), and torch's global generator seeded by
the fit's key (``ClientTrainer.epoch_batches``; nothing draws from it in a stacked fit); after a mean gradient
the state loaded with the running statistics its passes moved, and the gradient zeroed.

Exact for a local update that does not depend on the other clients' updates of the round: no state
shared between clients beyond the worker (e.g. attributes the method sets on itself), and no draws
from torch's global generator before a client's first fit (sequentially that stream continues from
the previous client's last fit). Such a method sets ``Method.vectorizable = False``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from pfl.engine.stacked import (
    BatchGradientRequest,
    FitRequest,
    GradientRequest,
    StackedTrainer,
    model_problems,
    precision_name,
    spec_problem,
)
from pfl.engine.trainer import DEFAULT_FIT, ClientTrainer, FitSpec, FitStats, LossFn
from pfl.seeding import seed_everything

T = TypeVar("T")


class _Abandoned(BaseException):
    """Unwinds a waiting client's thread when the round stops (another client raised)."""


class LockstepTrainer:
    """The ``ClientTrainer`` as one client's local update sees it in lockstep (see the module's docstring)."""

    def __init__(self, worker: ClientTrainer, lockstep: Lockstep, slot: int):
        self._worker, self._lockstep, self._slot = worker, lockstep, slot
        self._stacked: FitRequest | None = None  # the last fit, when it was stacked

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)

    def train(self, cid: int, start: Tensor, round_idx: int, spec: FitSpec = DEFAULT_FIT) -> FitStats:
        w = self._worker
        if not self._lockstep.stacks(spec):
            self._stacked = None
            return w.train(cid, start, round_idx, spec)
        request = FitRequest.of(w, cid, start, round_idx, spec)
        self._lockstep.wait_for(self._slot, request)
        w.flat.load(request.out)
        seed_everything(w.seed, round_idx, cid, spec.purpose)  # as the fit's epoch_batches leaves it
        self._stacked = request
        return request.stats

    def mean_gradient(self, cid: int, state: Tensor, round_idx: int = 0) -> tuple[Tensor, float]:
        w = self._worker
        if not self._lockstep.model_ok:
            return w.mean_gradient(cid, state, round_idx)
        request = GradientRequest(cid, state, round_idx)
        self._lockstep.stacked_gradients += 1
        self._lockstep.wait_for(self._slot, request)
        w.flat.load(request.state_out)  # type: ignore[arg-type]
        w.flat.grads.zero_()
        w.module.train()
        return request.grad, request.loss  # type: ignore[return-value]

    def gradient(self, b: Tensor, loss_fn: LossFn | None = None, augment: bool = True) -> Tensor:
        """``ClientTrainer.gradient``: with the task loss on a model that stacks, a request served with
        the other clients' calls; the worker is then as this client left it (its parameters, its
        augmentation generator, torch's global generator: the other clients ran meanwhile) with the
        gradient in ``flat.grads``."""
        w = self._worker
        if loss_fn is not None or not (self._lockstep.model_ok and self._lockstep.trainer.stacks_method_passes):
            self._lockstep.sequential_gradients += 1
            return w.gradient(b, loss_fn, augment)
        x, y = w.gradient_batch(b, augment)  # augmented now, from this client's generator, as the call would
        request = BatchGradientRequest(w.flat.params.clone(), x, y)
        generator, rng = w._augment_gen, torch.get_rng_state()
        self._lockstep.stacked_batch_gradients += 1
        self._lockstep.wait_for(self._slot, request)
        w._augment_gen = generator
        torch.set_rng_state(rng)
        w.flat.params.copy_(request.params)
        w.flat.grads.copy_(request.grad)  # type: ignore[arg-type]
        w.module.train()
        return request.loss  # type: ignore[return-value]

    def momentum_buffer(self) -> Tensor | None:
        if self._stacked is None:
            return self._worker.momentum_buffer()
        buf = self._stacked.buffer_out
        return None if buf is None else buf.clone()


class Lockstep:
    """Runs one round's local updates in lockstep on ``worker``, training their stackable fits together."""

    # The handoff: each client thread waits on its own semaphore and the round's thread on one of its
    # own, so passing the turn wakes exactly one thread (a shared condition woke every client at every
    # handoff: a round's cost grew with the square of its clients). ``run`` makes new ones every round:
    # a client left running when a round stops cannot leave a release behind for the next.
    _go: list[threading.Semaphore]
    _back: threading.Semaphore

    def __init__(self, worker: ClientTrainer, trainer: StackedTrainer):
        self.worker, self.trainer = worker, trainer
        self.model_ok = not model_problems(worker, precision_name(worker))
        self.stacked_fits = self.sequential_fits = self.stacked_gradients = 0  # counts, for tests and logs
        self.stacked_batch_gradients = self.sequential_gradients = 0  # a method's own gradient calls
        self.alone: str | None = None  # why the first fit that ran one client at a time did
        self._pending: dict[int, FitRequest | GradientRequest | BatchGradientRequest] = {}
        self._abandoned = False

    def stacks(self, spec: FitSpec) -> bool:
        """Whether a fit with these options is trained stacked (else on the worker, at once)."""
        why = None if self.model_ok else "a model that stacks no fit"
        why = why or spec_problem(spec)
        if why is None and spec.stacked_loss is not None and not self.trainer.stacks_method_passes:
            why = "a stacked loss (stacked_loss) on a model with running statistics or keyed dropout"
        if why is None:
            self.stacked_fits += 1
        else:
            self.sequential_fits += 1
            self.alone = self.alone or why
        return why is None

    def stacked_nothing(self) -> str | None:
        """Why no fit (nor gradient call) has been trained together so far, when none has and some fit
        ran alone (None otherwise): the first lone fit's reason."""
        stacked = self.stacked_fits + self.stacked_gradients + self.stacked_batch_gradients
        return None if stacked else self.alone

    def run(self, updates: Sequence[Callable[[LockstepTrainer], T]]) -> list[T]:
        """``updates[i](client_worker_i)`` for every i, in lockstep; their results in order. The first
        exception a client raises is raised here (with its traceback) once every thread has ended."""
        n = len(updates)
        results: list[Any] = [None] * n
        errors: list[BaseException | None] = [None] * n
        grad_mode = torch.is_grad_enabled()

        self._go = [threading.Semaphore(0) for _ in range(n)]
        self._back = threading.Semaphore(0)

        def body(slot: int) -> None:
            self._go[slot].acquire()
            if self._abandoned:
                return
            try:
                with torch.set_grad_enabled(grad_mode):  # grad mode is per thread in torch
                    results[slot] = updates[slot](LockstepTrainer(self.worker, self, slot))
            except _Abandoned:
                return
            except BaseException as e:  # handed to the caller's thread, raised there
                errors[slot] = e
            self._back.release()  # the turn back to the round's thread

        threads = [threading.Thread(target=body, args=(i,), daemon=True, name=f"pfl-lockstep-{i}") for i in range(n)]
        for t in threads:
            t.start()
        try:
            runnable = list(range(n))
            while runnable:
                for slot in runnable:
                    self._resume(slot)
                    if errors[slot] is not None:
                        raise errors[slot]  # type: ignore[misc]
                pending, self._pending = self._pending, {}
                requests = [pending[s] for s in sorted(pending)]
                fits = [r for r in requests if isinstance(r, FitRequest)]
                if fits:
                    self.trainer.train(fits)
                gradients = [r for r in requests if isinstance(r, GradientRequest)]
                if gradients:
                    self.trainer.mean_gradients(gradients)
                batch_gradients = [r for r in requests if isinstance(r, BatchGradientRequest)]
                if batch_gradients:
                    self.trainer.batch_gradients(batch_gradients)
                runnable = sorted(pending)
        finally:
            self._abandoned = True
            for go in self._go:  # every waiting client wakes, sees the round stopped, and unwinds
                go.release()
            for t in threads:
                t.join()
            self._abandoned, self._pending = False, {}
        return results

    def _resume(self, slot: int) -> None:
        """Let client ``slot`` run until it waits on a stacked fit or ends."""
        self._go[slot].release()
        self._back.acquire()

    def wait_for(self, slot: int, request: FitRequest | GradientRequest | BatchGradientRequest) -> None:
        """Called by client ``slot``'s thread: post its request and wait until it is served."""
        self._pending[slot] = request
        self._back.release()
        self._go[slot].acquire()
        if self._abandoned:
            raise _Abandoned


__all__ = ["LockstepTrainer", "Lockstep"]
