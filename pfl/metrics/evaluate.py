"""Local-test evaluation: each client's P-model on its own test split, the global model on the
clients' tests and on the server's global test set. Means are unweighted over clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pfl.client import Worker
from pfl.methods.base import ClientContext, Method, State
from pfl.metrics.shared import SharedStates


def mean_std(values: list[float] | np.ndarray) -> tuple[float, float]:
    """Mean and population standard deviation (ddof = 0) over clients."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std())


def evaluate_federation(
    method: Method,
    server: State,
    worker: Worker,
    client: Callable[[int], ClientContext],
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Returns (aggregate metrics, one row per client)."""
    data = worker.data
    global_state = method.global_state(server)
    rows: list[dict[str, Any]] = []
    tests = [c.test for c in data.clients]
    shared: SharedStates | None = None
    for cid in range(data.num_clients):
        ctx = client(cid)
        test = data.clients[cid].test
        # The global model and the common init are shared by many clients: one batched pass each.
        shared = shared or SharedStates(worker, tests, [global_state, ctx.init_state])
        pm = shared.stats(method.personal_state(server, ctx), cid)
        row = {
            "client": cid,
            "n_train": len(data.clients[cid].train),
            "n_test": len(test),
            "pm.l_acc": pm.acc,
            "pm.l_loss": pm.loss,
        }
        if global_state is not None:
            gm = shared.stats(global_state, cid)
            row["gm.l_acc"], row["gm.l_loss"] = gm.acc, gm.loss
        rows.append(row)
    metrics: dict[str, float] = {}
    for key in ("pm.l_acc", "pm.l_loss", "gm.l_acc", "gm.l_loss"):
        if key in rows[0]:
            metrics[f"{key}.mean"], metrics[f"{key}.std"] = mean_std([r[key] for r in rows])
    if global_state is not None and len(data.global_test):
        gm = worker.evaluate(global_state, data.global_test)
        metrics["gm.acc"], metrics["gm.loss"] = gm.acc, gm.loss
    return metrics, rows
