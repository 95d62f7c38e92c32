"""Tests of pfl/methods/fedavg.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _one_client_loop,
    exchanged_round,
)
from tests.methods.reference import drawn_batches, flat_params, initial_net


def test_fedavg_finetuned_personal_model_is_sgd_from_the_global_model_on_the_finetune_batches():
    lr = 0.1
    cfg, loop = _one_client_loop("fedavg", {"finetune_epochs": 1}, lr=lr)
    net = initial_net(cfg, loop)
    ctx = loop.client(0)
    personal = loop.method.personal_state(loop.server, ctx)
    w = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for r, purpose in ((0, "train"), (ctx.round, "finetune")):
        for b in drawn_batches(cfg.seed, r, 0, purpose, idx, 16):
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            opt.step()
        if purpose == "train":
            w = flat_params(net)
            torch.testing.assert_close(loop.server["global"], w, rtol=1e-5, atol=1e-6)
    assert not torch.equal(personal, w)
    torch.testing.assert_close(personal, flat_params(net), rtol=1e-5, atol=1e-6)


def test_buffers_are_averaged_with_the_parameters(bn_model):
    loop = make_loop(tiny_config("fedavg", model=bn_model, trainer=HALF))
    p, b = loop.worker.flat.num_params, loop.worker.flat.num_buffers
    assert b == 32  # running mean and variance of 16 features
    _, uploads = exchanged_round(loop)
    total = sum(u.weight for u in uploads.values())
    mean = sum(u.state * (u.weight / total) for u in uploads.values())
    torch.testing.assert_close(loop.server["global"], mean)
    assert not torch.equal(loop.server["global"][p:], loop.init_state[p:])


def test_local_buffers_stay_on_each_client(bn_model):
    shared = make_loop(tiny_config("fedavg", model=bn_model, trainer=HALF))
    local = make_loop(tiny_config("fedavg", {"share_buffers": False}, model=bn_model, trainer=HALF))
    p = local.worker.flat.num_params
    _, up_shared = exchanged_round(shared)
    _, up_local = exchanged_round(local)
    for cid, u in up_local.items():
        assert u.state.numel() == p  # parameters only
        torch.testing.assert_close(u.state, up_shared[cid].state[:p])  # same start in round 0
        assert torch.equal(local.clients[cid]["buffers"], up_shared[cid].state[p:])
        pm = local.method.personal_state(local.server, local.client(cid))
        assert torch.equal(pm[:p], local.server["global"][:p]) and torch.equal(pm[p:], local.clients[cid]["buffers"])
    torch.testing.assert_close(local.server["global"][:p], shared.server["global"][:p])
    assert torch.equal(local.server["global"][p:], local.init_state[p:])  # the server never averages them
    # Round 1: a returning client starts from the global parameters and its own statistics.
    cid = next(iter(up_local))
    start = local.method.start(local.client(cid), local.server["global"])
    assert torch.equal(start[p:], local.clients[cid]["buffers"]) and torch.equal(start[:p], local.server["global"][:p])
