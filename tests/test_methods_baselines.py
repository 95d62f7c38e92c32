"""The PGFed table's baselines: properties only a correct implementation has."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.func import functional_call

from pfl.cli import main
from pfl.data import DataConfig
from pfl.methods import method_class, methods
from pfl.methods.base import ClientContext
from pfl.methods.heads import split_head
from pfl.models import build_model
from pfl.runner.args import parse_fit_args
from pfl.seeding import seed_everything, torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods_helpers import exchanged_round
from tests.methods_reference import drawn_batches, flat_params, initial_net

HALF = {"fraction": 0.5}
NEW = ("apfl", "pfedme", "perfedavg", "fedrep", "fedper", "lgfedavg", "fedrod", "fedbabu", "fedfomo", "feddyn")


def _fit(name, args=None, **groups):
    loop = make_loop(tiny_config(name, args, **{"trainer": HALF, **groups}))
    loop.fit()
    return loop


@pytest.mark.parametrize("name", NEW + ("pgfed", "pgfedmo", "pgfed_ce"))
def test_registered_runs_and_resumes_identically(name):
    assert name in methods()
    cfg = tiny_config(name, trainer=HALF)
    a = make_loop(cfg)
    a.run_round(), a.run_round()
    b = make_loop(cfg)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    a.run_round(), b.run_round()
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]
    for key, value in a.server.state.items():
        assert torch.equal(value, b.server[key]), key


def test_fedper_without_personal_layers_is_fedavg():
    a, b = _fit("fedavg"), _fit("fedper", {"personal_layers": 0})
    assert torch.equal(a.server["global"], b.server["global"])
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]
    c = _fit("fedper", {"personal_layers": 1})
    assert not torch.equal(a.server["global"], c.server["global"])


def test_lgfedavg_with_all_layers_global_is_fedavg():
    a, b = _fit("fedavg"), _fit("lgfedavg", {"global_layers": 2})  # the tiny MLP has 2 layers
    assert torch.equal(a.server["global"], b.server["global"])
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]


def test_layer_counts_are_checked():
    from pfl.errors import ConfigError

    with pytest.raises(ConfigError, match="method.global_layers"):
        make_loop(tiny_config("lgfedavg", {"global_layers": 3}))


# FedProx's synthetic data: every input feature varies, so the first weight (input feature 0) has a
# gradient; on digits feature 0 is a corner pixel, always 0, and freezing it or not shows nowhere.
SYNTHETIC = {"source": "synthetic", "num_clients": 6}


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


def test_fedbabu_head_stays_at_init_and_only_the_body_is_exchanged():
    loop = make_loop(tiny_config("fedbabu", trainer=HALF))
    head = loop.worker.flat.layout.tail(1)
    for _ in range(3):
        payloads, results = exchanged_round(loop)
    assert torch.equal(loop.server["global"][head], loop.init_state[head])
    assert not torch.equal(loop.server["global"][: head.start], loop.init_state[: head.start])
    for r in results.values():
        assert r.state.numel() == head.start  # body only (the MLP has no buffers)
    personal = loop.method.personal_state(loop.server, loop.client(0))  # fine-tuned: the head moves
    assert not torch.equal(personal[head], loop.init_state[head])


def test_feddyn_alpha_zero_is_fedavg():
    a, b = _fit("fedavg"), _fit("feddyn", {"alpha": 0.0, "weighting": "samples"})
    assert torch.equal(a.server["global"], b.server["global"])
    assert not any("g" in state for state in b.clients.values())  # nothing to keep per client


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_feddyn_server_and_client_updates_match_the_formulas(weighting):
    alpha = 0.1
    args = {"alpha": alpha} if weighting == "uniform" else {"alpha": alpha, "weighting": weighting}  # default: uniform
    loop = make_loop(tiny_config("feddyn", args, trainer=HALF))
    w0 = loop.server["global"].clone()
    _, results = exchanged_round(loop)
    n = loop.worker.data.num_clients
    weights = {c: (r.weight if weighting == "samples" else 1.0) for c, r in results.items()}
    assert len(set(weights.values())) > 1 or weighting == "uniform"
    total = sum(weights.values())
    mean = sum(r.state * (weights[c] / total) for c, r in results.items())
    h = -(alpha / n) * sum(r.state - w0 for r in results.values())
    torch.testing.assert_close(loop.server["h"], h)
    torch.testing.assert_close(loop.server["global"], mean - h / alpha)
    for cid, r in results.items():
        torch.testing.assert_close(loop.clients[cid]["g"], -alpha * (r.state - w0))


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


def test_pfedme_with_unit_proximal_steps_is_fedavg():
    """K = 1, λ·η_p = 1 and λ·η = 1 make θ ← w − η∇f(θ) and w ← θ: plain SGD, i.e. FedAvg."""
    lr = 0.1
    a = _fit("fedavg", client={"lr": lr})
    b = _fit("pfedme", {"lam": 1 / lr, "inner_steps": 1, "personal_lr": lr, "beta": 1.0}, client={"lr": lr})
    torch.testing.assert_close(a.server["global"], b.server["global"], rtol=1e-4, atol=1e-5)
    c = _fit("pfedme", client={"lr": lr})
    assert not torch.allclose(a.server["global"], c.server["global"], atol=1e-3)


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


def test_fedfomo_with_only_its_own_model_is_local():
    """With a validation split FedFomo trains on the whole train split (else it holds a part out)."""
    val = {"data": {"val_frac": 0.2}}
    a, b = _fit("local", **val), _fit("fedfomo", {"num_models": 0}, **val)
    assert a.clients.keys() == b.clients.keys()
    for cid in a.clients:
        assert torch.equal(a.clients[cid]["personal"], b.clients[cid]["personal"])
    c = _fit("fedfomo", {"num_models": 8}, trainer={"fraction": 0.5, "rounds": 4}, data={"alpha": 5.0})
    assert float(c.server["P"].abs().sum()) > 0  # similar clients (Dirichlet 5): downloads helped and were weighed


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


CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("path", sorted((CONF / "method").glob("*.yaml")), ids=lambda p: p.stem)
def test_method_configs_build_their_method(path):
    args = dict(yaml.safe_load(path.read_text())["method"])
    method = method_class(args.pop("name"))(**args)
    assert all(getattr(method, k) == v for k, v in args.items())


def test_digits_experiment_runs_every_new_method_from_the_cli(tmp_path):
    exp = str(CONF / "experiment" / "pgfed_digits_dir03.yaml")
    for name in ("pgfed_official", "fedrod"):
        rc = main(
            ["fit", "--config", exp, "--config", str(CONF / "method" / f"{name}.yaml"), "--trainer.rounds", "1"]
            + ["--trainer.progress", "false", "--tracking.root", str(tmp_path), "--tracking.name", name]
        )
        assert rc == 0
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["num_clients"] == 25 and summary["metrics"]["pm.l_acc.mean"] > 0


# -- update rules checked against plain-PyTorch loops ----------------------------------------------
def _one_client_loop(name, args, rounds=1, data=None, **client):
    cfg = tiny_config(
        name,
        args,
        data={"num_clients": 1, "min_samples": 1, **(data or {})},
        client={"epochs": 1, "batch_size": 16, "lr": 0.1, **client},
        trainer={"rounds": rounds},
    )
    loop = make_loop(cfg)
    loop.fit()
    return cfg, loop


def _grads(net, params, x, y):
    loss = F.cross_entropy(functional_call(net, params, (x,)), y)
    return torch.autograd.grad(loss, list(params.values()))


@pytest.mark.parametrize("prox", ["exact", "gradient", "autograd"])
def test_ditto_personal_model_matches_a_hand_written_loop(prox):
    lam, lr = 2.0, 0.1
    cfg, loop = _one_client_loop("ditto", {"lam": lam, "prox": prox}, rounds=2, lr=lr)
    net = initial_net(cfg, loop)
    names = [n for n, _ in net.named_parameters()]
    v = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for r in range(2):
        w = {n: p.detach().clone() for n, p in net.named_parameters()}
        for b in drawn_batches(cfg.seed, r, 0, "personal", idx, 16):
            live = {n: t.clone().requires_grad_(True) for n, t in v.items()}
            for n, g in zip(names, _grads(net, live, data.x[b], data.y[b]), strict=True):
                if prox == "exact":  # a gradient step on f, then the exact proximal step of λ/2‖v − w‖²
                    v[n] = (v[n] - lr * g + lr * lam * w[n]) / (1 + lr * lam)
                else:
                    v[n] = v[n] - lr * (g + lam * (v[n] - w[n]))
        for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            opt.step()
    expected = torch.cat([v[n].reshape(-1) for n in names])
    torch.testing.assert_close(loop.clients[0]["personal"], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loop.server["global"], flat_params(net), rtol=1e-5, atol=1e-6)


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
    method = parse_fit_args(["--config", str(CONF / "method" / "perfedavg.yaml")])[0].method
    assert (method.inner_lr, method.outer_lr) == (None, None)


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


def test_lgfedavg_shares_only_its_global_layers():
    loop = make_loop(tiny_config("lgfedavg", {"global_layers": 1}, trainer=HALF))
    head = loop.worker.flat.layout.head
    for _ in range(2):
        payloads, uploads = exchanged_round(loop)
    for cid, u in uploads.items():
        assert u.state.numel() == head.stop - head.start  # the classifier only
        assert torch.equal(payloads[cid]["shared"], payloads[next(iter(payloads))]["shared"])
    total = sum(u.weight for u in uploads.values())
    mean = sum(u.state * (u.weight / total) for u in uploads.values())
    torch.testing.assert_close(loop.server["global"][head], mean)
    assert torch.equal(loop.server["global"][: head.start], loop.init_state[: head.start])  # never averaged
    bodies = [loop.clients[c]["personal"][: head.start] for c in uploads]
    assert not torch.equal(bodies[0], bodies[1])  # each representation stays with its client
    for cid in uploads:
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        assert torch.equal(pm[head], loop.server["global"][head])
        assert torch.equal(pm[: head.start], loop.clients[cid]["personal"][: head.start])


@pytest.mark.parametrize("data", [{}, SYNTHETIC])
def test_lgfedavg_alternating_steps_match_the_authors_loop(data):
    args = {"global_layers": 1, "alternate": True}
    cfg, loop = _one_client_loop("lgfedavg", args, data={**data, "num_clients": 1}, momentum=0.9)
    net = initial_net(cfg, loop)
    head, body = list(net[-1].parameters()), [p for m in list(net)[:-1] for p in m.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for b in drawn_batches(cfg.seed, 0, 0, "train", idx, 16):
        for frozen in (head, body):
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            for p in frozen:
                p.grad.zero_()  # zeroed, not None: momentum still moves the frozen part
            opt.step()
    torch.testing.assert_close(loop.clients[0]["personal"], flat_params(net), rtol=1e-5, atol=1e-6)


def test_scaffold_steps_control_variates_and_aggregation_match_the_formulas():
    """Option II by hand over two rounds of half the clients: the local steps y ← y − η(∇f_i(y) − c_i + c),
    c_i⁺ = c_i − c + (x − y)/(Kη), the upload Δc_i = c_i⁺ − c_i, and the server's uniform mean of the
    y and c ← c + Σ Δc_i / N. Round 2 has c ≠ c_i, so every sign of the correction shows."""
    lr = 0.1
    cfg = tiny_config("scaffold", trainer=HALF, client={"lr": lr})
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
            y = {k: t.view_as(p) for (k, p), t in zip(net.named_parameters(), x.split(sizes), strict=True)}
            batches = drawn_batches(cfg.seed, r, cid, "train", data.clients[cid].train, 16)
            for b in batches:
                live = {k: t.clone().requires_grad_(True) for k, t in y.items()}
                grads = _grads(net, live, data.x[b], data.y[b])
                step = torch.cat([g.reshape(-1) for g in grads]) + (c - c_i)
                y = {k: t - lr * s.view_as(t) for (k, t), s in zip(y.items(), step.split(sizes), strict=True)}
            flat_y = torch.cat([t.reshape(-1) for t in y.values()])
            torch.testing.assert_close(up.state, flat_y, rtol=1e-5, atol=1e-6)
            c_new = c_i - c + (x - up.state) / (len(batches) * lr)
            torch.testing.assert_close(loop.clients[cid]["c"], c_new)
            torch.testing.assert_close(up["dc"], c_new - c_i)
            assert up.weight == 1.0  # uniform over the sampled clients, as in the paper
        assert len({len(data.clients[cid].train) for cid in results}) > 1  # a sample-weighted mean would differ
        mean = sum(up.state for up in results.values()) / len(results)
        torch.testing.assert_close(loop.server["global"], mean)
        torch.testing.assert_close(loop.server["c"], c + sum(up["dc"] for up in results.values()) / n)


def test_fedavg_finetuned_personal_model_is_sgd_from_the_global_model_on_the_finetune_batches():
    lr = 0.1
    cfg, loop = _one_client_loop("fedavg", {"finetune_epochs": 1}, lr=lr)
    net = initial_net(cfg, loop)
    ctx = loop.client(0)
    personal = loop.method.personal_state(loop.server, ctx)
    w = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for r, purpose in ((0, "train"), (ctx.round, "finetune")):
        for b in drawn_batches(cfg.seed, r, 0, purpose, idx, 16):
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            opt.step()
        if purpose == "train":
            w = flat_params(net)
            torch.testing.assert_close(loop.server["global"], w, rtol=1e-5, atol=1e-6)
    assert not torch.equal(personal, w)
    torch.testing.assert_close(personal, flat_params(net), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "per_step"), [("pfedme", 1), ("perfedavg", 2)])
def test_pfedme_and_perfedavg_record_their_own_loops_steps(name, per_step):
    """Methods running their own loop account for it: one step per batch (Per-FedAvg: per pair of batches)."""
    loop = make_loop(tiny_config(name))
    ctx = loop.client(1)
    loop.method.local_update(ctx, loop.method.payload(loop.server, 1))
    batches = len(list(ctx.batches()))
    assert batches > 4 and ctx.fits[-1].steps == batches // per_step
    assert ctx.fits[-1].samples_seen == ctx.num_samples * ctx.epochs


def _sgd_from(net, start, batches, data, lr, extra):
    """Plain SGD from the flat parameters ``start`` over ``batches``, adding ``extra(θ)`` to every gradient."""
    sizes = [p.numel() for p in net.parameters()]
    theta = start.clone()
    for b in batches:
        params = {k: t.view_as(p) for (k, p), t in zip(net.named_parameters(), theta.split(sizes), strict=True)}
        live = {k: t.clone().requires_grad_(True) for k, t in params.items()}
        grad = torch.cat([g.reshape(-1) for g in _grads(net, live, data.x[b], data.y[b])])
        theta = theta - lr * (grad + extra(theta))
    return theta


def test_feddyn_local_objective_is_the_dynamic_regulariser_over_rounds():
    """θ_i minimises f_i(θ) − ⟨g_i, θ⟩ + α/2‖θ − w‖²; from round 2 on g_i ≠ 0, so its sign shows."""
    alpha, lr = 0.1, 0.1
    cfg = tiny_config("feddyn", {"alpha": alpha}, trainer=HALF, client={"lr": lr})
    loop = make_loop(cfg)
    net = initial_net(cfg, loop)
    data = loop.worker.data
    seen_g = 0
    for r in range(3):
        g_before = {cid: loop.clients.get(cid, {}).get("g") for cid in range(data.num_clients)}
        payloads, results = exchanged_round(loop)
        for cid, up in results.items():
            w = payloads[cid]["global"]
            g = g_before[cid] if g_before[cid] is not None else torch.zeros_like(w)
            seen_g += bool(g.abs().sum() > 0)
            batches = drawn_batches(cfg.seed, r, cid, "train", data.clients[cid].train, 16)
            theta = _sgd_from(net, w, batches, data, lr, lambda t, g=g, w=w: -g + alpha * (t - w))
            torch.testing.assert_close(up.state, theta, rtol=1e-5, atol=1e-6)
    assert seen_g > 0
