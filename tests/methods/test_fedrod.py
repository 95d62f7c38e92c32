"""Tests of pfl/methods/fedrod.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pfl.methods.heads import split_head
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _one_client,
)
from tests.methods.reference import drawn_batches, flat_params, initial_net


def test_fedrod_personal_model_adds_the_personal_head_and_the_generic_model_ignores_it():
    loop = make_loop(tiny_config("fedrod", trainer=HALF))
    loop.run_round()
    cid = next(iter(loop.clients))
    ctx = loop.client(cid)
    flat, data = loop.worker.flat, loop.worker.data
    x = data.x[data.clients[cid].test]
    net = loop.worker.module.net
    body, head = split_head(net)
    flat.load(loop.server["global"])
    with torch.no_grad():
        z = body(x)
        ph = ctx.state["head"]
        w, b = ph[: head.weight.numel()].view_as(head.weight), ph[head.weight.numel() :]
        expected = head(z) + F.linear(z, w, b)
        flat.load(loop.method.personal_state(loop.server, ctx))
        torch.testing.assert_close(net(x), expected, rtol=1e-5, atol=1e-5)
    assert float(ph.abs().sum()) > 0
    # The generic model is trained by balanced softmax alone: the personal head does not feed back.
    again = make_loop(tiny_config("fedrod", trainer=HALF))
    ctx0 = again.client(cid)
    ctx0.state["head"] = torch.randn_like(ph)
    r1 = again.method.local_update(ctx0, again.method.payload(again.server, cid))
    ctx1 = again.client(cid)
    ctx1.state.clear()
    r2 = again.method.local_update(ctx1, again.method.payload(again.server, cid))
    assert torch.equal(r1.state, r2.state)


@pytest.mark.parametrize(
    ("momentum", "head_init", "keep"),
    [(0.0, "zero", False), (0.9, "zero", False), (0.9, "init", False), (0.9, "zero", True)],
)
def test_fedrod_personal_head_uses_the_run_optimizer_and_its_init(momentum, head_init, keep):
    """Two rounds: the head's optimizer, like the model's, starts afresh each participation unless kept."""
    cfg, loop = _one_client("fedrod", {"head_init": head_init}, rounds=2, momentum=momentum, keep_momentum=keep)
    net = initial_net(cfg, loop)
    body, head = split_head(net)
    ph = nn.Linear(head.in_features, head.out_features)
    with torch.no_grad():
        for q, h in zip(ph.parameters(), head.parameters(), strict=True):
            q.copy_(h if head_init == "init" else torch.zeros_like(h))
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    log_prior = torch.bincount(data.y[idx], minlength=data.num_classes).float().clamp_min(1e-8).log()
    for r in range(2):
        if r == 0 or not keep:
            opt_g = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
            opt_p = torch.optim.SGD(ph.parameters(), lr=0.1, momentum=momentum)
        for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
            x, y = data.x[b], data.y[b]
            z = body(x)
            out_g = head(z)
            opt_g.zero_grad(), opt_p.zero_grad()
            (F.cross_entropy(out_g + log_prior, y) + F.cross_entropy(out_g.detach() + ph(z.detach()), y)).backward()
            opt_g.step(), opt_p.step()
    torch.testing.assert_close(loop.server["global"], flat_params(net), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loop.clients[0]["head"], flat_params(ph), rtol=1e-5, atol=1e-6)
    assert ("head_momentum" in loop.clients[0]) == (keep and momentum > 0)


def test_fedrod_untrained_client_is_evaluated_with_its_initial_head():
    for head_init in ("zero", "init"):
        loop = make_loop(tiny_config("fedrod", {"head_init": head_init}))
        head = loop.worker.flat.layout.head
        pm = loop.method.personal_state(loop.server, loop.client(0))
        expected = loop.init_state[head] * (2 if head_init == "init" else 1)
        torch.testing.assert_close(pm[head], expected)
