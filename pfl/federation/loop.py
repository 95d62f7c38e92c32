"""FederatedLoop: rounds, seeded client sampling, dispatch, aggregation, evaluation, checkpoints.

The loop owns the round; the method supplies the local update and the server hooks, a server
optimizer steps the global model, and callbacks write the outputs. Lightning Fabric supplies the
device, precision and loggers. Per-client state lives in a client store (``pfl.federation.store``:
in memory, or spilled to disk beyond a memory budget), never as one live model per client.
Checkpoints are an incremental chain (``pfl.federation.checkpoint``): each round writes the server
state and only the clients that changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from tqdm.auto import tqdm

from pfl.config import RunConfig
from pfl.data.federated import FederatedData
from pfl.engine.flat import FlatModule
from pfl.engine.vectorized import DeferredWorker, VectorTrainer, unsupported
from pfl.engine.worker import Worker
from pfl.errors import require
from pfl.federation import divergence
from pfl.federation.attacks import Attack
from pfl.federation.checkpoint import Checkpoint, CheckpointChain, ListDelta, MapDelta
from pfl.federation.distributed import Cohort, move
from pfl.federation.server_opt import ServerOptimizer
from pfl.federation.store import ClientStore, make_store
from pfl.methods.base import ClientContext, ServerContext, Upload, train_settings
from pfl.methods.registry import methods
from pfl.metrics.evaluate import evaluate_new_clients
from pfl.metrics.session import EvalSession
from pfl.models import build_model
from pfl.seeding import numpy_rng, seed_everything

TIMING_PREFIXES = ("throughput.", "time.")  # metrics that measure the machine, not the method
# Methods whose local update only passes trained states on (into the upload or the client's state)
# without reading them during the round: exactly these can be trained vectorized (trainer.vectorize).
VECTORIZABLE = ("fedavg", "fedprox", "local", "ditto")
CHECKPOINT_COST_RATIO = 20.0  # with checkpoint_every > 1: checkpoint once this many times its cost has passed


def vectorize_problems(cfg: RunConfig, worker: Worker) -> list[str]:
    """Why ``trainer.vectorize`` cannot train this run's clients together (empty: it can)."""
    method = cfg.method
    registry = methods()
    problems = []
    if not any(type(method) is registry.get(name) for name in VECTORIZABLE):
        problems.append(f"method {method.name!r} is not one of {', '.join(VECTORIZABLE)}")
    elif getattr(method, "prox", None) == "autograd":
        problems.append("ditto's prox=autograd objective is a training_step (use exact or gradient)")
    return problems + unsupported(worker, cfg.trainer.precision)


def sample_clients(seed: int, round_idx: int, num_clients: int, count: int) -> np.ndarray:
    """The sorted ids of the ``count`` clients sampled in ``round_idx`` (keyed, order-free)."""
    if count >= num_clients:
        return np.arange(num_clients)
    return np.sort(numpy_rng(seed, round_idx, "sample").choice(num_clients, count, replace=False))


def clients_per_round(cfg: RunConfig, num_clients: int) -> int:
    """Clients sampled per round out of the ``num_clients`` that train (held-out new clients excluded)."""
    if cfg.trainer.clients_per_round is not None:
        return min(cfg.trainer.clients_per_round, num_clients)
    return max(1, int(round(cfg.trainer.fraction * num_clients)))


class Callback:
    """An extension point of the loop: run outputs (files, plots, W&B) are callbacks the loop calls,
    never code inside the loop. Every hook is optional."""

    def on_fit_start(self, loop: FederatedLoop) -> None:  # noqa: B027 - optional hook
        """Before the first round of this process (also after a resume)."""

    def on_evaluation(self, loop: FederatedLoop, metrics: dict[str, Any]) -> None:  # noqa: B027
        """After an evaluated round: ``metrics`` is its row of ``loop.history``."""

    def on_fit_end(self, loop: FederatedLoop, summary: dict[str, Any]) -> None:  # noqa: B027
        """After the last round: ``summary`` is what ``fit`` returns."""


class FederatedLoop:
    def __init__(
        self,
        cfg: RunConfig,
        data: FederatedData,
        run_dir: Path | None = None,
        fabric: L.Fabric | None = None,
        callbacks: Sequence[Callback] = (),
    ):
        self.cfg = cfg
        self.method = cfg.method
        self.chain: CheckpointChain | None = None
        self.run_dir = run_dir  # checkpoints go here (None: no checkpoints)
        self.fabric = fabric
        self.callbacks = list(callbacks)
        seed_everything(cfg.seed, "init")
        net = build_model(cfg.model, data.input_shape, data.num_classes)
        settings = train_settings(cfg.client, self.method, cfg.data.augment)  # client.*, with the method's overrides
        self.worker = Worker(net, data, settings, cfg.seed, fabric, cfg.eval.batch_size)
        self.init_state = self.worker.snapshot()
        n = self.worker.data.num_clients
        self.server = ServerContext(0, n, clients_per_round(cfg, n), self.worker.flat.layout, self.init_state)
        self.server.seed = cfg.seed
        global_test = self.worker.data.global_test
        if len(global_test):
            self.server.evaluator = lambda state: self.worker.evaluate(state, global_test)
        val = torch.cat([self.worker.split(c).val for c in range(n)])
        if len(val):  # the clients' validation splits, for server-side choices that must not see a test set
            self.server.val_evaluator = lambda state: self.worker.evaluate(state, val)
        # What a client answers when the server asks for its train loss at a candidate model (S-FedPG).
        self.server.client_loss = lambda cid, state: self.worker.evaluate(state, self.worker.split(cid).train).loss
        self.server.state = self.method.init_server(self.server)
        self.server_optimizer = ServerOptimizer(cfg.server)
        self.cohort = Cohort.from_fabric(fabric)
        t = cfg.trainer
        # A disk store spills into the run directory (its own disk), else into a temporary folder.
        spill = None if run_dir is None else Path(run_dir) / "client_store" / f"rank{self.cohort.rank}"
        self.clients: ClientStore = make_store(
            t.client_store, t.store_budget_mb, self.worker.device, spill and spill / "clients"
        )
        self.round = 0  # rounds completed
        self.history: list[dict[str, Any]] = []
        self.client_rows: list[dict[str, Any]] = []
        self.selected_rows: list[dict[str, Any]] = []  # client rows of the reported round
        several = self.cohort.world_size > 1
        self.evals = EvalSession(
            cfg.eval,
            self.worker,
            cfg.seed,
            trained=make_store(t.client_store, t.store_budget_mb, self.worker.device, spill and spill / "trained"),
            share=self.cohort.share if several else None,
            gather=self.cohort.gather_objects if several else None,
            rank=self.cohort.rank,
        )
        self.attack = Attack.build(cfg.attack, cfg.seed, n, self.method, self.worker.flat.layout)
        if self.attack is not None:
            self.evals.malicious = self.attack.malicious  # honest.* metrics leave these clients out
        self.train_samples = 0
        self.train_seconds = 0.0
        self.train_losses: list[float] = []  # last-epoch training losses of this round's fits
        self.checkpoint_seconds = 0.0
        self._history_saved = 0  # history rows already in the checkpoint chain
        self._rows_saved = True  # the client rows of the last evaluation are in the chain
        self._saved_round, self._saved_at, self._save_cost = 0, time.perf_counter(), None
        self._sizes = data.sizes("train")
        if t.compile:  # the forward of every fit and evaluation; the vectorized step below as well
            self.worker.module.net = torch.compile(self.worker.module.net, dynamic=True)
        self.vectorized: VectorTrainer | None = None
        if t.vectorize:
            problems = vectorize_problems(cfg, self.worker)
            require(not problems, "trainer.vectorize", "; ".join(problems), "set trainer.vectorize false")
            self.vectorized = VectorTrainer(self.worker, compile=t.compile)

    @property
    def run_dir(self) -> Path | None:
        return self._run_dir

    @run_dir.setter
    def run_dir(self, path: Path | str | None) -> None:
        """Where checkpoints go; may be set after construction (the runner claims the folder once
        the loop is built). A chain already loaded from that folder by ``resume`` is kept."""
        self._run_dir = None if path is None else Path(path)
        if self._run_dir is None:
            self.chain = None
        elif self.chain is None or self.chain.run_dir != self._run_dir:
            self.chain = CheckpointChain(self._run_dir)

    @property
    def flat(self) -> FlatModule:
        return self.worker.flat

    def client(self, cid: int) -> ClientContext:
        """Client ``cid`` as its local update sees it: its stored state (created empty), which the
        method may change."""
        state = self.clients.setdefault(cid, {})
        return ClientContext(cid, self.round, self.worker, state, self.init_state)

    def peek_client(self, cid: int) -> ClientContext:
        """Client ``cid`` for reading (evaluation): its stored state, or an empty one that is not
        stored. A disk store serves it without displacing the clients in use."""
        state = self.clients.peek(cid)
        return ClientContext(cid, self.round, self.worker, {} if state is None else state, self.init_state)

    def sampled_clients(self) -> np.ndarray:
        return sample_clients(self.cfg.seed, self.round, self.server.num_clients, self.server.clients_per_round)

    # -- one round --------------------------------------------------------------------------------
    def run_round(self) -> None:
        self.server.round = self.round
        c = self.cfg.client
        self.worker.settings.lr = c.lr * c.lr_decay**self.round
        sampled = self.sampled_clients().tolist()
        # Payloads are a function of the server state, which every rank holds: each rank knows what
        # every sampled client received, so byte counts agree without a second exchange.
        payloads = {cid: self.method.payload(self.server, cid) for cid in sampled}
        uploads: dict[int, Upload] = {}
        fits = []
        mine = self.cohort.share(sampled, self._sizes)
        single = self.cohort.world_size == 1
        client_fits: dict[int, list] = {}
        if self.vectorized is not None:
            # The local updates record their fits; the flush trains them all together and fills in
            # the trained states, so those clients' states stay on the device until then.
            deferred = DeferredWorker(self.worker, self.vectorized)
            with self.clients.pin(mine), self.evals.trained.pin(mine):
                for cid in mine:
                    ctx = ClientContext(cid, self.round, deferred, self.clients.setdefault(cid, {}), self.init_state)  # type: ignore[arg-type]
                    uploads[cid] = self.method.local_update(ctx, payloads[cid])
                    fits += ctx.fits
                    client_fits[cid] = ctx.fits
                deferred.flush()
            sums = None
        else:
            sums = []
            for cid in mine:
                ctx = self.client(cid)
                uploads[cid] = self.method.local_update(ctx, payloads[cid])
                fits += ctx.fits
                client_fits[cid] = ctx.fits
                # The divergence test's sum, taken while this client's tensors are still in cache.
                sums.append(divergence.finite_sum([uploads[cid], ctx.state]))
        if single:  # the first diverged client by id, named (several ranks: after the exchange)
            losses = {cid: [f.loss for f in client_fits[cid]] for cid in mine}
            divergence.check_round(self.round + 1, mine, uploads, self.clients, losses, sums)
        else:
            # Every rank aggregates the full, id-sorted upload dict and stores every client's new state.
            states = {cid: self.clients.get(cid, {}) for cid in mine}
            uploads, states, fits = self.cohort.exchange(uploads, states, fits, self.worker.device)
            self.clients.update(states)
            divergence.check_round(self.round + 1, sampled, uploads, self.clients, {})  # the same on every rank
            divergence.check_losses(self.round + 1, [f.loss for f in fits])
        if self.attack is not None:
            uploads = self.attack.apply(uploads, payloads, self.round)
        for cid in sampled:
            self.evals.observe(cid, payloads[cid], uploads[cid])  # bytes exchanged (+ trained model if kept)
        self.train_losses = [f.loss for f in fits if f.loss == f.loss]  # methods with their own loop report NaN
        self.train_samples += sum(f.samples_seen for f in fits)
        self.train_seconds += sum(f.seconds for f in fits)
        self.aggregate(uploads)
        divergence.check_server(self.round + 1, self.server.state)
        self.evals.comm.extra(*self.method.comm_extra(self.server))
        # Drop empty entries so FedAvg-like methods keep no per-client memory.
        for cid in sampled:
            if cid in self.clients and not self.clients.peek(cid):
                del self.clients[cid]
        self.clients.mark_changed(sampled)  # trained this round: their states may have changed in place
        self.round += 1

    def aggregate(self, uploads: dict[int, Upload]) -> None:
        """The method's aggregation, then the server optimizer's step on the global model."""
        step = not self.server_optimizer.is_identity
        # The conflict share is a pass over every upload: taken only in a round that ends in an evaluation.
        observe = self.evaluates_after(self.round + 1)
        keep = self.method.has_global_model and (step or observe)
        previous = self.server["global"].clone() if keep else None  # the method may update it in place
        self.method.aggregate(self.server, uploads)
        if previous is None:
            return
        if step:
            self.server_optimizer.step(self.server.state, previous, self.server.layout)
        if observe:
            self.evals.observe_update(previous, self.server["global"], uploads)

    def evaluates_after(self, round_number: int) -> bool:
        """Whether ``fit`` evaluates once ``round_number`` rounds are done (every trainer.eval_every, and the last)."""
        t = self.cfg.trainer
        return round_number % t.eval_every == 0 or round_number == t.rounds

    @property
    def own_key(self) -> str:
        """Per-client key of the P-model's own-test score (pm.l_acc, or pm.mae for regression)."""
        return self.evals.own_key

    def evaluate(self) -> dict[str, float]:
        metrics, rows = self.evals.evaluate(self.method, self.server, self.peek_client, self.round)
        metrics.update(self.method.metrics(self.server))
        metrics["time.checkpoint_s"] = self.checkpoint_seconds  # total so far (docs/performance.md)
        metrics["throughput.samples_per_s"] = self.train_samples / max(self.train_seconds, 1e-9)
        if self.train_losses:
            # fsum is exactly rounded: the mean does not depend on the order clients were trained in
            metrics["train.loss"] = math.fsum(self.train_losses) / len(self.train_losses)
        self.client_rows = rows
        self._rows_saved = False
        return metrics

    # -- the whole run ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        t = self.cfg.trainer
        self.evals.check()
        for cb in self.callbacks:
            cb.on_fit_start(self)
        # After the callbacks have started (W&B takes seconds): the bar's rate and ETA are the rounds'.
        bar = tqdm(
            total=t.rounds,
            initial=self.round,
            desc=self.method.name,
            disable=not (t.progress and self.cohort.is_zero),
            dynamic_ncols=True,
        )
        metrics = self.history[-1] if self.history else {}
        while self.round < t.rounds:
            self.run_round()
            bar.update(1)
            last = self.round == t.rounds
            if self.evaluates_after(self.round):
                metrics = {"round": self.round, **self.evaluate()}
                self.history.append(metrics)
                self.evals.keep_rows(self.history)
                shown = {k: metrics[k] for k in ("pm.l_acc.mean", "gm.acc") if k in metrics}
                bar.set_postfix({k: f"{v:.4f}" for k, v in shown.items()})
                for cb in self.callbacks:
                    cb.on_evaluation(self, metrics)
            if self.run_dir is not None and (last or self.checkpoint_due()):
                self.save()
        bar.close()
        summary = self.summary(metrics)
        for cb in self.callbacks:
            cb.on_fit_end(self, summary)
        return summary

    def summary(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The reported round's metrics (eval.select; ``metrics`` when nothing was evaluated), plus
        run-level ones: rounds_to_target, and new clients adapted from the final server state."""
        self.selected_rows = self.client_rows
        if self.history:
            metrics, self.selected_rows = self.evals.select(self.history)
        e = self.cfg.eval
        run_level = self.evals.target_round(self.history)
        if self.evals.measures("new"):
            run_level.update(
                evaluate_new_clients(
                    self.method, self.server, self.worker, self.round, e.new_client_epochs, self.init_state
                )
            )
        summary = {
            "method": self.method.name,
            "dataset": self.worker.data.name,
            "task": self.worker.task,
            "num_clients": self.server.num_clients,
            "rounds": self.round,
            "seed": self.cfg.seed,
            "hparams": self.method.hparams(),
            "select": e.select,
            "pm_source": self.evals.pm_source(self.method),
            "selected_round": metrics.get("round", self.round),
            "metrics": {**{k: v for k, v in metrics.items() if k != "round"}, **run_level},
        }
        if self.evals.reference is not None:
            summary["reference"] = {k: v for k, v in self.evals.reference.items() if k != "values"}
        return summary

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The whole federation as one dict (what ``load_checkpoint`` returns for a run)."""
        return {
            **self._values(),
            "clients": dict(self.clients.items()),
            "trained": dict(self.evals.trained.items()),
            "history": self.history,
            "client_rows": self.client_rows,
            "eval_rows": self.evals.rows,
        }

    def _values(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "server": self.server.state,
            "train_samples": self.train_samples,
            "train_seconds": self.train_seconds,
            "evals": self.evals.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (or a checkpoint of an earlier version, whose evaluation state
        held the trained models and rows)."""
        self._restore(state, state["history"], state["clients"].items(), state.get("trained", {}).items())

    def _restore(self, values: dict[str, Any], history: list, clients: Any, trained: Any) -> None:
        device = self.worker.device
        self.round = values["round"]
        self.server.round = self.round
        self.server.state = move(values["server"], device)
        self.history = list(history)
        self.client_rows = values.get("client_rows", [])
        self.train_samples = values["train_samples"]
        self.train_seconds = values["train_seconds"]
        evals = values.get("evals", {})
        if evals:
            self.evals.load_state_dict(evals, device)
        if "eval_rows" in values:
            self.evals.rows = values["eval_rows"]
        if "trained" in evals:  # a checkpoint of an earlier version: trained models in the evaluation state
            trained = evals["trained"].items()
        for store, items in ((self.clients, clients), (self.evals.trained, trained)):
            store.clear()
            for cid, state in items:  # one at a time: a disk store spills beyond its budget
                store[cid] = move(state, device)
            store.clear_changes()
        self._history_saved, self._rows_saved = len(self.history), True

    def checkpoint_due(self) -> bool:
        """After a round: ``trainer.checkpoint_every`` rounds since the last checkpoint (at most that
        many are lost to a kill), or earlier once the time since it is ``CHECKPOINT_COST_RATIO`` times
        what it cost, so checkpoints take at most ~1/20 of the run while the rounds allow."""
        if self.round - self._saved_round >= self.cfg.trainer.checkpoint_every or self._save_cost is None:
            return True
        return time.perf_counter() - self._saved_at >= CHECKPOINT_COST_RATIO * self._save_cost

    def save(self) -> None:
        """Write one link of the checkpoint chain: a delta with what changed since the last link
        (server state, counters, clients trained or removed, new history rows, the client rows
        after an evaluation), or a base with everything when the chain is due for one."""
        assert self.chain is not None
        started = time.perf_counter()
        base = self.chain.due_for_base()
        maps = {}
        for name, store in (("clients", self.clients), ("trained", self.evals.trained)):
            changed, removed = store.changes()
            ids = list(store) if base else changed
            maps[name] = MapDelta(_entries(store, ids), () if base else removed)
        start = 0 if base else self._history_saved
        values = self._values()
        if base or not self._rows_saved:
            values["client_rows"], values["eval_rows"] = self.client_rows, self.evals.rows
        self.chain.save(values, maps, {"history": ListDelta(start, self.history[start:])}, base=base)
        self.clients.clear_changes()
        self.evals.trained.clear_changes()
        self._history_saved, self._rows_saved = len(self.history), True
        self._saved_at = time.perf_counter()
        self._save_cost, self._saved_round = self._saved_at - started, self.round
        self.checkpoint_seconds += self._save_cost

    def resume(self, run_dir: Path) -> bool:
        """Restore the newest readable checkpoint of ``run_dir`` (False when it has none); later
        checkpoints extend its chain."""
        run_dir = Path(run_dir)
        chain = self.chain if self.chain is not None and self.chain.run_dir == run_dir else CheckpointChain(run_dir)
        if self.run_dir is None:
            self.chain = chain  # kept when the run folder is set to run_dir later (see run_dir)
        checkpoint = chain.load()
        if checkpoint is None:
            return False
        self.restore(checkpoint)
        return True

    def restore(self, checkpoint: Checkpoint) -> None:
        """Restore a resolved checkpoint chain, streaming the client states into the store."""
        values = checkpoint.values
        history = checkpoint.list("history")
        self._restore(values, history, checkpoint.map_items("clients"), checkpoint.map_items("trained"))


def _entries(store: ClientStore, ids: list[int]) -> Iterator[tuple[int, Any]]:
    """(id, state) of the given clients, read one at a time (a disk store never loads them all)."""
    for cid in ids:
        yield cid, store.peek(cid)


def comparable_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Metrics that must be identical for the same seed (everything but timings)."""
    return {k: v for k, v in summary["metrics"].items() if not k.startswith(TIMING_PREFIXES)}


__all__ = ["Callback", "FederatedLoop", "clients_per_round", "comparable_metrics", "sample_clients"]
