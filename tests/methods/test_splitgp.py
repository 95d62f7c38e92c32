"""Tests of pfl/methods/splitgp.py."""

from __future__ import annotations

import math

import pytest
import torch

from pfl.engine.flat import ModelLayout
from pfl.errors import ConfigError
from pfl.methods.splitgp import SplitGP
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import _trained, exchanged_round


def test_splitgp_cut_counts_parametrised_layers():
    from pfl.methods.splitgp import split_sequential
    from pfl.models import ModelConfig, build_model

    mlp = build_model(ModelConfig(name="mlp", hidden=[16, 8]), (64,), 10)
    client, server = split_sequential(mlp, 2)
    assert [type(m).__name__ for m in client] == ["Flatten", "Linear", "ReLU", "Linear", "ReLU"]
    assert [type(m).__name__ for m in server] == ["Linear"]
    cnn = build_model(ModelConfig(name="cnn", channels=[4, 8], fc=16), (1, 12, 12), 10)
    client, server = split_sequential(cnn, 2)
    assert type(client[-1]).__name__ == "Flatten" and [type(m).__name__ for m in server] == ["Linear", "ReLU", "Linear"]
    with pytest.raises(ConfigError, match="client_layers"):
        split_sequential(mlp, 3)


def test_splitgp_personal_model_is_the_client_side_model_and_lambda_extremes():
    loop = make_loop(tiny_config("splitgp", {"lam": 1.0}))
    tail = loop.method.head_slice(loop.server.layout)
    payloads, results = exchanged_round(loop)
    for cid, r in results.items():
        w = payloads[cid]["global"]
        torch.testing.assert_close(r.state[tail], w[tail], rtol=0, atol=0)  # λ = 1: θ gets no gradient
        personal = loop.clients[cid]["personal"]
        assert torch.equal(personal[: tail.start], r.state[: tail.start])  # φ_i
        assert torch.equal(personal[tail], loop.clients[cid]["head"])  # κ_i
        assert not torch.equal(personal[tail], w[tail])  # the head did train
    # λ = 0: only the server-side output counts, so local training is FedAvg's
    sg, fa = make_loop(tiny_config("splitgp", {"lam": 0.0})), make_loop(tiny_config("fedavg"))
    _, sg_results = exchanged_round(sg)
    _, fa_results = exchanged_round(fa)
    for cid in fa_results:
        torch.testing.assert_close(sg_results[cid].state, fa_results[cid].state, rtol=1e-5, atol=1e-6)


def test_splitgp_local_loss_is_lambda_weighted_between_the_personal_and_the_global_model():
    # L = λ·CE(personal model) + (1 − λ)·CE(global model) at an interior λ, from the two whole networks.
    lam = 0.3
    loop = make_loop(tiny_config("splitgp", {"lam": lam}))
    cid = next(iter(loop.clients)) if loop.clients else 0
    ctx, captured = loop.client(cid), {}
    fit = ctx.fit
    ctx.fit = lambda start, **kw: (captured.update(kw), fit(start, **kw))[1]
    loop.method.local_update(ctx, loop.method.payload(loop.server, cid))
    worker, tail = loop.worker, loop.method.head_slice(loop.server.layout)
    b = worker.data.clients[cid].train[:16]
    x, y = worker.data.x[b], worker.data.y[b]
    glob = loop.server["global"]
    personal = glob.clone()
    personal[tail] = ctx.state["head"]
    net = worker.module.net
    with torch.no_grad():
        worker.flat.load(personal)
        own = torch.nn.functional.cross_entropy(net(x), y)
        worker.flat.load(glob)
        shared = torch.nn.functional.cross_entropy(net(x), y)
        got = captured["loss_fn"](net, x, y)
    torch.testing.assert_close(got, lam * own + (1 - lam) * shared, rtol=1e-5, atol=1e-6)
    assert abs(float(own - shared)) > 1e-4  # the two terms differ, so the weighting is visible


# -- the inference rule: the entropy threshold and the full model (scores: tests/metrics/test_routing.py) --
def test_entropy_threshold_is_checked():
    assert SplitGP(entropy_threshold=0.0).entropy_threshold == 0.0
    assert SplitGP(entropy_threshold=None).entropy_threshold is None
    for bad in (-0.01, math.inf, math.nan):
        with pytest.raises(ConfigError, match="method.entropy_threshold"):
            SplitGP(entropy_threshold=bad)


def test_full_model_routes_the_clients_features_through_the_servers_part():
    loop, _, _ = _trained(0.5)
    tail = loop.method.head_slice(loop.server.layout)
    for cid in range(loop.worker.data.num_clients):
        ctx = loop.peek_client(cid)
        client_side, full, threshold = loop.method.routing(loop.server, ctx)
        assert threshold == 0.5
        assert torch.equal(client_side, loop.method.personal_state(loop.server, ctx))
        assert torch.equal(full[: tail.start], client_side[: tail.start])  # φ_i
        assert torch.equal(full[tail], loop.server["global"][tail])  # the server's θ
    assert SplitGP(entropy_threshold=None).routing(loop.server, loop.peek_client(0)) is None


# -- mutation-testing survivors: splitgp --
def _layout_of(num_layers: int) -> ModelLayout:
    return ModelLayout(
        2 * num_layers, 0, tuple((str(i), slice(2 * i, 2 * i + 2)) for i in range(num_layers)), torch.device("cpu")
    )


def test_splitgp_hyperparameters_and_the_cut_are_checked_at_their_bounds():
    from pfl.methods.splitgp import SplitGP

    for field, ok, bad in (("lam", 0.0, -0.01), ("lam", 1.0, 1.01), ("client_layers", 1, 0), ("head_lr", 0.5, 0.0)):
        assert getattr(SplitGP(**{field: ok}), field) == ok
        with pytest.raises(ConfigError, match=f"method.{field}"):
            SplitGP(**{field: bad})
    assert SplitGP().cut(_layout_of(3)) == 2 and SplitGP(client_layers=2).cut(_layout_of(3)) == 2
    with pytest.raises(ConfigError, match=r"must be in \[1, 2\] for this model \(got 3\)"):
        SplitGP(client_layers=3).cut(_layout_of(3))


def test_splitgp_split_counts_layers_whose_parameters_sit_in_submodules():
    from pfl.methods.splitgp import split_sequential

    class Block(torch.nn.Module):  # a non-Sequential module whose parameters belong to a child
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.inner(x)

    block, relu, head = Block(), torch.nn.ReLU(), torch.nn.Linear(3, 2)
    client, server = split_sequential(torch.nn.Sequential(block, relu, head), 1)
    assert list(client) == [block, relu] and list(server) == [head]
    mlp = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match=r"must be in \[1, 2\] for this model \(got 3\)"):
        split_sequential(mlp, 3)


def test_splitgp_parts_follow_the_network_they_are_asked_for():
    from pfl.methods.splitgp import SplitGP

    method, layout = SplitGP(), _layout_of(2)
    nets = [torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2)) for _ in range(2)]
    for net in (nets[0], nets[1], nets[0]):
        phi, theta = method.parts(net, layout)
        assert phi[0] is net[0] and theta[0] is net[2]


def test_splitgp_head_views_follow_every_parameter_of_the_server_side_part():
    from pfl.methods.splitgp import _params_of

    theta = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    flat = torch.cat([p.detach().reshape(-1) for p in theta.parameters()])
    views = _params_of(theta, flat)
    assert list(views) == [name for name, _ in theta.named_parameters()]
    for name, p in theta.named_parameters():
        assert torch.equal(views[name], p.detach())


def test_splitgp_regression_loss_is_the_mse_of_the_single_output():
    from pfl.methods.splitgp import data_loss

    gen = torch.Generator().manual_seed(0)
    out, y = torch.randn(5, 1, generator=gen), torch.randn(5, generator=gen)
    torch.testing.assert_close(data_loss(out, y), torch.nn.functional.mse_loss(out[:, 0], y))
