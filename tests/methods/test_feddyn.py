"""Tests of pfl/methods/feddyn.py."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _fit,
    _grads,
    exchanged_round,
)
from tests.methods.reference import drawn_batches, initial_net


def test_feddyn_alpha_zero_is_fedavg():
    a, b = _fit("fedavg"), _fit("feddyn", {"alpha": 0.0, "weighting": "samples"})
    assert torch.equal(a.server["global"], b.server["global"])
    assert not any("g" in state for state in b.clients.values())  # nothing to keep per client


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_feddyn_server_and_client_updates_match_the_formulas(weighting):
    alpha = 0.1
    args = {"alpha": alpha} if weighting == "uniform" else {"alpha": alpha, "weighting": weighting}  # default: uniform
    loop = make_loop(tiny_config("feddyn", args, trainer=HALF))
    w0 = loop.server["global"].clone()
    _, results = exchanged_round(loop)
    n = loop.worker.data.num_clients
    weights = {c: (r.weight if weighting == "samples" else 1.0) for c, r in results.items()}
    assert len(set(weights.values())) > 1 or weighting == "uniform"
    total = sum(weights.values())
    mean = sum(r.state * (weights[c] / total) for c, r in results.items())
    h = -(alpha / n) * sum(r.state - w0 for r in results.values())
    torch.testing.assert_close(loop.server["h"], h)
    torch.testing.assert_close(loop.server["global"], mean - h / alpha)
    for cid, r in results.items():
        torch.testing.assert_close(loop.clients[cid]["g"], -alpha * (r.state - w0))


def _sgd_from(net, start, batches, data, lr, extra):
    """Plain SGD from the flat parameters ``start`` over ``batches``, adding ``extra(θ)`` to every gradient."""
    sizes = [p.numel() for p in net.parameters()]
    theta = start.clone()
    for b in batches:
        params = {k: t.view_as(p) for (k, p), t in zip(net.named_parameters(), theta.split(sizes), strict=True)}
        live = {k: t.clone().requires_grad_(True) for k, t in params.items()}
        grad = torch.cat([g.reshape(-1) for g in _grads(net, live, data.x[b], data.y[b])])
        theta = theta - lr * (grad + extra(theta))
    return theta


def test_feddyn_local_objective_is_the_dynamic_regulariser_over_rounds():
    """θ_i minimises f_i(θ) − ⟨g_i, θ⟩ + α/2‖θ − w‖²; from round 2 on g_i ≠ 0, so its sign shows."""
    alpha, lr = 0.1, 0.1
    cfg = tiny_config("feddyn", {"alpha": alpha}, trainer=HALF, client={"lr": lr})
    loop = make_loop(cfg)
    net = initial_net(cfg, loop)
    data = loop.worker.data
    seen_g = 0
    for r in range(3):
        g_before = {cid: loop.clients.get(cid, {}).get("g") for cid in range(data.num_clients)}
        payloads, results = exchanged_round(loop)
        for cid, up in results.items():
            w = payloads[cid]["global"]
            g = g_before[cid] if g_before[cid] is not None else torch.zeros_like(w)
            seen_g += bool(g.abs().sum() > 0)
            batches = drawn_batches(cfg.seed, r, cid, "train", data.clients[cid].train, 16)
            theta = _sgd_from(net, w, batches, data, lr, lambda t, g=g, w=w: -g + alpha * (t - w))
            torch.testing.assert_close(up.state, theta, rtol=1e-5, atol=1e-6)
    assert seen_g > 0
