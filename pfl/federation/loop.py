"""FederatedLoop: rounds, seeded client sampling, dispatch, aggregation, evaluation, checkpoints.

The loop owns the round; the method supplies the local update and the server hooks, a server
optimizer steps the global model, and callbacks write the outputs. Lightning Fabric supplies the
device, precision and loggers. Per-client state lives in a dict of tensors (the client store),
never as one live model per client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from tqdm.auto import tqdm

from pfl.config import RunConfig
from pfl.data.federated import FederatedData
from pfl.engine.flat import FlatModule
from pfl.engine.worker import TrainSettings, Worker
from pfl.federation.checkpoint import load_checkpoint, save_checkpoint
from pfl.federation.distributed import Cohort
from pfl.federation.server_opt import ServerOptimizer
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.metrics.evaluate import evaluate_new_clients
from pfl.metrics.session import EvalSession
from pfl.models import build_model
from pfl.seeding import numpy_rng, seed_everything

TIMING_PREFIXES = ("throughput.", "time.")  # metrics that measure the machine, not the method


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
        self.run_dir = run_dir  # checkpoints go here (None: no checkpoints)
        self.fabric = fabric
        self.callbacks = list(callbacks)
        seed_everything(cfg.seed, "init")
        net = build_model(cfg.model, data.input_shape, data.num_classes)
        c = cfg.client
        settings = TrainSettings(c.epochs, c.batch_size, c.lr, c.momentum, c.weight_decay)
        self.worker = Worker(net, data, settings, cfg.seed, fabric, cfg.eval.batch_size)
        self.init_state = self.worker.snapshot()
        n = self.worker.data.num_clients
        self.server = ServerContext(
            0, n, clients_per_round(cfg, n), self.worker.flat.layout, self.init_state, seed=cfg.seed
        )
        self.server.state = self.method.init_server(self.server)
        self.server_optimizer = ServerOptimizer(cfg.server)
        self.clients: dict[int, State] = {}
        self.round = 0  # rounds completed
        self.history: list[dict[str, Any]] = []
        self.client_rows: list[dict[str, Any]] = []
        self.selected_rows: list[dict[str, Any]] = []  # client rows of the reported round
        self.evals = EvalSession(cfg.eval, self.worker, cfg.seed)
        self.train_samples = 0
        self.train_seconds = 0.0
        self.checkpoint_seconds = 0.0
        self.cohort = Cohort.from_fabric(fabric)
        self._sizes = data.sizes("train")

    @property
    def flat(self) -> FlatModule:
        return self.worker.flat

    def client(self, cid: int) -> ClientContext:
        state = self.clients.setdefault(cid, {})
        return ClientContext(cid, self.round, self.worker, state, self.init_state)

    def sampled_clients(self) -> np.ndarray:
        return sample_clients(self.cfg.seed, self.round, self.server.num_clients, self.server.clients_per_round)

    # -- one round --------------------------------------------------------------------------------
    def run_round(self) -> None:
        self.server.round = self.round
        sampled = self.sampled_clients().tolist()
        # Payloads are a function of the server state, which every rank holds: each rank knows what
        # every sampled client received, so byte counts agree without a second exchange.
        payloads = {cid: self.method.payload(self.server, cid) for cid in sampled}
        uploads: dict[int, Upload] = {}
        fits = []
        mine = self.cohort.share(sampled, self._sizes)
        for cid in mine:
            ctx = self.client(cid)
            uploads[cid] = self.method.local_update(ctx, payloads[cid])
            fits += ctx.fits
        if self.cohort.world_size > 1:
            # Every rank aggregates the full, id-sorted upload dict and stores every client's new state.
            states = {cid: self.clients.get(cid, {}) for cid in mine}
            uploads, states, fits = self.cohort.exchange(uploads, states, fits, self.worker.device)
            self.clients.update(states)
        for cid in sampled:
            self.evals.observe(cid, payloads[cid], uploads[cid])  # bytes exchanged (+ trained model if kept)
        self.train_samples += sum(f.samples_seen for f in fits)
        self.train_seconds += sum(f.seconds for f in fits)
        self.aggregate(uploads)
        # Drop empty entries so FedAvg-like methods keep no per-client memory.
        for cid in sampled:
            if not self.clients.get(cid):
                self.clients.pop(cid, None)
        self.round += 1

    def aggregate(self, uploads: dict[int, Upload]) -> None:
        """The method's aggregation, then the server optimizer's step on the global model."""
        step = self.method.has_global_model and not self.server_optimizer.is_identity
        previous = self.server["global"].clone() if step else None
        self.method.aggregate(self.server, uploads)
        if previous is not None:
            self.server_optimizer.step(self.server.state, previous, self.server.layout)

    @property
    def own_key(self) -> str:
        """Per-client key of the P-model's own-test score (pm.l_acc, or pm.mae for regression)."""
        return self.evals.own_key

    def evaluate(self) -> dict[str, float]:
        metrics, rows = self.evals.evaluate(self.method, self.server, self.client, self.round)
        for cid in range(self.server.num_clients):
            if not self.clients.get(cid):
                self.clients.pop(cid, None)
        metrics["throughput.samples_per_s"] = self.train_samples / max(self.train_seconds, 1e-9)
        self.client_rows = rows
        return metrics

    # -- the whole run ----------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        t = self.cfg.trainer
        bar = tqdm(
            total=t.rounds,
            initial=self.round,
            desc=self.method.name,
            disable=not (t.progress and self.cohort.is_zero),
            dynamic_ncols=True,
        )
        self.evals.check()
        for cb in self.callbacks:
            cb.on_fit_start(self)
        metrics = self.history[-1] if self.history else {}
        while self.round < t.rounds:
            self.run_round()
            bar.update(1)
            last = self.round == t.rounds
            if self.round % t.eval_every == 0 or last:
                metrics = {"round": self.round, **self.evaluate()}
                self.history.append(metrics)
                shown = {k: metrics[k] for k in ("pm.l_acc.mean", "gm.acc") if k in metrics}
                bar.set_postfix({k: f"{v:.4f}" for k, v in shown.items()})
                for cb in self.callbacks:
                    cb.on_evaluation(self, metrics)
            if self.run_dir is not None and (self.round % t.checkpoint_every == 0 or last):
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
        return {
            "round": self.round,
            "server": self.server.state,
            "clients": self.clients,
            "history": self.history,
            "client_rows": self.client_rows,
            "train_samples": self.train_samples,
            "train_seconds": self.train_seconds,
            "evals": self.evals.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.worker.device
        self.round = state["round"]
        self.server.round = self.round
        self.server.state = {k: v.to(device) for k, v in state["server"].items()}
        self.clients = {cid: {k: v.to(device) for k, v in s.items()} for cid, s in state["clients"].items()}
        self.history = state["history"]
        self.client_rows = state["client_rows"]
        self.train_samples = state["train_samples"]
        self.train_seconds = state["train_seconds"]
        if "evals" in state:
            self.evals.load_state_dict(state["evals"], device)

    def save(self) -> None:
        assert self.run_dir is not None
        started = time.perf_counter()
        save_checkpoint(self.run_dir, self.state_dict())
        self.checkpoint_seconds += time.perf_counter() - started

    def resume(self, run_dir: Path) -> bool:
        state = load_checkpoint(run_dir)
        if state is None:
            return False
        self.load_state_dict(state)
        return True


def comparable_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Metrics that must be identical for the same seed (everything but timings)."""
    return {k: v for k, v in summary["metrics"].items() if not k.startswith(TIMING_PREFIXES)}


__all__ = ["Callback", "FederatedLoop", "clients_per_round", "comparable_metrics", "sample_clients"]
