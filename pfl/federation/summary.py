"""A run's summary: the reported round's metrics, run-level ones, and what was run."""

from __future__ import annotations

from typing import Any

from pfl.engine.trainer import ClientTrainer
from pfl.federation.progress import RunProgress
from pfl.methods.base import Method, ServerContext
from pfl.metrics.evaluate import evaluate_new_clients
from pfl.metrics.session import EvalSession


def run_summary(
    method: Method,
    server: ServerContext,
    worker: ClientTrainer,
    evals: EvalSession,
    progress: RunProgress,
    seed: int,
    metrics: dict[str, Any],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, the reported round's client rows) of a run: the round ``eval.select`` picks
    (``metrics`` when nothing was evaluated), plus run-level metrics: rounds_to_target, and new
    clients adapted from the final server state."""
    rows = progress.client_rows
    if progress.history:
        metrics, rows = evals.select(progress.history)
    run_level = evals.target_round(progress.history)
    if evals.measures("new"):
        new = evaluate_new_clients(
            method, server, worker, progress.round, evals.cfg.new_client_epochs, server.init_state
        )
        run_level.update(new)
    summary = {
        "method": method.name,
        "dataset": worker.data.name,
        "task": worker.task,
        "num_clients": server.num_clients,
        "rounds": progress.round,
        "seed": seed,
        "hparams": method.hparams(),
        "select": evals.cfg.select,
        "pm_source": evals.pm_source(method),
        "selected_round": metrics.get("round", progress.round),
        "metrics": {**{k: v for k, v in metrics.items() if k != "round"}, **run_level},
    }
    if evals.reference is not None:
        summary["reference"] = {k: v for k, v in evals.reference.items() if k != "values"}
    return summary, rows
