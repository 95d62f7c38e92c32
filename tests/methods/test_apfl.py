"""Tests of pfl/methods/apfl.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl.data import DataConfig
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _fit,
    _one_client,
    exchanged_round,
)
from tests.methods.reference import drawn_batches, flat_params, initial_net


def test_apfl_mixing_zero_is_fedavg_on_the_personal_side():
    apfl = make_loop(tiny_config("apfl", {"mix": 0.0}, trainer=HALF))
    fa = make_loop(tiny_config("fedavg", trainer=HALF))
    for _ in range(3):
        _, fa_results = exchanged_round(fa)
        exchanged_round(apfl)
        for cid, r in fa_results.items():
            assert torch.equal(apfl.clients[cid]["personal"], r.state)
    assert torch.equal(apfl.server["global"], fa.server["global"])
    mixed = _fit("apfl", {"mix": 0.5})
    assert torch.equal(mixed.server["global"], fa.server["global"])  # v never feeds back into w
    assert not torch.equal(mixed.clients[next(iter(mixed.clients))]["personal"], fa.server["global"])


def test_apfl_mixing_zero_is_fedavg_on_a_regression_federation():
    """On (B, 1) regression outputs both of APFL's losses compare squeezed outputs with the targets."""
    data = DataConfig(source="synthetic_regression", num_clients=6, val_frac=0.2, test_frac=0.3)
    groups = {"data": data, "model": {"name": "mlp", "hidden": [16]}, "client": {"lr": 0.01}, "trainer": HALF}
    apfl, fa = make_loop(tiny_config("apfl", {"mix": 0.0}, **groups)), make_loop(tiny_config("fedavg", **groups))
    assert apfl.worker.task == "regression"
    _, fa_results = exchanged_round(fa)
    exchanged_round(apfl)
    for cid, r in fa_results.items():
        assert torch.equal(apfl.clients[cid]["personal"], r.state)
    mixed = make_loop(tiny_config("apfl", {"mix": 0.5}, **groups))  # the mixed model's loss: no (B, B) broadcast
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*target size.*")
        exchanged_round(mixed)


@pytest.mark.parametrize(("momentum", "keep"), [(0.0, False), (0.9, False), (0.9, True)])
def test_apfl_personal_model_uses_the_run_optimizer(momentum, keep):
    """Two rounds: v's optimizer, like w's, starts afresh each participation unless momentum is kept."""
    a = 0.3
    cfg, loop = _one_client("apfl", {"mix": a}, rounds=2, momentum=momentum, weight_decay=0.01, keep_momentum=keep)
    net = initial_net(cfg, loop)
    v = [p.detach().clone().requires_grad_(True) for p in net.parameters()]
    names = [n for n, _ in net.named_parameters()]
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for r in range(2):
        if r == 0 or not keep:
            opt_w = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum, weight_decay=0.01)
            opt_v = torch.optim.SGD(v, lr=0.1, momentum=momentum, weight_decay=0.01)
        for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
            x, y = data.x[b], data.y[b]
            mixed = {n: a * vp + (1 - a) * p.detach() for n, vp, p in zip(names, v, net.parameters(), strict=True)}
            opt_w.zero_grad(), opt_v.zero_grad()
            F.cross_entropy(net(x), y).backward()
            F.cross_entropy(functional_call(net, mixed, (x,)), y).backward()
            opt_w.step(), opt_v.step()
    torch.testing.assert_close(loop.server["global"], flat_params(net), rtol=1e-5, atol=1e-6)
    v_flat = torch.cat([p.detach().reshape(-1) for p in v])
    torch.testing.assert_close(loop.clients[0]["v"], v_flat, rtol=1e-5, atol=1e-6)
    assert ("v_momentum" in loop.clients[0]) == (keep and momentum > 0)


def test_apfl_evaluates_every_client_on_the_mixture_with_the_latest_global_model():
    a = 0.25
    loop = make_loop(tiny_config("apfl", {"mix": a}, trainer=HALF))
    first, _ = exchanged_round(loop)
    second, _ = exchanged_round(loop)
    idle = [c for c in first if c not in second]
    assert idle
    p = loop.worker.flat.num_params
    for cid in idle:
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        expected = a * loop.clients[cid]["v"] + (1 - a) * loop.server["global"][:p]
        torch.testing.assert_close(pm[:p], expected)
        assert not torch.allclose(pm, loop.clients[cid]["personal"])  # not the stale local mixture
    never = [c for c in range(6) if c not in loop.clients]
    for cid in never:
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        torch.testing.assert_close(pm[:p], a * loop.init_state[:p] + (1 - a) * loop.server["global"][:p])
    local = make_loop(tiny_config("apfl", {"mix": a, "eval_mix": "local"}, trainer=HALF))
    exchanged_round(local)
    cid = next(iter(local.clients))
    assert local.method.personal_state(local.server, local.client(cid)) is local.clients[cid]["personal"]
