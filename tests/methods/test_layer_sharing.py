"""Tests of pfl/methods/layer_sharing.py."""

from __future__ import annotations

import pytest
import torch

from pfl.methods.base import ClientContext
from pfl.metrics.evaluate import evaluate_new_clients, score_segments
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import HALF, exchanged_round


def test_layer_counts_are_checked():
    from pfl.errors import ConfigError

    with pytest.raises(ConfigError, match="method.global_layers"):
        make_loop(tiny_config("lgfedavg", {"global_layers": 3}))


@pytest.mark.parametrize("name", ["fedper", "fedrep", "lgfedavg"])
def test_new_client_starts_from_the_shared_part_not_the_untrained_model(name):
    loop = make_loop(tiny_config(name, data={"num_clients": 8, "new_clients": 0.25}, trainer=HALF))
    loop.fit()
    w, method = loop.worker, loop.method
    assert len(w.new_clients) == 2
    tests = {f"c{j}": s.test for j, s in enumerate(w.new_clients)}

    def mean_acc(state):
        scores = score_segments(w, state, tests)
        return sum(scores[k] for k in tests) / len(tests)

    shared = method.compose(loop.server["global"][method.mask(w.flat.layout)], loop.init_state, w.flat.layout)
    got = evaluate_new_clients(method, loop.server, w, loop.round, 0, loop.init_state)["new.acc.mean"]
    assert got == mean_acc(shared)
    assert got != mean_acc(loop.init_state)


@pytest.mark.parametrize("name", ["fedper", "lgfedavg"])
def test_layer_sharing_buffers_follow_the_representation_or_stay_local(bn_model, name):
    layers = {"fedper": {"personal_layers": 1}, "lgfedavg": {"global_layers": 3}}[name]  # body shared / all global
    for share in (True, False):
        loop = make_loop(tiny_config(name, {**layers, "share_buffers": share}, model=bn_model, trainer=HALF))
        layout = loop.worker.flat.layout
        assert layout.num_layers == 3  # linear, batch norm, linear
        mask = loop.method.mask(layout)
        assert bool(mask[layout.num_params :].all()) == share and bool(mask[layout.num_params :].any()) == share
        _, uploads = exchanged_round(loop)
        buffers = slice(layout.num_params, None)
        server_buffers = loop.server["global"][buffers]
        assert torch.equal(server_buffers, loop.init_state[buffers]) != share
        for cid, u in uploads.items():
            assert u.state.numel() == int(mask.sum())
            pm = loop.method.personal_state(loop.server, loop.client(cid))
            expected = server_buffers if share else loop.clients[cid]["personal"][buffers]
            assert torch.equal(pm[buffers], expected)


@pytest.mark.parametrize(("name", "layers"), [("fedbabu", {"head_layers": 1}), ("fedrecon", {"local_layers": 1})])
def test_body_sharing_methods_share_the_buffers_with_the_body(bn_model, name, layers):
    loop = make_loop(tiny_config(name, layers, model=bn_model, trainer=HALF))
    layout = loop.worker.flat.layout
    mask = loop.method.mask(layout)
    assert bool(mask[layout.num_params :].all())  # the statistics belong to the shared representation
    assert not bool(mask[layout.head].any())


def test_layer_sharing_mask_follows_the_layout_it_is_asked_for(bn_model):
    method = make_loop(tiny_config("fedper", {"personal_layers": 1}, trainer=HALF)).method
    plain = make_loop(tiny_config("fedper", {"personal_layers": 1}, trainer=HALF)).worker.flat.layout
    with_bn = make_loop(tiny_config("fedper", {"personal_layers": 1}, model=bn_model, trainer=HALF)).worker.flat.layout
    for layout in (plain, with_bn, plain):
        mask = method.mask(layout)
        assert mask.numel() == layout.num_params + layout.num_buffers
        assert torch.equal(mask, method.shared_mask(layout))
        assert method.mask(layout) is mask  # computed once per layout


def test_layer_sharing_new_client_adapts_for_exactly_the_epochs_asked():
    data = {"num_clients": 8, "new_clients": 0.25}
    loop = make_loop(tiny_config("fedper", {"personal_layers": 1}, data=data))
    loop.run_round()
    ctx = ClientContext(loop.server.num_clients, loop.round, loop.worker, {}, loop.init_state)
    method = loop.method
    start = method.compose(loop.server["global"][method.mask(ctx.layout)], loop.init_state, ctx.layout)
    assert torch.equal(method.adapt_new_client(loop.server, ctx, 0), start)
    one = method.adapt_new_client(loop.server, ctx, 1)
    assert not torch.equal(one, start) and len(ctx.fits) == 1 and ctx.fits[0].samples_seen == ctx.num_samples
