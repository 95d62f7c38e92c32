"""Tests of pfl/methods/lgfedavg.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    SYNTHETIC,
    _fit,
    _one_client_loop,
    exchanged_round,
)
from tests.methods.reference import drawn_batches, flat_params, initial_net


def test_lgfedavg_with_all_layers_global_is_fedavg():
    a, b = _fit("fedavg"), _fit("lgfedavg", {"global_layers": 2})  # the tiny MLP has 2 layers
    assert torch.equal(a.server["global"], b.server["global"])
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]


def test_lgfedavg_shares_only_its_global_layers():
    loop = make_loop(tiny_config("lgfedavg", {"global_layers": 1}, trainer=HALF))
    head = loop.worker.flat.layout.head
    for _ in range(2):
        payloads, uploads = exchanged_round(loop)
    for cid, u in uploads.items():
        assert u.state.numel() == head.stop - head.start  # the classifier only
        assert torch.equal(payloads[cid]["shared"], payloads[next(iter(payloads))]["shared"])
    total = sum(u.weight for u in uploads.values())
    mean = sum(u.state * (u.weight / total) for u in uploads.values())
    torch.testing.assert_close(loop.server["global"][head], mean)
    assert torch.equal(loop.server["global"][: head.start], loop.init_state[: head.start])  # never averaged
    bodies = [loop.clients[c]["personal"][: head.start] for c in uploads]
    assert not torch.equal(bodies[0], bodies[1])  # each representation stays with its client
    for cid in uploads:
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        assert torch.equal(pm[head], loop.server["global"][head])
        assert torch.equal(pm[: head.start], loop.clients[cid]["personal"][: head.start])


@pytest.mark.parametrize("data", [{}, SYNTHETIC])
def test_lgfedavg_alternating_steps_match_the_authors_loop(data):
    args = {"global_layers": 1, "alternate": True}
    cfg, loop = _one_client_loop("lgfedavg", args, data={**data, "num_clients": 1}, momentum=0.9)
    net = initial_net(cfg, loop)
    head, body = list(net[-1].parameters()), [p for m in list(net)[:-1] for p in m.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for b in drawn_batches(cfg.seed, 0, 0, "train", idx, 16):
        for frozen in (head, body):
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            for p in frozen:
                p.grad.zero_()  # zeroed, not None: momentum still moves the frozen part
            opt.step()
    torch.testing.assert_close(loop.clients[0]["personal"], flat_params(net), rtol=1e-5, atol=1e-6)
