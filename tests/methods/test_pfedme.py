"""Tests of pfl/methods/pfedme.py."""

from __future__ import annotations

import pytest
import torch

from pfl.runner.args import parse_fit_args
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _fit,
    _grads,
    _one_client_loop,
    exchanged_round,
    server_means_by_hand,
)
from tests.methods.reference import drawn_batches, initial_net
from tests.methods.registry_properties import CONF


def test_pfedme_with_unit_proximal_steps_is_fedavg():
    """K = 1, λ·η_p = 1 and λ·η = 1 make θ ← w − η∇f(θ) and w ← θ: plain SGD, i.e. FedAvg (with its
    sample-weighted mean)."""
    lr = 0.1
    a = _fit("fedavg", client={"lr": lr})
    unit = {"lam": 1 / lr, "inner_steps": 1, "personal_lr": lr, "beta": 1.0, "weighting": "samples"}
    b = _fit("pfedme", unit, client={"lr": lr})
    torch.testing.assert_close(a.server["global"], b.server["global"], rtol=1e-4, atol=1e-5)
    c = _fit("pfedme", client={"lr": lr})
    assert not torch.allclose(a.server["global"], c.server["global"], atol=1e-3)


@pytest.mark.parametrize("l2", [0.0, 0.1])
def test_pfedme_local_update_and_beta_aggregation_match_hand_computation(l2):
    lam, k, plr, lr, beta = 15.0, 3, 0.01, 0.05, 0.5
    args = {"lam": lam, "inner_steps": k, "personal_lr": plr, "beta": beta, "personal_l2": l2}
    cfg, loop = _one_client_loop("pfedme", args, lr=lr)
    net = initial_net(cfg, loop)
    names = [n for n, _ in net.named_parameters()]
    w0 = {n: p.detach().clone() for n, p in net.named_parameters()}
    theta, w = dict(w0), dict(w0)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for b in drawn_batches(cfg.seed, 0, 0, "train", idx, 16):
        for _ in range(k):
            live = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
            g = _grads(net, live, data.x[b], data.y[b])
            step = {n: gn + lam * (theta[n] - w[n]) + l2 * theta[n] for n, gn in zip(names, g, strict=True)}
            theta = {n: theta[n] - plr * step[n] for n in names}
        w = {n: w[n] - lr * lam * (w[n] - theta[n]) for n in names}
    flat = lambda d: torch.cat([d[n].reshape(-1) for n in names])  # noqa: E731
    torch.testing.assert_close(loop.clients[0]["personal"], flat(theta), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loop.server["global"], (1 - beta) * flat(w0) + beta * flat(w), rtol=1e-5, atol=1e-6)


def test_pfedme_server_takes_the_plain_mean_by_default_and_the_sample_weighted_one_as_an_option():
    """Algorithm 1: w ← (1 − β)w + β Σ_{i∈S} w_i / |S|; ``weighting: samples`` (the authors' code) weighs
    w_i by n_i. Half the clients, of different sizes, after one round, at β = 0.5."""
    for args, pick in (({"beta": 0.5}, 0), ({"beta": 0.5, "weighting": "samples"}, 1)):
        loop = make_loop(tiny_config("pfedme", args, trainer=HALF))
        w0 = loop.server["global"].clone()
        _, uploads = exchanged_round(loop)
        mean = server_means_by_hand(loop, uploads)[pick]
        torch.testing.assert_close(loop.server["global"], 0.5 * w0 + 0.5 * mean, rtol=1e-5, atol=1e-6)
    for name in ("pfedme", "pfedme_official"):  # the paper's config and the code's
        method = parse_fit_args(["--config", str(CONF / f"{name}.yaml")])[0].method
        assert method.weighting == ("uniform" if name == "pfedme" else "samples")


@pytest.mark.parametrize(("name", "per_step"), [("pfedme", 1), ("perfedavg", 2)])
def test_pfedme_and_perfedavg_record_their_own_loops_steps(name, per_step):
    """Methods running their own loop account for it: one step per batch (Per-FedAvg: per pair of batches)."""
    loop = make_loop(tiny_config(name))
    ctx = loop.client(1)
    loop.method.local_update(ctx, loop.method.payload(loop.server, 1))
    batches = len(list(ctx.batches()))
    assert batches > 4 and ctx.fits[-1].steps == batches // per_step
    assert ctx.fits[-1].samples_seen == ctx.num_samples * ctx.epochs


def test_pfedme_unsampled_clients_personalize_from_the_round_global_model():
    loop = make_loop(tiny_config("pfedme", trainer=HALF))
    sent = loop.server["global"].clone()
    payloads, _ = exchanged_round(loop)
    unsampled = [c for c in range(6) if c not in payloads]
    assert unsampled
    fresh = make_loop(tiny_config("pfedme", trainer=HALF))  # the same client, had it been sampled in round 0
    for cid in unsampled:
        got = loop.method.personal_state(loop.server, loop.client(cid))
        expected, _ = fresh.method.personalize(fresh.client(cid), sent)
        assert torch.equal(got, expected)
        assert not torch.equal(got, loop.init_state)
    for cid in payloads:  # the sampled ones keep what they trained
        assert loop.method.personal_state(loop.server, loop.client(cid)) is loop.clients[cid]["personal"]
    only = make_loop(tiny_config("pfedme", {"all_clients_train": False}, trainer=HALF))
    exchanged_round(only)
    for cid in unsampled:
        assert torch.equal(only.method.personal_state(only.server, only.client(cid)), only.init_state)
