"""Tests of pfl/methods/apfl.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl.data import DataConfig
from pfl.federation.loop import comparable_metrics
from pfl.methods.apfl import APFL
from tests.conftest import make_loop, tiny_config
from tests.engine.test_lockstep_real_runs import _vectorized
from tests.helpers.same_runs import assert_close, assert_same_metrics
from tests.methods.helpers import (
    HALF,
    ONE_CLIENT,
    _fit,
    _full_grad,
    _one_client,
    exchanged_round,
    resumed_after,
)
from tests.methods.reference import drawn_batches, flat_params, initial_net
from tests.methods.registry_properties import _state_equal


def test_apfl_mixing_zero_is_fedavg_on_the_personal_side():
    apfl = make_loop(tiny_config("apfl", {"mix": 0.0}, trainer=HALF))
    fa = make_loop(tiny_config("fedavg", trainer=HALF))
    for _ in range(3):
        _, fa_results = exchanged_round(fa)
        exchanged_round(apfl)
        for cid, r in fa_results.items():
            assert torch.equal(apfl.clients[cid]["personal"], r.state)
    assert torch.equal(apfl.server["global"], fa.server["global"])
    mixed = _fit("apfl", {"mix": 0.5})
    assert torch.equal(mixed.server["global"], fa.server["global"])  # v never feeds back into w
    assert not torch.equal(mixed.clients[next(iter(mixed.clients))]["personal"], fa.server["global"])


def test_apfl_mixing_zero_is_fedavg_on_a_regression_federation():
    """On (B, 1) regression outputs both of APFL's losses compare squeezed outputs with the targets."""
    data = DataConfig(source="synthetic_regression", num_clients=6, val_frac=0.2, test_frac=0.3)
    groups = {"data": data, "model": {"name": "mlp", "hidden": [16]}, "client": {"lr": 0.01}, "trainer": HALF}
    apfl, fa = make_loop(tiny_config("apfl", {"mix": 0.0}, **groups)), make_loop(tiny_config("fedavg", **groups))
    assert apfl.worker.task == "regression"
    _, fa_results = exchanged_round(fa)
    exchanged_round(apfl)
    for cid, r in fa_results.items():
        assert torch.equal(apfl.clients[cid]["personal"], r.state)
    mixed = make_loop(tiny_config("apfl", {"mix": 0.5}, **groups))  # the mixed model's loss: no (B, B) broadcast
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*target size.*")
        exchanged_round(mixed)


@pytest.mark.parametrize(
    ("momentum", "keep", "mix_lr", "mix_decay"),
    [(0.0, False, 0.0, 0.0), (0.9, False, 0.0, 0.0), (0.9, True, 0.0, 0.0), (0.9, True, 0.002, 0.02)],
)
def test_apfl_personal_model_uses_the_run_optimizer(momentum, keep, mix_lr, mix_decay):
    """Two rounds: v's optimizer, like w's, starts afresh each participation unless momentum is kept. With
    mix_lr > 0, α takes a plain SGD step after every batch, α ← clip(α − mix_lr·(⟨v − w, ∇f(v̄)⟩ + mix_decay·α),
    0, 1) at the batch's v, w and v̄, and the second round starts from the first round's α."""
    a = 0.3
    args = {"mix": a, "mix_lr": mix_lr, "mix_decay": mix_decay}
    cfg, loop = _one_client("apfl", args, rounds=2, momentum=momentum, weight_decay=0.01, keep_momentum=keep)
    net = initial_net(cfg, loop)
    v = [p.detach().clone().requires_grad_(True) for p in net.parameters()]
    names = [n for n, _ in net.named_parameters()]
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    alpha = torch.tensor(a)
    for r in range(2):
        if r == 0 or not keep:
            opt_w = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum, weight_decay=0.01)
            opt_v = torch.optim.SGD(v, lr=0.1, momentum=momentum, weight_decay=0.01)
        for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
            x, y = data.x[b], data.y[b]
            ps = list(net.parameters())
            mixed = {n: alpha * vp + (1 - alpha) * p.detach() for n, vp, p in zip(names, v, ps, strict=True)}
            opt_w.zero_grad(), opt_v.zero_grad()
            F.cross_entropy(net(x), y).backward()
            mixed_loss = F.cross_entropy(functional_call(net, mixed, (x,)), y)
            at_mixture = torch.autograd.grad(mixed_loss, list(mixed.values()), retain_graph=True)
            steps = zip(v, ps, at_mixture, strict=True)
            g = sum(torch.dot((vp - p).detach().reshape(-1), gp.reshape(-1)) for vp, p, gp in steps)
            mixed_loss.backward()
            opt_w.step(), opt_v.step()
            if mix_lr:
                alpha = (alpha - mix_lr * (g + mix_decay * alpha)).clamp(0.0, 1.0)
    torch.testing.assert_close(loop.server["global"], flat_params(net), rtol=1e-5, atol=1e-6)
    v_flat = torch.cat([p.detach().reshape(-1) for p in v])
    torch.testing.assert_close(loop.clients[0]["v"], v_flat, rtol=1e-5, atol=1e-6)
    assert ("v_momentum" in loop.clients[0]) == (keep and momentum > 0)
    assert ("mix" in loop.clients[0]) == (mix_lr > 0)  # a fixed α is the option's float, never a state
    if mix_lr:
        assert 0.0 < float(alpha) < 0.99 * a  # moved, not clipped
        torch.testing.assert_close(loop.clients[0]["mix"], alpha.detach(), rtol=1e-5, atol=1e-7)


def test_apfl_evaluates_every_client_on_the_mixture_with_the_latest_global_model():
    a = 0.25
    loop = make_loop(tiny_config("apfl", {"mix": a}, trainer=HALF))
    first, _ = exchanged_round(loop)
    second, _ = exchanged_round(loop)
    idle = [c for c in first if c not in second]
    assert idle
    p = loop.worker.flat.num_params
    for cid in idle:
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        expected = a * loop.clients[cid]["v"] + (1 - a) * loop.server["global"][:p]
        torch.testing.assert_close(pm[:p], expected)
        assert not torch.allclose(pm, loop.clients[cid]["personal"])  # not the stale local mixture
    never = [c for c in range(6) if c not in loop.clients]
    for cid in never:
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        torch.testing.assert_close(pm[:p], a * loop.init_state[:p] + (1 - a) * loop.server["global"][:p])
    local = make_loop(tiny_config("apfl", {"mix": a, "eval_mix": "local"}, trainer=HALF))
    exchanged_round(local)
    cid = next(iter(local.clients))
    assert local.method.personal_state(local.server, local.client(cid)) is local.clients[cid]["personal"]


@pytest.mark.parametrize("mix_decay", [0.0, 0.02])
def test_apfl_adaptive_mix_takes_a_gradient_step_on_the_mixture_loss_in_alpha(mix_decay):
    """One step a round (the train split is one batch). Round 0: v = w, so ⟨v − w, ∇f(v̄)⟩ = 0 and only
    mix_decay moves α. Round 1: α ← α − mix_lr·(⟨v − w, ∇f(v̄)⟩ + mix_decay·α), by hand at the client's v,
    the global model w it receives and v̄ = α·v + (1 − α)·w on that batch."""
    a, mix_lr = 0.5, 5.0
    cfg = tiny_config(
        "apfl",
        {"mix": a, "mix_lr": mix_lr, "mix_decay": mix_decay},
        data=ONE_CLIENT,
        client={"batch_size": 4096},
        trainer={"rounds": 2},
    )
    loop = make_loop(cfg)
    loop.run_round()
    alpha = loop.clients[0]["mix"].clone()
    torch.testing.assert_close(alpha, torch.tensor(a - mix_lr * mix_decay * a))
    p = loop.worker.flat.num_params
    v, w = loop.clients[0]["v"].clone(), loop.server["global"][:p].clone()
    loop.run_round()
    (batch,) = drawn_batches(cfg.seed, 1, 0, "train", loop.worker.data.clients[0].train, 4096)
    grad, _ = _full_grad(loop, 0, alpha * v + (1 - alpha) * w, batch)
    expected = alpha - mix_lr * (torch.dot(v - w, grad) + mix_decay * alpha)
    assert 0.0 < float(expected) < float(alpha) - 0.01  # a step that moves α, inside [0, 1]
    torch.testing.assert_close(loop.clients[0]["mix"], expected, rtol=1e-5, atol=1e-6)


def test_apfl_adaptive_mix_is_kept_in_the_unit_interval():
    """A step size far too large: every client's α ends on a bound, some on each (unclipped they leave [0, 1])."""
    loop = make_loop(tiny_config("apfl", {"mix": 1.0, "mix_lr": 100.0}, trainer=HALF))
    loop.fit()
    assert {float(state["mix"]) for state in loop.clients.values()} == {0.0, 1.0}


def test_apfl_without_mix_lr_keeps_alpha_fixed_and_the_defaults_numbers():
    """mix_lr = 0 (the default): α is the option's float, nothing is added to a client's state, the fits
    stack, and mix_decay does nothing; a run with mix_lr > 0 differs."""
    default = make_loop(tiny_config("apfl", trainer=HALF))
    zero = make_loop(tiny_config("apfl", {"mix_lr": 0.0, "mix_decay": 0.02}, trainer=HALF))
    adaptive = make_loop(tiny_config("apfl", {"mix_lr": 0.01}, trainer=HALF))
    runs = [comparable_metrics(loop.fit()) for loop in (default, zero, adaptive)]
    assert runs[0] == runs[1] != runs[2]
    assert all(state.keys() == {"v", "personal"} for state in zero.clients.values())
    assert zero.method.vectorize_problems() == []


def test_apfl_evaluates_each_client_with_its_own_adapted_alpha():
    a = 0.5
    loop = make_loop(tiny_config("apfl", {"mix": a, "mix_lr": 0.05}, trainer=HALF))
    exchanged_round(loop)
    _, results = exchanged_round(loop)
    p = loop.worker.flat.num_params
    alphas = {cid: loop.clients[cid]["mix"] for cid in loop.clients}
    assert len({float(alpha) for alpha in alphas.values()} | {a}) == len(alphas) + 1  # per client, all moved
    for cid, alpha in alphas.items():
        v = loop.clients[cid]["v"]
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        torch.testing.assert_close(pm[:p], alpha * v + (1 - alpha) * loop.server["global"][:p])
        if cid in results:  # the local mixture: with the w it trained, at the α it ended with
            own = results[cid].state[:p]
            torch.testing.assert_close(loop.clients[cid]["personal"][:p], alpha * v + (1 - alpha) * own)
    for cid in (c for c in range(6) if c not in loop.clients):  # never trained: the initial α
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        torch.testing.assert_close(pm[:p], a * loop.init_state[:p] + (1 - a) * loop.server["global"][:p])


@pytest.mark.parametrize("mix_lr", [0.0, 0.05])
def test_apfl_adaptive_mix_trains_one_client_at_a_time_under_vectorize(mix_lr):
    """A fixed α's fits stack (the stacked loss, within 1e-5 of the sequential fits). An adapted α is a
    second tensor trained beside v, which the stacked loss has no room for: the method says so, and
    lockstep runs every fit on the worker, bit for bit as the sequential run does."""
    problems = APFL(mix_lr=mix_lr).vectorize_problems()
    if mix_lr:
        (line,) = problems
        assert line.startswith("apfl's mix_lr > 0") and "one at a time" in line
    else:
        assert problems == []
    cfg = tiny_config("apfl", {"mix_lr": mix_lr}, trainer={"rounds": 2, **HALF}, client={"momentum": 0.5})
    seq, vec = make_loop(cfg), _vectorized(make_loop(cfg))
    sequential, vectorized = seq.fit(), vec.fit()
    lockstep = vec.dispatcher.lockstep
    assert (lockstep.stacked_fits == 0) == bool(mix_lr) and (lockstep.sequential_fits == 0) == (not mix_lr)
    if mix_lr:
        assert _state_equal(dict(seq.clients.items()), dict(vec.clients.items()))
        assert comparable_metrics(sequential) == comparable_metrics(vectorized)
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients")
    assert_same_metrics(vec.history[-1], seq.history[-1])


def test_apfl_adapted_alpha_is_kept_through_a_resume(tmp_path):
    """Each client's α is checkpointed with its state: the resumed run starts from it and goes on as the
    uninterrupted run does."""
    cfg = tiny_config("apfl", {"mix_lr": 0.05}, trainer={"rounds": 3, **HALF})
    first, resumed = resumed_after(cfg, 2, tmp_path)
    assert first.clients.keys() == resumed.clients.keys()
    for cid, state in first.clients.items():
        assert float(state["mix"]) != 0.5 and torch.equal(resumed.clients[cid]["mix"], state["mix"])
    first.run_round(), resumed.run_round()
    assert _state_equal(dict(first.clients.items()), dict(resumed.clients.items()))
    assert _state_equal(first.server.state, resumed.server.state)
    assert first.evaluate()["pm.l_acc.mean"] == resumed.evaluate()["pm.l_acc.mean"]
