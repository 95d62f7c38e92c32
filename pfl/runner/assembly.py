"""Assemble a run's loop from a validated RunConfig: model, worker, server, stores, evaluation, attack,
dispatcher and checkpointer, each built once and handed to ``FederatedLoop``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch

from pfl.config import RunConfig
from pfl.data.federated import FederatedData
from pfl.engine.worker import Worker
from pfl.federation.attacks import Attack
from pfl.federation.checkpoint import Checkpointer
from pfl.federation.dispatch import make_dispatcher, vectorize_problems
from pfl.federation.distributed import Cohort
from pfl.federation.loop import Callback, FederatedLoop, Schedule
from pfl.federation.robust import Aggregator
from pfl.federation.server_opt import ServerOptimizer
from pfl.federation.store import make_store
from pfl.methods.base import ServerContext, train_settings
from pfl.metrics.session import EvalSession
from pfl.models import build_model
from pfl.runner.compile_report import CompileReport
from pfl.runner.training_path import announce, choose_path
from pfl.seeding import seed_everything


def clients_per_round(cfg: RunConfig, num_clients: int) -> int:
    """Clients sampled per round out of the ``num_clients`` that train (held-out new clients excluded)."""
    if cfg.trainer.clients_per_round is not None:
        return min(cfg.trainer.clients_per_round, num_clients)
    return max(1, int(round(cfg.trainer.fraction * num_clients)))


def build_loop(
    cfg: RunConfig,
    data: FederatedData,
    run_dir: Path | None = None,
    fabric: L.Fabric | None = None,
    callbacks: Sequence[Callback] = (),
    announce_path: bool = True,
) -> FederatedLoop:
    """The loop of a run, its parts built from ``cfg``: the model and worker, the server's context,
    aggregator and optimizer, the client stores, the evaluation session, the attack and the dispatcher.
    ``announce_path``: rank 0 logs which way the clients train and why (off for a run's LOCAL reference)."""
    method, t = cfg.method, cfg.trainer
    seed_everything(cfg.seed, "init")
    net = build_model(cfg.model, data.input_shape, data.num_classes)
    settings = train_settings(cfg.client, method, cfg.data.augment)  # client.*, with the method's overrides
    worker = Worker(net, data, settings, cfg.seed, fabric, cfg.eval.batch_size)
    init_state = worker.snapshot()
    n = data.num_clients
    server = ServerContext(0, n, clients_per_round(cfg, n), worker.flat.layout, init_state)
    server.seed = cfg.seed
    aggregator = Aggregator.build(cfg.server, method, server.clients_per_round)  # refused before any training
    if len(data.global_test):
        server.evaluator = lambda state: worker.evaluate(state, data.global_test)
    val = torch.cat([worker.split(c).val for c in range(n)])
    if len(val):  # the clients' validation splits, for server-side choices that must not see a test set
        server.val_evaluator = lambda state: worker.evaluate(state, val)
    # What a client answers when the server asks for its train loss at a candidate model (S-FedPG).
    server.client_loss = lambda cid, state: worker.evaluate(state, worker.split(cid).train).loss
    server.state = method.init_server(server)
    cohort = Cohort.from_fabric(fabric)
    # A disk store spills into the run directory (its own disk), else into a temporary folder.
    spill = None if run_dir is None else Path(run_dir) / "client_store" / f"rank{cohort.rank}"
    clients = make_store(t.client_store, t.store_budget_mb, worker.device, spill and spill / "clients")
    trained = make_store(t.client_store, t.store_budget_mb, worker.device, spill and spill / "trained")
    several = cohort.world_size > 1
    evals = EvalSession(
        cfg.eval,
        worker,
        cfg.seed,
        trained=trained,
        share=cohort.share if several else None,
        gather=cohort.gather_objects if several else None,
        rank=cohort.rank,
    )
    attack = Attack.build(cfg.attack, cfg.seed, n, method, worker.flat.layout)
    if attack is not None:
        evals.malicious = attack.malicious  # honest.* metrics leave these clients out
    if t.compile:  # the forward of every fit and evaluation; the vectorized step as well
        worker.module.net = torch.compile(worker.module.net, dynamic=True)
        worker.compile_clock.first_forward(worker.module.net)
        if announce_path and cohort.is_zero:
            callbacks = [*callbacks, CompileReport()]
    problems = [] if t.vectorize is False else vectorize_problems(method, worker, t.precision)
    path = choose_path(t.vectorize, problems, worker.device.type, method.name)
    if announce_path and cohort.is_zero and path.said:
        announce(path.line)
    dispatcher = make_dispatcher(
        worker, clients, init_state, cohort=cohort, sizes=data.sizes("train"),
        vectorize=path.vectorize, trained=trained, compile=t.compile,
    )  # fmt: skip
    return FederatedLoop(
        method=method,
        worker=worker,
        server=server,
        server_optimizer=ServerOptimizer(cfg.server),
        clients=clients,
        evals=evals,
        dispatcher=dispatcher,
        schedule=Schedule(t.rounds, t.eval_every, cfg.seed, t.progress),
        checkpointer=Checkpointer(t.checkpoint_every, run_dir),
        transforms=[x for x in (attack, aggregator) if x is not None],  # the attack first: clients send it
        callbacks=callbacks,
        show_progress=cohort.is_zero,
    )


__all__ = ["build_loop", "clients_per_round"]
