"""Tests of pfl/methods/perfedavg.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pfl.models import build_model
from pfl.runner.args import parse_fit_args
from pfl.seeding import seed_everything, torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _grads,
    _one_client_loop,
    exchanged_round,
    server_means_by_hand,
)
from tests.methods.reference import drawn_batches, initial_net
from tests.methods.registry_properties import CONF


def test_perfedavg_zero_inner_step_is_sgd_on_every_second_batch():
    cfg = tiny_config(
        "perfedavg",
        {"inner_lr": 0.0, "outer_lr": 0.05},
        data={"num_clients": 1, "min_samples": 1},
        client={"epochs": 2, "batch_size": 16},
        trainer={"rounds": 2},
    )
    loop = make_loop(cfg)
    loop.fit()
    seed_everything(cfg.seed, "init")
    net = build_model(cfg.model, loop.worker.data.input_shape, loop.worker.data.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for r in range(2):
        gen = torch_generator(cfg.seed, r, 0, "train", "batches")
        batches = []
        for _ in range(2):
            order = idx[torch.randperm(len(idx), generator=gen)]
            batches += [order[s : s + 16] for s in range(0, len(idx), 16)]
        for b in batches[1 : len(batches) // 2 * 2 : 2]:
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    torch.testing.assert_close(loop.server["global"], expected, rtol=1e-5, atol=1e-6)


def test_perfedavg_local_update_and_personal_model_match_hand_computation():
    alpha, beta = 0.05, 0.02
    cfg, loop = _one_client_loop("perfedavg", {"inner_lr": alpha, "outer_lr": beta})
    net = initial_net(cfg, loop)
    theta = {n: p.detach().clone() for n, p in net.named_parameters()}
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    batches = drawn_batches(cfg.seed, 0, 0, "train", idx, 16)
    for first, second in zip(batches[0::2], batches[1::2], strict=False):
        live = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
        g = _grads(net, live, data.x[first], data.y[first])
        inner = {n: t - alpha * gn for (n, t), gn in zip(theta.items(), g, strict=True)}
        live = {n: t.clone().requires_grad_(True) for n, t in inner.items()}
        outer = _grads(net, live, data.x[second], data.y[second])
        theta = {n: t - beta * g for (n, t), g in zip(theta.items(), outer, strict=True)}
    w = torch.cat([t.reshape(-1) for t in theta.values()])
    torch.testing.assert_close(loop.server["global"], w, rtol=1e-5, atol=1e-6)
    # P-model: one step of size α from the global model on one batch (the round's "adapt" batch).
    ctx = loop.client(0)
    b = drawn_batches(cfg.seed, ctx.round, 0, "adapt", idx, 16)[0]
    live = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
    g = torch.cat([x.reshape(-1) for x in _grads(net, live, data.x[b], data.y[b])])
    personal = loop.method.personal_state(loop.server, ctx)
    torch.testing.assert_close(personal, w - alpha * g, rtol=1e-5, atol=1e-6)


def test_perfedavg_step_sizes_default_to_the_client_lr():
    lr = 0.07  # α and β both follow client.lr (the PGFed authors' script: α = β = lr)
    default = _one_client_loop("perfedavg", {}, rounds=2, lr=lr)[1]
    explicit = _one_client_loop("perfedavg", {"inner_lr": lr, "outer_lr": lr}, rounds=2, lr=lr)[1]
    assert torch.equal(default.server["global"], explicit.server["global"])
    assert torch.equal(
        default.method.personal_state(default.server, default.client(0)),
        explicit.method.personal_state(explicit.server, explicit.client(0)),
    )
    for other in ({"inner_lr": lr, "outer_lr": lr / 2}, {"inner_lr": lr / 2, "outer_lr": lr}):
        assert not torch.equal(
            default.server["global"], _one_client_loop("perfedavg", other, rounds=2, lr=lr)[1].server["global"]
        )
    method = parse_fit_args(["--config", str(CONF / "perfedavg.yaml")])[0].method
    assert (method.inner_lr, method.outer_lr) == (None, None)


def test_perfedavg_server_takes_the_plain_mean_by_default_and_the_sample_weighted_one_as_an_option():
    """Algorithm 1: w_{k+1} = Σ_{i∈A_k} w^i / |A_k|; ``weighting: samples`` (the pFedMe and PGFed authors'
    code) weighs w^i by n_i. Half the clients, of different sizes, after one round."""
    for args, pick in (({}, 0), ({"weighting": "samples"}, 1)):
        loop = make_loop(tiny_config("perfedavg", args, trainer=HALF))
        _, uploads = exchanged_round(loop)
        mean = server_means_by_hand(loop, uploads)[pick]
        torch.testing.assert_close(loop.server["global"], mean, rtol=1e-5, atol=1e-6)
    for name in ("perfedavg", "perfedavg_official"):  # the paper's config and the code's
        method = parse_fit_args(["--config", str(CONF / f"{name}.yaml")])[0].method
        assert method.weighting == ("uniform" if name == "perfedavg" else "samples")
