"""Tests of pfl/methods/scaffold.py."""

from __future__ import annotations

import pytest
import torch

from pfl.config import ServerConfig
from pfl.errors import ConfigError
from pfl.federation.robust import RobustRule
from pfl.methods.scaffold import Scaffold
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import HALF, _grads, exchanged_round, lockstep_as_sequential
from tests.methods.reference import drawn_batches, initial_net


def _local_path(net, x, c, c_i, batches, data, lr) -> torch.Tensor:
    """SCAFFOLD's K local steps by hand from the flat model ``x``: y ← y − η(∇f_i(y) − c_i + c)."""
    sizes = [p.numel() for _, p in net.named_parameters()]
    y = {k: t.view_as(p) for (k, p), t in zip(net.named_parameters(), x.split(sizes), strict=True)}
    for b in batches:
        step = _flat_grad(net, y, data.x[b], data.y[b]) + (c - c_i)
        y = {k: t - lr * s.view_as(t) for (k, t), s in zip(y.items(), step.split(sizes), strict=True)}
    return torch.cat([t.reshape(-1) for t in y.values()])


def _flat_grad(net, params: dict, x, y) -> torch.Tensor:
    live = {k: t.clone().requires_grad_(True) for k, t in params.items()}
    return torch.cat([g.reshape(-1) for g in _grads(net, live, x, y)])


@pytest.mark.parametrize("option", ["II", "I"])
def test_scaffold_steps_control_variates_and_aggregation_match_the_formulas(option):
    """By hand over two rounds of half the clients: the local steps y ← y − η(∇f_i(y) − c_i + c), the
    control variate c_i⁺ (option II: c_i − c + (x − y)/(Kη); option I: the mean batch gradient of one pass
    over the client's train split in index order at x), the upload Δc_i = c_i⁺ − c_i, and the server's
    uniform mean of the y and c ← c + Σ Δc_i / N. Round 2 has c ≠ c_i, so every sign of the correction shows."""
    lr = 0.1
    cfg = tiny_config("scaffold", {"option": option}, trainer=HALF, client={"lr": lr})
    loop = make_loop(cfg)
    net = initial_net(cfg, loop)
    sizes = [p.numel() for _, p in net.named_parameters()]
    data, n = loop.worker.data, loop.worker.data.num_clients
    for r in range(2):
        before = {cid: loop.clients.get(cid, {}).get("c") for cid in range(n)}
        payloads, results = exchanged_round(loop)
        x, c = payloads[next(iter(payloads))]["global"], payloads[next(iter(payloads))]["c"]
        assert r == 0 or c.abs().sum() > 0
        for cid, up in results.items():
            c_i = before[cid] if before[cid] is not None else torch.zeros_like(c)
            idx = data.clients[cid].train
            batches = drawn_batches(cfg.seed, r, cid, "train", idx, 16)
            torch.testing.assert_close(up.state, _local_path(net, x, c, c_i, batches, data, lr), rtol=1e-5, atol=1e-6)
            path = c_i - c + (x - up.state) / (len(batches) * lr)
            at_x = {k: t.view_as(p) for (k, p), t in zip(net.named_parameters(), x.split(sizes), strict=True)}
            full = [
                _flat_grad(net, at_x, data.x[idx[s : s + 16]], data.y[idx[s : s + 16]]) for s in range(0, len(idx), 16)
            ]
            c_new = path if option == "II" else torch.stack(full).mean(0)
            assert (path - torch.stack(full).mean(0)).abs().max() > 1e-3  # the two options' variates differ
            torch.testing.assert_close(loop.clients[cid]["c"], c_new, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(up["dc"], c_new - c_i, rtol=1e-5, atol=1e-6)
            assert up.weight == 1.0  # uniform over the sampled clients, as in the paper
        assert len({len(data.clients[cid].train) for cid in results}) > 1  # a sample-weighted mean would differ
        mean = sum(up.state for up in results.values()) / len(results)
        torch.testing.assert_close(loop.server["global"], mean)
        torch.testing.assert_close(loop.server["c"], c + sum(up["dc"] for up in results.values()) / n)


def test_scaffold_control_variates_follow_option_two():
    """Round 0 (c = c_i = 0): c_i⁺ = (x − y)/(Kη) is the mean of the K batch gradients along the local
    path; the server's c is then (1/N) Σ c_i, and round 1's steps add c − c_i to every gradient."""
    cfg = tiny_config("scaffold", trainer={"rounds": 2, "fraction": 1.0})
    loop = make_loop(cfg)
    x = loop.server["global"].clone()
    payloads, uploads = exchanged_round(loop)
    p = loop.flat.num_params
    for cid, up in uploads.items():
        ctx = loop.client(cid)
        ctx.round = 0
        loop.flat.load(x)
        grads = []
        for b in ctx.batches():
            ctx.gradient(b)
            grads.append(loop.flat.grads.clone())
            loop.flat.params.sub_(loop.flat.grads, alpha=ctx.lr)
        mean = torch.stack(grads).mean(0)
        torch.testing.assert_close(loop.clients[cid]["c"], mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(up["dc"], mean, rtol=1e-4, atol=1e-5)
        assert up.weight == 1.0  # the paper's uniform mean
    c = torch.stack([loop.clients[i]["c"] for i in range(cfg.data.num_clients)]).mean(0)
    torch.testing.assert_close(loop.server["c"], c, rtol=1e-5, atol=1e-7)
    assert loop.server["global"][:p].sub(x[:p]).norm() > 0


def test_scaffold_option_one_trains_in_lockstep_as_it_does_sequentially():
    vec = lockstep_as_sequential(tiny_config("scaffold", {"option": "I"}, trainer={"rounds": 2, "fraction": 0.5}))
    assert vec.dispatcher.lockstep.stacked_fits > 0


def test_scaffold_refuses_an_unknown_option_before_training():
    with pytest.raises(ConfigError, match="method.option"):
        Scaffold(option="III")


def test_scaffold_with_equal_control_variates_is_fedavg_with_uniform_weights():
    scaffold = make_loop(tiny_config("scaffold", trainer={"rounds": 3, "fraction": 0.5}))
    fedavg = make_loop(tiny_config("fedavg", trainer={"rounds": 3, "fraction": 0.5}))
    _, ups = exchanged_round(scaffold)
    _, fups = exchanged_round(fedavg)
    for cid in ups:
        assert torch.equal(ups[cid].state, fups[cid].state)  # c − c_i = 0 in round 0


def test_scaffold_refuses_an_unknown_weighting_before_training():
    with pytest.raises(ConfigError, match="method.weighting"):
        Scaffold(weighting="size")
    assert Scaffold(weighting="samples").weighting == "samples"


def test_scaffold_takes_a_robust_aggregator_for_its_averaged_model():
    # The model is the mean of the uploads, so median / trimmed mean / Krum can stand in for it.
    aggregator = RobustRule.build(ServerConfig(aggregator="median"), Scaffold(), clients_per_round=4)
    assert aggregator.kind == "median"
