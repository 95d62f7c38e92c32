"""FederatedLoop: the rounds of a run — sample, dispatch, aggregate, server step, evaluate.

The loop receives built parts (``pfl.runner.assembly.build_loop`` assembles them from a run's plan, as
Lightning Fabric's build-your-own-trainer receives its model and optimizers): the method (local update
and server hooks), the client trainer (``pfl.engine.trainer``; the loop's ``worker``), the server's
context and optimizer, the upload transforms (an attack, the robust rule: ``pfl.federation.transforms``),
the client store, the evaluation session, a dispatcher (how local updates run:
``pfl.federation.dispatch``), the run's progress (``pfl.federation.progress``) and callbacks: the
outputs, the checkpoints (``Checkpointing``: a ``pfl.federation.checkpoint.Checkpointer`` saving the
run's state) and the progress bar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from torch import Tensor
from tqdm.auto import tqdm

from pfl import numeric_platform
from pfl.engine.device_wait import wait_for
from pfl.engine.flat import FlatModule
from pfl.engine.trainer import ClientTrainer
from pfl.federation import divergence
from pfl.federation.checkpoint import Checkpointer
from pfl.federation.dispatch import Dispatcher, client_context
from pfl.federation.progress import RunProgress
from pfl.federation.server_opt import ServerOptimizer
from pfl.federation.store import ClientStore
from pfl.federation.summary import run_summary
from pfl.federation.transforms import UploadStep, UploadTransform, apply_transforms, check_order
from pfl.methods.base import ClientContext, Method, ServerContext, Upload
from pfl.metrics.session import EvalSession
from pfl.seeding import numpy_rng

TIMING_PREFIXES = ("throughput.", "time.")  # metrics that measure the machine, not the method


def sample_clients(seed: int, round_idx: int, num_clients: int, count: int) -> np.ndarray:
    """The sorted ids of the ``count`` clients sampled in ``round_idx`` (keyed, order-free)."""
    if count >= num_clients:
        return np.arange(num_clients)
    return np.sort(numpy_rng(seed, round_idx, "sample").choice(num_clients, count, replace=False))


@dataclass(frozen=True)
class Schedule:
    """When things happen: the rounds, when to evaluate, the seed of client sampling."""

    rounds: int
    eval_every: int = 1
    seed: int = 0


@dataclass
class FitTimes:
    """Wall seconds of this process's rounds and of its evaluations, and how many of each: the parts of
    a run that grow with its rounds and with its evaluations (``summary.json`` → ``timing``; the suite's
    estimate, ``pfl.runner.suite_estimate``, scales them apart). A round's time is its training,
    aggregation and checkpoint; an evaluation's (every ``eval_every`` and the last) is the evaluation
    and the outputs that record it. The rest of a run (data, model, the run-level evaluation after the
    rounds, the outputs' files) grows with neither. The first round's seconds are also kept apart: it
    pays what later rounds do not (compiling, capturing CUDA graphs, lazy allocations)."""

    rounds: int = 0
    rounds_s: float = 0.0
    first_round_s: float = 0.0
    evaluations: int = 0
    evaluations_s: float = 0.0


class Callback:
    """An extension point of the loop: run outputs (files, plots, W&B) are callbacks the loop calls,
    never code inside the loop. Every hook is optional."""

    def on_fit_start(self, loop: FederatedLoop) -> None:  # noqa: B027 - optional hook
        """Before the first round of this process (also after a resume)."""

    def on_evaluation(self, loop: FederatedLoop, metrics: dict[str, Any]) -> None:  # noqa: B027
        """After an evaluated round: ``metrics`` is its row of ``loop.history``."""

    def on_round_end(self, loop: FederatedLoop) -> None:  # noqa: B027
        """After every round (and its evaluation, when it has one)."""

    def on_fit_end(self, loop: FederatedLoop, summary: dict[str, Any]) -> None:  # noqa: B027
        """After the last round: ``summary`` is what ``fit`` returns."""


class FederatedLoop:
    def __init__(
        self,
        *,
        method: Method,
        worker: ClientTrainer,
        server: ServerContext,
        server_optimizer: ServerOptimizer,
        clients: ClientStore,
        evals: EvalSession,
        dispatcher: Dispatcher,
        schedule: Schedule,
        checkpointer: Checkpointer,
        transforms: Sequence[UploadTransform] = (),  # none: the method aggregates the uploads as sent
        progress: RunProgress | None = None,  # where the run stands (restored by a resume); None: round 0
        callbacks: Sequence[Callback] = (),
    ):
        self.method, self.worker, self.server, self.server_optimizer = method, worker, server, server_optimizer
        self.clients, self.evals, self.dispatcher, self.schedule = clients, evals, dispatcher, schedule
        self.checkpointer, self.callbacks = checkpointer, list(callbacks)
        check_order(transforms)
        self.transforms = list(transforms)
        self.progress = RunProgress() if progress is None else progress
        self.init_state: Tensor = server.init_state
        self.selected_rows: list[dict[str, Any]] = []  # client rows of the reported round
        self.train_losses: list[float] = []  # last-epoch training losses of this round's fits

    # -- where the run stands (``progress``) ------------------------------------------------------
    @property
    def round(self) -> int:
        """Rounds completed."""
        return self.progress.round

    @property
    def history(self) -> list[dict[str, Any]]:
        """The metrics of every evaluated round, in order."""
        return self.progress.history

    @property
    def client_rows(self) -> list[dict[str, Any]]:
        """The per-client rows of the last evaluation."""
        return self.progress.client_rows

    @property
    def flat(self) -> FlatModule:
        return self.worker.flat

    @property
    def device(self) -> Any:
        return self.worker.device

    def _clock(self) -> float:
        """Wall seconds once the device's queued work is done: a round's or an evaluation's time is
        that of its work, not of launching it."""
        wait_for(self.device)
        return time.perf_counter()

    def client(self, cid: int) -> ClientContext:
        """Client ``cid`` as its local update sees it: its stored state (created empty), which the
        method may change."""
        return client_context(cid, self.round, self.worker, self.clients, self.init_state)

    def peek_client(self, cid: int) -> ClientContext:
        """Client ``cid`` for reading (evaluation): its stored state, or an empty one that is not
        stored. A disk store serves it without displacing the clients in use."""
        state = self.clients.peek(cid)
        return ClientContext(cid, self.round, self.worker, {} if state is None else state, self.init_state)

    def sampled_clients(self) -> np.ndarray:
        return sample_clients(self.schedule.seed, self.round, self.server.num_clients, self.server.clients_per_round)

    # -- one round --------------------------------------------------------------------------------
    def run_round(self) -> None:
        self.server.round = self.round
        sampled = self.sampled_clients().tolist()
        # Payloads are a function of the server state, which every rank holds: each rank knows what
        # every sampled client received, so byte counts agree without a second exchange.
        payloads = {cid: self.method.payload(self.server, cid) for cid in sampled}
        uploads, fits = self.dispatcher.dispatch(self.method, self.round, sampled, payloads)
        step = UploadStep(self.method, self.server, payloads, self.round)
        transformed = apply_transforms(self.transforms, uploads, step)
        for cid in sampled:  # bytes exchanged (+ trained model if kept), as the server received them
            self.evals.observe(cid, payloads[cid], transformed.received[cid])
        self.train_losses = [f.loss for f in fits if f.loss == f.loss]  # methods with their own loop report NaN
        self.progress.train_samples += sum(f.samples_seen for f in fits)
        self.progress.train_seconds += sum(f.seconds for f in fits)
        self.aggregate(transformed.received, transformed.combined)
        divergence.check_server(self.round + 1, self.server.state)
        self.evals.comm.extra(*self.method.comm_extra(self.server))
        for cid in sampled:  # drop empty entries so FedAvg-like methods keep no per-client memory
            if cid in self.clients and not self.clients.peek(cid):
                del self.clients[cid]
        self.clients.mark_changed(sampled)  # trained this round: their states may have changed in place
        self.progress.round += 1

    def aggregate(self, received: dict[int, Upload], combined: dict[int, Upload]) -> None:
        """The method's aggregation of the ``combined`` uploads (after every upload transform), then the
        server optimizer's step on the global model; the conflict share is taken over the ``received`` ones."""
        step = not self.server_optimizer.is_identity
        # The conflict share is a pass over every upload: taken only in a round that ends in an evaluation.
        observe = self.evaluates_after(self.round + 1)
        keep = self.method.has_global_model and (step or observe)
        previous = self.server["global"].clone() if keep else None  # the method may update it in place
        self.method.aggregate(self.server, combined)
        if previous is None:
            return
        if step:
            self.server_optimizer.step(self.server.state, previous, self.server.layout)
        if observe:
            self.evals.observe_update(previous, self.server["global"], received)

    def evaluates_after(self, round_number: int) -> bool:
        """Whether ``fit`` evaluates once ``round_number`` rounds are done (every trainer.eval_every, and the last)."""
        return round_number % self.schedule.eval_every == 0 or round_number == self.schedule.rounds

    @property
    def own_key(self) -> str:
        """Per-client key of the P-model's own-test score (pm.l_acc, or pm.mae for regression)."""
        return self.evals.own_key

    def evaluate(self) -> dict[str, float]:
        metrics, rows = self.evals.evaluate(self.method, self.server, self.peek_client, self.round)
        metrics.update(self.method.metrics(self.server))
        metrics["time.checkpoint_s"] = self.checkpointer.seconds  # total so far (docs/performance.md)
        metrics["throughput.samples_per_s"] = self.progress.train_samples / max(self.progress.train_seconds, 1e-9)
        if self.train_losses:
            # fsum is exactly rounded: the mean does not depend on the order clients were trained in
            metrics["train.loss"] = math.fsum(self.train_losses) / len(self.train_losses)
        self.progress.client_rows = rows  # a new list: the checkpointer saves it with the next link
        return metrics

    # -- the whole run ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """The remaining rounds, evaluating after every ``eval_every`` and the last; the callbacks
        (outputs, checkpoints, the progress bar) are called at each step. Returns the summary."""
        rounds = self.schedule.rounds
        self.evals.check()
        for cb in self.callbacks:
            cb.on_fit_start(self)
        metrics = self.history[-1] if self.history else {}
        times = FitTimes()
        while self.round < rounds:
            started = self._clock()
            self.run_round()
            evaluation = 0.0
            if self.evaluates_after(self.round):
                at = self._clock()
                metrics = {"round": self.round, **self.evaluate()}
                self.progress.history.append(metrics)
                self.evals.keep_rows(self.history)
                for cb in self.callbacks:
                    cb.on_evaluation(self, metrics)
                evaluation = self._clock() - at
                times.evaluations += 1
                times.evaluations_s += evaluation
            for cb in self.callbacks:
                cb.on_round_end(self)
            seconds = self._clock() - started - evaluation
            if times.rounds == 0:
                times.first_round_s = seconds
            times.rounds += 1
            times.rounds_s += seconds
        summary = self.summary(metrics)
        summary["timing"] = asdict(times)  # this process's: a resume times only the rounds it ran
        summary["platform"] = numeric_platform.record(self.device)  # where its numbers were computed
        for cb in self.callbacks:
            cb.on_fit_end(self, summary)
        return summary

    def summary(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The reported round's metrics and the run-level ones (``pfl.federation.summary``)."""
        summary, self.selected_rows = run_summary(
            self.method, self.server, self.worker, self.evals, self.progress, self.schedule.seed, metrics
        )
        return summary


class Checkpointing(Callback):
    """Writes a checkpoint after every round the checkpointer finds due (``trainer.checkpoint_every``,
    or its cost ratio), and after the last."""

    def __init__(self, checkpointer: Checkpointer):
        self.checkpointer = checkpointer

    def on_round_end(self, loop: FederatedLoop) -> None:
        if loop.round == loop.schedule.rounds or self.checkpointer.due(loop.round):
            self.checkpointer.save()


class ProgressBar(Callback):
    """The rounds as a tqdm bar (``trainer.progress``), with the last evaluation's headline scores.
    Started after the callbacks before it (W&B takes seconds), so its rate and ETA are the rounds'."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def on_fit_start(self, loop: FederatedLoop) -> None:
        self.bar = tqdm(total=loop.schedule.rounds, initial=loop.round, desc=loop.method.name, dynamic_ncols=True)

    def on_evaluation(self, loop: FederatedLoop, metrics: dict[str, Any]) -> None:
        shown = {k: metrics[k] for k in ("pm.l_acc.mean", "gm.acc") if k in metrics}
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4f}" for k, v in shown.items()})

    def on_round_end(self, loop: FederatedLoop) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_fit_end(self, loop: FederatedLoop, summary: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()


def comparable_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Metrics that must be identical for the same seed (everything but timings)."""
    return {k: v for k, v in summary["metrics"].items() if not k.startswith(TIMING_PREFIXES)}


__all__ = [
    "Callback",
    "Checkpointing",
    "FederatedLoop",
    "FitTimes",
    "ProgressBar",
    "Schedule",
    "comparable_metrics",
    "sample_clients",
]
