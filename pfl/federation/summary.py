"""A run's summary: the reported round's metrics, run-level ones, and what was run."""

from __future__ import annotations

from typing import Any

from pfl.metrics.evaluate import evaluate_new_clients


def run_summary(loop: Any, metrics: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, the reported round's client rows) of a ``FederatedLoop`` (not imported: the loop
    imports this module): the round ``eval.select`` picks (``metrics``
    when nothing was evaluated), plus run-level metrics: rounds_to_target, and new clients adapted
    from the final server state."""
    evals = loop.evals
    rows = loop.client_rows
    if loop.history:
        metrics, rows = evals.select(loop.history)
    run_level = evals.target_round(loop.history)
    if evals.measures("new"):
        new = evaluate_new_clients(
            loop.method, loop.server, loop.worker, loop.round, evals.cfg.new_client_epochs, loop.init_state
        )
        run_level.update(new)
    summary = {
        "method": loop.method.name,
        "dataset": loop.worker.data.name,
        "task": loop.worker.task,
        "num_clients": loop.server.num_clients,
        "rounds": loop.round,
        "seed": loop.schedule.seed,
        "hparams": loop.method.hparams(),
        "select": evals.cfg.select,
        "pm_source": evals.pm_source(loop.method),
        "selected_round": metrics.get("round", loop.round),
        "metrics": {**{k: v for k, v in metrics.items() if k != "round"}, **run_level},
    }
    if evals.reference is not None:
        summary["reference"] = {k: v for k, v in evals.reference.items() if k != "values"}
    return summary, rows
