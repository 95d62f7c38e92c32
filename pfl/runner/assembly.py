"""Assemble a run's loop from its plan (``pfl.runner.plan``): model, worker, server, stores, evaluation,
attack, dispatcher and checkpointer, each built once and handed to ``FederatedLoop`` complete."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch

from pfl.engine.trainer import ClientTrainer
from pfl.federation.attacks import Attack
from pfl.federation.checkpoint import Checkpointer, RunState
from pfl.federation.dispatch import make_dispatcher, vectorize_problems
from pfl.federation.distributed import Cohort
from pfl.federation.loop import Callback, Checkpointing, FederatedLoop, ProgressBar, Schedule
from pfl.federation.progress import RunProgress
from pfl.federation.server_opt import ServerOptimizer
from pfl.federation.store import make_store
from pfl.methods.base import ServerContext
from pfl.metrics.session import EvalSession
from pfl.models import build_checked_model, redrawn_params
from pfl.runner.compile_report import CompileReport
from pfl.runner.lockstep_report import LockstepReport
from pfl.runner.plan import RunPlan
from pfl.runner.training_path import announce, choose_path, graphs_clause, use_graphs
from pfl.seeding import seed_everything


def build_loop(
    plan: RunPlan,
    fabric: L.Fabric | None = None,
    run_dir: Path | None = None,
    callbacks: Sequence[Callback] = (),
    reference: dict[str, Any] | None = None,
    spill_dir: Path | None = None,
    announce_path: bool = True,
    cohort: Cohort | None = None,
) -> FederatedLoop:
    """The loop of ``plan``, its parts built once: the model and worker, the server's context and
    optimizer, the client stores, the evaluation session (``reference``: the LOCAL reference), the
    attack and the dispatcher; a resume's checkpoint restored into them. ``run_dir``: where
    checkpoints go (None: nowhere); ``spill_dir``: where a disk store spills (None: a temporary
    folder). ``announce_path``: rank 0 logs which way the
    clients train and why (off for a run's LOCAL reference). ``cohort``: the processes that share the
    round's clients (None: Fabric's). The loop is complete when returned."""
    cfg, data = plan.cfg, plan.data
    method, t = cfg.method, cfg.trainer
    seed_everything(cfg.seed, "init")
    net = build_checked_model(cfg.model, data.input_shape, data.num_classes)  # checked by validate(cfg)
    worker = ClientTrainer(net, data, plan.settings, cfg.seed, fabric, cfg.eval.batch_size)
    init_state = worker.snapshot()
    n = data.num_clients
    val = torch.cat([worker.split(c).val for c in range(n)])
    server = ServerContext(
        0,
        n,
        plan.clients_per_round,
        worker.flat.layout,
        init_state,
        seed=cfg.seed,
        evaluator=(lambda state: worker.evaluate(state, data.global_test)) if len(data.global_test) else None,
        # The clients' validation splits, for server-side choices that must not see a test set.
        val_evaluator=(lambda state: worker.evaluate(state, val)) if len(val) else None,
        # What a client answers when the server asks for its train loss at a candidate model (S-FedPG).
        client_loss=lambda cid, state: worker.evaluate(state, worker.split(cid).train).loss,
        # Another initialisation of the network (IFCA's and FeSEM's cluster starts).
        draw_params=partial(redrawn_params, cfg.model, data.input_shape, data.num_classes),
        # The clients' learning rate of a round (client.lr, client.lr_decay): a setting the server knows.
        client_lr_at=lambda round_idx: worker.settings.lr_at(round_idx),
    )
    server.state = method.init_server(server)  # the server's running state, which every round updates
    cohort = Cohort.from_fabric(fabric) if cohort is None else cohort
    spill = None if spill_dir is None else Path(spill_dir) / "client_store" / f"rank{cohort.rank}"
    clients = make_store(t.client_store, t.store_budget_mb, worker.device, spill and spill / "clients")
    trained = make_store(t.client_store, t.store_budget_mb, worker.device, spill and spill / "trained")
    several = cohort.world_size > 1
    attack = Attack.build(cfg.attack, cfg.seed, n, method, worker.flat.layout)
    evals = EvalSession(
        cfg.eval,
        worker,
        cfg.seed,
        trained=trained,
        share=cohort.share if several else None,
        gather=cohort.gather_objects if several else None,
        rank=cohort.rank,
        reference=reference,
        malicious=frozenset() if attack is None else attack.malicious,  # honest.* metrics leave these clients out
    )
    if t.compile:  # the forward of every fit and evaluation; the vectorized step as well
        worker.module.net = torch.compile(worker.module.net, dynamic=True)
        worker.compile_clock.first_forward(worker.module.net)
        if announce_path and cohort.is_zero:
            callbacks = [*callbacks, CompileReport()]
    # trainer.vectorize true was refused by plan_run when anything stands in its way; auto chooses here.
    problems = vectorize_problems(method, worker, t.precision) if t.vectorize == "auto" else []
    path = choose_path(t.vectorize, problems, worker.device.type, method.name)
    graphs = graphs_clause(t.cuda_graphs, t.compile, path.vectorize, worker.device.type)
    if announce_path and cohort.is_zero and (path.said or graphs):
        announce(path.line + graphs)
    if announce_path and cohort.is_zero and path.vectorize:  # a fit's terms show only as it runs
        callbacks = [*callbacks, LockstepReport()]
    dispatcher = make_dispatcher(
        worker, clients, init_state, cohort=cohort, sizes=data.sizes("train"),
        vectorize=path.vectorize, trained=trained, compile=t.compile, graphs=use_graphs(t.cuda_graphs, t.compile),
    )  # fmt: skip
    progress = RunProgress()
    resume = plan.resume
    checkpointer = Checkpointer(
        t.checkpoint_every,
        run_dir,
        settings=plan.recorded,
        chain=None if resume is None else resume.chain,
        state=RunState(progress, server, clients, evals, worker.device),
    )
    if resume is not None and resume.checkpoint is not None:
        checkpointer.restore(resume.checkpoint)  # the round, history, server, stores and counters it holds
    if run_dir is not None and t.checkpoint_every > 0:  # 0: the run writes no checkpoint
        callbacks = [*callbacks, Checkpointing(checkpointer)]
    if t.progress and cohort.is_zero:  # last: started after the others (W&B takes seconds)
        callbacks = [*callbacks, ProgressBar()]
    return FederatedLoop(
        method=method,
        worker=worker,
        server=server,
        server_optimizer=ServerOptimizer(cfg.server),
        clients=clients,
        evals=evals,
        dispatcher=dispatcher,
        schedule=Schedule(t.rounds, t.eval_every, cfg.seed),
        checkpointer=checkpointer,
        transforms=[x for x in (attack, plan.robust_rule) if x is not None],  # the attack first: clients send it
        progress=progress,
        callbacks=callbacks,
    )


__all__ = ["build_loop"]
