"""Tests of pfl/methods/perfedavg.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl.errors import ConfigError
from pfl.methods.perfedavg import PerFedAvg
from pfl.models import build_model
from pfl.runner.args import parse_fit_args
from pfl.seeding import seed_everything, torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _grads,
    _one_client_loop,
    exchanged_round,
    lockstep_as_sequential,
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


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def test_perfedavg_hessian_free_step_matches_hand_computation_over_triples_of_batches():
    """HF: per triple (B, B', B''), θ' = θ − α∇f(θ; B), g' = ∇f(θ'; B'),
    d = [∇f(θ + δg'; B'') − ∇f(θ − δg'; B'')] / (2δ), θ ← θ − β(g' − αd); a last pair or single batch
    that makes no triple is not trained on."""
    alpha, beta, delta = 0.05, 0.02, 0.01
    cfg, loop = _one_client_loop("perfedavg", {"inner_lr": alpha, "outer_lr": beta, "variant": "hf", "delta": delta})
    net = initial_net(cfg, loop)
    names = [n for n, _ in net.named_parameters()]
    sizes = [p.numel() for _, p in net.named_parameters()]

    def grad(theta: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        live = {
            n: t.view_as(p).clone().requires_grad_(True)
            for (n, p), t in zip(net.named_parameters(), theta.split(sizes), strict=True)
        }
        return _flat(_grads(net, live, data.x[b], data.y[b]))

    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    theta = _flat(p.detach() for p in net.parameters())
    batches = drawn_batches(cfg.seed, 0, 0, "train", idx, 16)
    assert len(batches) % 3 != 0 and len(names) > 1  # a leftover batch is skipped
    for first, second, third in zip(batches[0::3], batches[1::3], batches[2::3], strict=False):
        g_outer = grad(theta - alpha * grad(theta, first), second)
        d = (grad(theta + delta * g_outer, third) - grad(theta - delta * g_outer, third)) / (2 * delta)
        theta = theta - beta * (g_outer - alpha * d)
    torch.testing.assert_close(loop.server["global"], theta, rtol=1e-5, atol=1e-6)
    fo = _one_client_loop("perfedavg", {"inner_lr": alpha, "outer_lr": beta})[1]
    assert (fo.server["global"] - theta).abs().max() > 1e-3
    ctx = loop.client(0)
    loop.method.local_update(ctx, {"global": loop.server["global"]})
    assert ctx.fits[-1].steps == len(drawn_batches(cfg.seed, ctx.round, 0, "train", idx, 16)) // 3


def test_perfedavg_hessian_free_difference_is_the_hessian_vector_product():
    """The central difference of two gradients δ apart along v is ∇²f(θ; B)v (double backprop), up to
    O(δ²) and float32 rounding: what makes HF a second-order MAML step."""
    cfg, loop = _one_client_loop("perfedavg", {"variant": "hf", "delta": 1e-3})
    net = initial_net(cfg, loop)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    ctx, b = loop.client(0), idx[:32]
    theta = loop.server["global"][: loop.flat.num_params].clone()
    v = torch.randn(theta.numel(), generator=torch.Generator().manual_seed(0))
    v /= v.norm()
    approx = loop.method._hessian_vector(ctx, theta, v, b).clone()
    params = {n: p.detach().clone().requires_grad_(True) for n, p in net.named_parameters()}
    for p, t in zip(params.values(), theta.split([p.numel() for p in params.values()]), strict=True):
        p.data.copy_(t.view_as(p))
    g = _flat(
        torch.autograd.grad(
            F.cross_entropy(functional_call(net, params, (data.x[b],)), data.y[b]),
            list(params.values()),
            create_graph=True,
        )
    )
    exact = _flat(torch.autograd.grad(g @ v, list(params.values())))
    assert exact.norm() > 1e-2
    assert (approx - exact).norm() < 0.02 * exact.norm()


def test_perfedavg_hessian_free_trains_in_lockstep_as_it_does_sequentially():
    vec = lockstep_as_sequential(tiny_config("perfedavg", {"variant": "hf"}, trainer={"rounds": 2, "fraction": 0.5}))
    assert vec.dispatcher.lockstep.stacked_batch_gradients > 0
    assert vec.dispatcher.lockstep.sequential_gradients == 0


def test_perfedavg_refuses_a_non_positive_delta_and_an_unknown_variant():
    with pytest.raises(ConfigError, match="method.delta"):
        PerFedAvg(variant="hf", delta=0.0)
    with pytest.raises(ConfigError, match="method.variant"):
        PerFedAvg(variant="so")
