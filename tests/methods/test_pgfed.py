"""Tests of pfl/methods/pgfed.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from pfl.models import build_model
from pfl.seeding import seed_everything, torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    _full_grad,
    exchanged_round,
    tensor_bytes,
)


def test_mu_zero_equals_fedavg_locally_trained_models():
    client = {"momentum": 0.9}
    pg = make_loop(tiny_config("pgfed", {"mu": 0.0, "eta2": 0.5}, trainer=HALF, client=client))
    fa = make_loop(tiny_config("fedavg", trainer=HALF, client=client))
    for _ in range(3):
        _, pg_results = exchanged_round(pg)
        _, fa_results = exchanged_round(fa)
        assert pg_results.keys() == fa_results.keys()
        for cid, r in fa_results.items():
            assert torch.equal(pg.clients[cid]["personal"], r.state)
        assert torch.equal(pg.server["global"], fa.server["global"])
    assert "aux" in exchanged_round(pg)[0][next(iter(pg_results))]  # the auxiliary path did run


def test_one_alpha_update_and_aux_gradient_match_hand_computation():
    mu, eta2, lr = 0.5, 0.1, 0.05
    cfg = tiny_config(
        "pgfed",
        {"mu": mu, "eta2": eta2},
        data={"num_clients": 2, "min_samples": 20},
        client={"epochs": 1, "batch_size": 10_000, "lr": lr},  # one batch = the whole train split
    )
    loop = make_loop(cfg)
    exchanged_round(loop)  # round 0: FedAvg-like, uploads ∇f_j and c_j
    w = loop.server["global"].clone()
    grads, cs = [], []
    for j in range(2):
        theta_j = loop.clients[j]["personal"]
        g, f = _full_grad(loop, j, theta_j)
        grads.append(g)
        cs.append(mu * (f - float(g @ theta_j[: g.numel()])))
    torch.testing.assert_close(loop.server["c"], torch.tensor(cs), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loop.server["grads"], torch.stack(grads), rtol=1e-4, atol=1e-6)
    gbar = mu / 2 * (grads[0] + grads[1])
    p = grads[0].numel()
    # α starts at 1/M = 1/2; the single batch's α step uses θ_i = the global model.
    expected_alpha = torch.tensor([0.5 - eta2 * (c + float(gbar @ w[:p])) for c in cs])
    payloads, results = exchanged_round(loop)
    for i in range(2):
        torch.testing.assert_close(results[i]["alpha"], expected_alpha, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(loop.server["alpha"][i], expected_alpha, rtol=1e-4, atol=1e-5)
        aux = mu * 0.5 * (grads[0] + grads[1])
        torch.testing.assert_close(payloads[i]["aux"], aux, rtol=1e-4, atol=1e-6)
        g_i, _ = _full_grad(loop, i, w)
        expected_theta = w[:p] - lr * (g_i + aux)  # one plain SGD step on ∇f_i + g̃_i
        torch.testing.assert_close(loop.clients[i]["personal"][:p], expected_theta, rtol=1e-4, atol=1e-6)


def test_alpha_clipping_keeps_weights_nonnegative():
    cfg = tiny_config("pgfed", {"mu": 1.0, "eta2": 100.0, "clip_alpha": True}, trainer=HALF)
    loop = make_loop(cfg)
    for _ in range(3):
        loop.run_round()
    assert float(loop.server["alpha"].min()) >= 0.0
    assert float(loop.server["alpha"].min()) == 0.0  # a huge η₂ really pushed some to the bound


def test_pgfedmo_beta_zero_equals_pgfed_and_beta_positive_differs():
    args = {"mu": 0.5, "eta2": 0.05}
    runs = {}
    for name, extra in (("pgfed", {}), ("pgfedmo", {"beta": 0.0}), ("pgfedmo_b", {"beta": 0.5})):
        cfg = tiny_config(name.removesuffix("_b"), {**args, **extra}, trainer={"fraction": 0.5, "rounds": 5})
        loop = make_loop(cfg)
        loop.fit()
        runs[name] = loop
    for cid in range(6):
        a, b = runs["pgfed"].clients.get(cid, {}), runs["pgfedmo"].clients.get(cid, {})
        if "personal" in a:
            assert torch.equal(a["personal"], b["personal"])
    assert torch.equal(runs["pgfed"].server["alpha"], runs["pgfedmo"].server["alpha"])
    for name in ("pgfed", "pgfedmo"):  # without momentum no client keeps an auxiliary gradient
        assert not any("aux" in runs[name].clients.get(cid, {}) for cid in range(6))
    assert any("aux" in runs["pgfedmo_b"].clients.get(cid, {}) for cid in range(6))
    assert not torch.equal(runs["pgfed"].server["global"], runs["pgfedmo_b"].server["global"])


def test_pgfedmo_auxiliary_gradient_is_a_momentum_average_over_participations():
    beta = 0.3
    loop = make_loop(tiny_config("pgfedmo", {"beta": beta}, trainer={"fraction": 0.5, "rounds": 6}))
    seen: dict[int, torch.Tensor] = {}
    repeats = 0
    for _ in range(6):
        payloads, _ = exchanged_round(loop)
        for cid, p in payloads.items():
            if "aux" not in p:
                continue
            repeats += cid in seen
            expected = p["aux"] if cid not in seen else (1 - beta) * p["aux"] + beta * seen[cid]
            torch.testing.assert_close(loop.clients[cid]["aux"], expected)
            seen[cid] = loop.clients[cid]["aux"].clone()
    assert repeats > 0  # some client did take part twice with an auxiliary gradient


def test_communication_bytes_ratio_to_fedavg():
    """Per round: PGFed downloads θ, g̃, ḡ and uploads θ, ∇f (≈2.5× FedAvg); PGFed-CE drops ḡ (2×)."""
    totals = {}
    for name in ("fedavg", "pgfed", "pgfed_ce"):
        loop = make_loop(tiny_config(name, trainer=HALF, model={"name": "mlp", "hidden": [64, 64]}))
        exchanged_round(loop)
        payloads, results = exchanged_round(loop)  # round 1: the auxiliary terms are exchanged
        totals[name] = sum(tensor_bytes(payloads[c]) + tensor_bytes(results[c]) for c in payloads)
    assert abs(totals["pgfed"] / totals["fedavg"] - 2.5) < 0.01
    assert abs(totals["pgfed_ce"] / totals["fedavg"] - 2.0) < 0.01


def test_kept_momentum_equals_one_optimizer_over_rounds():
    """With μ = 0, one client and keep_momentum, PGFed is SGD(momentum) whose state survives rounds."""
    cfg = tiny_config(
        "pgfed",
        {"mu": 0.0, "keep_momentum": True},
        data={"num_clients": 1, "min_samples": 1},
        client={"epochs": 1, "batch_size": 16, "momentum": 0.9},
        trainer={"rounds": 2},
    )
    loop = make_loop(cfg)
    loop.fit()
    seed_everything(cfg.seed, "init")
    net = build_model(cfg.model, loop.worker.data.input_shape, loop.worker.data.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=cfg.client.lr, momentum=0.9)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for r in range(2):
        gen = torch_generator(cfg.seed, r, 0, "train", "batches")
        order = idx[torch.randperm(len(idx), generator=gen)]
        for s in range(0, len(idx), 16):
            b = order[s : s + 16]
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    torch.testing.assert_close(loop.server["global"], expected, rtol=1e-5, atol=1e-6)
    fresh = make_loop(tiny_config("pgfed", {"mu": 0.0}, **{k: getattr(cfg, k) for k in ("data", "client", "trainer")}))
    fresh.fit()
    assert not torch.allclose(fresh.server["global"], expected, atol=1e-4)


def test_state_lives_in_dicts_resume_is_identical():
    cfg = tiny_config("pgfedmo", {"keep_momentum": True, "clip_alpha": True}, trainer=HALF, client={"momentum": 0.9})
    a = make_loop(cfg)
    a.run_round(), a.run_round()
    b = make_loop(cfg)
    b.checkpointer.load_state_dict(copy.deepcopy(a.checkpointer.state_dict()))
    a.run_round(), b.run_round()
    for key in ("global", "alpha", "grads", "c"):
        assert torch.equal(a.server[key], b.server[key])


def test_pgfed_alpha_stays_nonnegative_by_default():
    for name in ("pgfed", "pgfedmo", "pgfed_ce"):
        loop = make_loop(tiny_config(name, {"mu": 1.0, "eta2": 100.0}, trainer=HALF))
        for _ in range(3):
            loop.run_round()
        assert float(loop.server["alpha"].min()) == 0.0  # pushed to the bound and held there


@pytest.mark.parametrize("ce_scalar", ["per_client", "mean"])
def test_pgfed_ce_alpha_step_uses_the_server_scalars(ce_scalar):
    mu, eta2 = 0.5, 0.1
    cfg = tiny_config(
        "pgfed_ce",
        {"mu": mu, "eta2": eta2, "ce_scalar": ce_scalar},
        data={"num_clients": 3, "min_samples": 20},
        client={"epochs": 1, "batch_size": 10_000, "lr": 0.05},  # one batch: one α step
    )
    loop = make_loop(cfg)
    exchanged_round(loop)
    w = loop.server["global"].clone()
    p = loop.worker.flat.num_params
    grads, cs = [], []
    for j in range(3):
        g, f = _full_grad(loop, j, loop.clients[j]["personal"])
        grads.append(g)
        cs.append(mu * (f - float(g @ loop.clients[j]["personal"][:p])))
    dots = torch.tensor([mu * float(g @ w[:p]) for g in grads])
    if ce_scalar == "mean":
        dots = torch.full((3,), float(dots.mean()))
    expected = (1 / 3 - eta2 * (torch.tensor(cs) + dots)).clamp_min(0)
    payloads, results = exchanged_round(loop)
    for i in range(3):
        assert payloads[i]["dot"].numel() == (3 if ce_scalar == "per_client" else 1)
        torch.testing.assert_close(results[i]["alpha"], expected, rtol=1e-4, atol=1e-5)
