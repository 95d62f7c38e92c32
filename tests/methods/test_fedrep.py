"""Tests of pfl/methods/fedrep.py."""

from __future__ import annotations

import pytest
import torch

from pfl.methods.base import ClientContext
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    SYNTHETIC,
    _fit,
)


@pytest.mark.parametrize("data", [{}, SYNTHETIC])
def test_fedrep_head_epochs_leave_the_body_untouched(monkeypatch, data):
    calls = []
    original = ClientContext.fit

    def spy(self, start, **kw):
        out = original(self, start, **kw)
        calls.append((kw.get("purpose", "train"), start.clone(), out.clone()))
        return out

    monkeypatch.setattr(ClientContext, "fit", spy)
    loop = make_loop(tiny_config("fedrep", {"head_epochs": 2}, trainer=HALF, data=data))
    loop.run_round()
    head = loop.worker.flat.layout.tail(1)
    body = slice(0, head.start)
    heads = [c for c in calls if c[0] == "head"]
    bodies = [c for c in calls if c[0] == "train"]
    assert heads and len(heads) == len(bodies)
    for (_, s, o), (_, s2, o2) in zip(heads, bodies, strict=True):
        assert torch.equal(o[body], s[body]) and not torch.equal(o[head], s[head])
        assert torch.equal(s2, o) and torch.equal(o2[head], s2[head]) and not torch.equal(o2[body], s2[body])


def test_fedrep_one_head_epoch_trains_the_head_before_the_body():
    a, b = _fit("fedrep", {"head_epochs": 0}), _fit("fedrep", {"head_epochs": 1})
    assert not torch.equal(a.server["global"], b.server["global"])


@pytest.mark.parametrize("head_epochs", [0, 2])
def test_fedrep_fits_the_head_only_when_asked(head_epochs):
    """No empty head fit at head_epochs 0: it would add a 0.0 loss to the round's mean train loss."""
    loop = make_loop(tiny_config("fedrep", {"head_epochs": head_epochs}))
    ctx = loop.client(1)
    loop.method.local_update(ctx, loop.method.payload(loop.server, 1))
    batches = len(list(ctx.batches()))
    assert [f.steps for f in ctx.fits] == [head_epochs * batches] * (head_epochs > 0) + [batches]


def test_fedrep_new_client_learns_its_head_on_the_frozen_body_then_optionally_the_body():
    for adapt_body in (False, True):
        data = {"num_clients": 8, "new_clients": 0.25}
        loop = make_loop(tiny_config("fedrep", {"adapt_body": adapt_body}, data=data))
        loop.run_round()
        n = loop.server.num_clients
        ctx = ClientContext(n, loop.round, loop.worker, {}, loop.init_state)
        head = loop.worker.flat.layout.head
        adapted = loop.method.adapt_new_client(loop.server, ctx, 2)
        assert not torch.equal(adapted[head], loop.init_state[head])
        assert torch.equal(adapted[: head.start], loop.server["global"][: head.start]) != adapt_body
