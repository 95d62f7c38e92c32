"""Tests of pfl/methods/ditto.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.methods.helpers import (
    _grads,
    _one_client_loop,
)
from tests.methods.reference import drawn_batches, flat_params, initial_net


@pytest.mark.parametrize("prox", ["exact", "gradient", "autograd"])
def test_ditto_personal_model_matches_a_hand_written_loop(prox):
    lam, lr = 2.0, 0.1
    cfg, loop = _one_client_loop("ditto", {"lam": lam, "prox": prox}, rounds=2, lr=lr)
    net = initial_net(cfg, loop)
    names = [n for n, _ in net.named_parameters()]
    v = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for r in range(2):
        w = {n: p.detach().clone() for n, p in net.named_parameters()}
        for b in drawn_batches(cfg.seed, r, 0, "personal", idx, 16):
            live = {n: t.clone().requires_grad_(True) for n, t in v.items()}
            for n, g in zip(names, _grads(net, live, data.x[b], data.y[b]), strict=True):
                if prox == "exact":  # a gradient step on f, then the exact proximal step of λ/2‖v − w‖²
                    v[n] = (v[n] - lr * g + lr * lam * w[n]) / (1 + lr * lam)
                else:
                    v[n] = v[n] - lr * (g + lam * (v[n] - w[n]))
        for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            opt.step()
    expected = torch.cat([v[n].reshape(-1) for n in names])
    torch.testing.assert_close(loop.clients[0]["personal"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loop.server["global"], flat_params(net), rtol=1e-5, atol=1e-6)
