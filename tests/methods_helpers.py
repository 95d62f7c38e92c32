"""Helpers shared by the method tests: a round that keeps what was exchanged, small runs, hand gradients,
the BatchNorm model, the method configs and the methods' declared flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pfl.engine.flat import ModelLayout
from pfl.federation.loop import FederatedLoop
from pfl.methods import Upload
from pfl.methods.base import ServerContext
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


HALF = {"fraction": 0.5}


# FedProx's synthetic data: every input feature varies, so the first weight (input feature 0) has a
# gradient; on digits feature 0 is a corner pixel, always 0, and freezing it or not shows nowhere.
SYNTHETIC = {"source": "synthetic", "num_clients": 6}


def _fit(name, args=None, **groups):
    loop = make_loop(tiny_config(name, args, **{"trainer": HALF, **groups}))
    loop.fit()
    return loop


def _one_client_loop(name, args, rounds=1, data=None, **client):
    cfg = tiny_config(
        name,
        args,
        data={"num_clients": 1, "min_samples": 1, **(data or {})},
        client={"epochs": 1, "batch_size": 16, "lr": 0.1, **client},
        trainer={"rounds": rounds},
    )
    loop = make_loop(cfg)
    loop.fit()
    return cfg, loop


def _grads(net, params, x, y):
    loss = F.cross_entropy(functional_call(net, params, (x,)), y)
    return torch.autograd.grad(loss, list(params.values()))


ONE_CLIENT = {"num_clients": 1, "min_samples": 1}


def _one_client(name, args, rounds=1, **client):
    cfg = tiny_config(
        name,
        args,
        data=ONE_CLIENT,
        client={"epochs": 1, "batch_size": 16, "lr": 0.1, **client},
        trainer={"rounds": rounds},
    )
    loop = make_loop(cfg)
    loop.fit()
    return cfg, loop


def _full_grad(loop, cid, state, idx=None):
    """∇f and f of client ``cid`` at ``state`` over its train split (or ``idx``), by plain autograd."""
    flat, data = loop.worker.flat, loop.worker.data
    params = state[: flat.num_params].clone().requires_grad_(True)
    idx = data.clients[cid].train if idx is None else idx
    logits = functional_call(loop.worker.module.net, flat.param_dict(params), (data.x[idx],))
    loss = F.cross_entropy(logits, data.y[idx])
    (grad,) = torch.autograd.grad(loss, params)
    return grad, float(loss.detach())


def bn_mlp(cfg, input_shape, num_classes):
    """An MLP with one BatchNorm layer: 32 float buffers (running mean and variance of 16 features)."""
    width = int(torch.tensor(input_shape).prod())
    return nn.Sequential(nn.Flatten(), nn.Linear(width, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, num_classes))


def _bare_server(p: int = 3) -> ServerContext:
    layout = ModelLayout(p, 0, (("0", slice(0, p)),), torch.device("cpu"))
    return ServerContext(0, 4, 2, layout, torch.zeros(p, dtype=torch.float64))


# The method configs, conf/method/<name>.yaml.
CONF = Path(__file__).resolve().parents[1] / "conf" / "method"


# (has_global_model, has_personal_model): what the evaluation reports for each method (gm.*, P-models).
FLAGS = {"local": (False, True), "fedavg": (True, False), "fedprox": (True, False), "feddyn": (True, False)}
FLAGS |= {n: (False, True) for n in ("fedper", "fedrep", "lgfedavg", "fedfomo")}
FLAGS |= {n: (True, True) for n in ("ditto", "apfl", "fedrod", "pfedme", "perfedavg", "fedbabu", "pgfed", "pgfedmo")}
FLAGS |= {"pgfed_ce": (True, True)}
