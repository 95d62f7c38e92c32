"""Helpers for method tests: run a round while keeping what was exchanged."""

from __future__ import annotations

from typing import Any

import torch

from pfl.engine.flat import ModelLayout
from pfl.federation.loop import FederatedLoop
from pfl.methods import ClientContext, ServerContext, Upload
from tests.conftest import make_loop, tiny_config


def exchanged_round(loop: FederatedLoop) -> tuple[dict[int, dict], dict[int, dict[str, Any]]]:
    """One round exactly as ``FederatedLoop.run_round`` does it, returning (payloads, results)."""
    sampled = loop.sampled_clients()
    payloads, results = {}, {}
    for cid in sampled.tolist():
        payloads[cid] = {k: v.clone() for k, v in loop.method.payload(loop.server, cid).items()}
        results[cid] = loop.method.local_update(loop.client(cid), payloads[cid])
    loop.method.aggregate(loop.server, results)
    for cid in sampled.tolist():
        if not loop.clients.get(cid):
            loop.clients.pop(cid, None)
    loop.round += 1
    return payloads, results


def tensor_bytes(exchanged: Any) -> int:
    """Bytes of the tensors in a payload dict or an upload (the weight is not sent)."""
    if isinstance(exchanged, Upload):
        return tensor_bytes({"state": exchanged.state, **exchanged.extras})
    return sum(v.numel() * v.element_size() for v in exchanged.values() if isinstance(v, torch.Tensor))


# -- FedPG / FedMGDA+: a bare server over a P-dimensional parameter vector --------------------------
def bare_server(method, p: int, num_clients: int = 8, round_idx: int = 0) -> ServerContext:
    layout = ModelLayout(p, 0, (("0", slice(0, p)),), torch.device("cpu"))
    server = ServerContext(round_idx, num_clients, num_clients, layout, torch.zeros(p, dtype=torch.float64))
    server.state = method.init_server(server)
    return server


# -- FedORA and the baselines of its table (IFCA, FeSEM, FedAMP, FedU) --------------------------------
VAL = {"val_frac": 0.2}


def run(loop, rounds):
    for _ in range(rounds):
        loop.run_round()
    return loop


def personal(loop):
    return torch.stack(
        [loop.method.personal_state(loop.server, loop.client(c)) for c in range(loop.server.num_clients)]
    )


NEW = {"val_frac": 0.2, "num_clients": 8, "new_clients": 0.25}


def new_client_context(loop, j):
    return ClientContext(loop.server.num_clients + j, loop.round, loop.worker, {}, loop.init_state)


# -- SplitGP's routed evaluation ---------------------------------------------------------------------
def _trained(threshold: float | None, **groups):
    loop = make_loop(tiny_config("splitgp", {"entropy_threshold": threshold}, **groups))
    loop.run_round()
    loop.run_round()
    metrics = loop.evaluate()
    return loop, metrics, loop.client_rows
