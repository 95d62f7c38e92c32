"""Paper fidelity of the baselines: the numbers each method must produce, checked against hand-written
references or identities, and the authors'-code conventions offered as options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pfl.cli import main
from pfl.data import DataConfig, build_data
from pfl.engine.worker import TrainSettings, Worker
from pfl.methods.base import ClientContext
from pfl.methods.heads import split_head
from pfl.metrics.evaluate import evaluate_new_clients, score_segments
from pfl.models import ModelConfig, build_model
from pfl.seeding import torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods_helpers import exchanged_round
from tests.methods_reference import drawn_batches, flat_params, initial_net

CONF = Path(__file__).resolve().parents[1] / "conf" / "method"
HALF = {"fraction": 0.5}
ONE_CLIENT = {"num_clients": 1, "min_samples": 1}


# -- new clients of the layer-sharing methods ------------------------------------------------------
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


# -- pFedMe: every client updates its personal model every round (Algorithm 1) ----------------------
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


# -- FedFomo -------------------------------------------------------------------------------------
def test_fedfomo_validation_part_is_held_out_of_training(monkeypatch):
    loop = make_loop(tiny_config("fedfomo", trainer={"fraction": 1.0}))
    trained: dict[int, set[int]] = {}
    evaluated: dict[int, set[int]] = {}
    batches = loop.worker.epoch_batches
    evaluate = ClientContext.evaluate

    def spy_batches(cid, round_idx, purpose, epochs, indices=None):
        for e, b in batches(cid, round_idx, purpose, epochs, indices):
            trained.setdefault(cid, set()).update(b.tolist())
            yield e, b

    def spy_evaluate(self, state, on="val"):
        if not isinstance(on, str):
            evaluated.setdefault(self.cid, set()).update(on.tolist())
        return evaluate(self, state, on)

    monkeypatch.setattr(loop.worker, "epoch_batches", spy_batches)
    monkeypatch.setattr(ClientContext, "evaluate", spy_evaluate)
    for _ in range(2):  # round 1 weighs downloaded models on the validation part
        exchanged_round(loop)
    for cid in range(6):
        train = set(loop.worker.data.clients[cid].train.tolist())
        held = evaluated[cid]
        assert held and not held & trained[cid]
        assert held | trained[cid] == train
        assert len(held) == round(0.2 * len(train))


def test_fedfomo_validation_part_keeps_at_least_one_sample_on_each_side():
    small = 0
    for frac in (0.01, 0.99):
        loop = make_loop(tiny_config("fedfomo", {"val_frac": frac}))
        for cid in range(6):
            val, rest = loop.method.split(loop.client(cid))
            n = len(val) + len(rest)
            assert len(val) >= 1 and len(rest) >= 1
            if min(frac, 1 - frac) * n < 0.5:  # the rounded share would be 0 (or n): one sample on that side
                assert min(len(val), len(rest)) == 1
                small += 1
    assert small >= 2


def test_fedfomo_downloads_one_model_when_asked_even_from_a_two_client_round():
    loop = make_loop(tiny_config("fedfomo", {"num_models": 1, "epsilon": 0.0}, trainer={"fraction": 1 / 3}))
    payloads, _ = exchanged_round(loop)
    assert len(payloads) == 2 and all(p == {} for p in payloads.values())  # nothing to download yet
    a, b = sorted(payloads)
    got = loop.method.payload(loop.server, a)  # the only other model of the round is b's
    assert got["ids"].tolist() == [b] and len(got["models"]) == 1


@pytest.mark.parametrize("normalize", [True, False])
def test_fedfomo_affinity_accumulates_the_uploaded_weights(normalize):
    """P[i, j] += w_ij every round (normalised to sum 1 when asked and the sum is positive); near-IID data
    so that downloaded models sometimes beat a client's own."""
    args = {"normalize_affinity": normalize, "epsilon": 0.3}
    loop = make_loop(tiny_config("fedfomo", args, trainer={"fraction": 1.0}, data={"alpha": 100.0}))
    sums, again = [], 0
    for _ in range(4):
        before = loop.server["P"].clone()
        _, results = exchanged_round(loop)
        expected = before.clone()
        for cid, r in results.items():
            if "fomo" not in r.extras:
                continue
            w, total = r["fomo"], float(r["fomo"].sum())
            sums.append(total)
            again += bool(before[cid, r["ids"]].abs().sum() > 0)
            expected[cid, r["ids"]] += w / total if normalize and total > 0 else w
        torch.testing.assert_close(loop.server["P"], expected)
    assert again > 0 and any(0 < s < 1 for s in sums) and 0.0 in sums


def test_fedfomo_weight_of_a_model_at_zero_distance_divides_by_1e_12():
    from pfl.methods.fedfomo import fomo_weights

    w = fomo_weights(1.0, [0.5, 2.0, 0.0], [0.0, 1.0, 4.0])
    assert w.tolist() == torch.tensor([0.5 / 1e-12, 0.0, 0.25]).tolist()


def test_fedfomo_weights_and_the_move_follow_the_formula(monkeypatch):
    loop = make_loop(tiny_config("fedfomo", data={"val_frac": 0.2}, trainer={"fraction": 1.0}))
    exchanged_round(loop)
    cid = 0
    ctx = loop.client(cid)
    own = ctx.state["personal"]
    data, net, flat = loop.worker.data, loop.worker.module.net, loop.worker.flat
    val, p = data.clients[cid].val, flat.num_params

    def val_loss(state):
        with torch.no_grad():
            return float(F.cross_entropy(functional_call(net, flat.param_dict(state[:p]), (data.x[val],)), data.y[val]))

    grad, _ = _full_grad(loop, cid, own, val)
    better = own.clone()
    better[:p] -= 0.5 * grad  # a step down client 0's validation loss: a positive weight
    others = torch.stack([loop.clients[1]["personal"], loop.init_state, better])
    payload = {"models": others, "ids": torch.tensor([1, 2, 3])}
    starts = []
    fit = ClientContext.fit
    monkeypatch.setattr(ClientContext, "fit", lambda self, start, **kw: starts.append(start) or fit(self, start, **kw))
    upload = loop.method.local_update(ctx, payload)
    gains = torch.tensor([max(0.0, val_loss(own) - val_loss(m)) for m in others])
    dists = torch.stack([(m[:p] - own[:p]).norm() for m in others])
    expected = gains / dists
    assert (expected == 0).any() and (expected > 0).any()  # both cases are exercised
    torch.testing.assert_close(upload["fomo"], expected, rtol=1e-4, atol=1e-6)
    move = own + ((expected / expected.sum())[:, None] * (others - own)).sum(0)
    torch.testing.assert_close(starts[0], move, rtol=1e-4, atol=1e-6)
    loop.method.aggregate(loop.server, {cid: upload})
    torch.testing.assert_close(loop.server["P"][cid, 1:4], expected, rtol=1e-4, atol=1e-6)


def _fomo_server(args, affinity):
    loop = make_loop(tiny_config("fedfomo", {"num_models": 2, **args}))
    loop.server["prev_ids"] = torch.arange(6)
    loop.server["prev_models"] = torch.stack([loop.init_state] * 6)
    loop.server["P"][0] = torch.tensor(affinity)
    return loop


def _picks(loop, rounds, seed=0):
    out = []
    for r in rounds:
        loop.server.round, loop.server.seed = r, seed
        out.append(tuple(sorted(loop.method.payload(loop.server, 0)["ids"].tolist())))
    return out


def test_fedfomo_greedy_explores_with_decaying_epsilon():
    ranked = [0.0, 5.0, 4.0, 3.0, 2.0, 1.0]  # client 0's affinity: 1 and 2 are its best
    assert set(_picks(_fomo_server({"epsilon": 0.0}, ranked), range(30))) == {(1, 2)}
    explored = _picks(_fomo_server({"epsilon": 1.0, "epsilon_decay": 0.0}, ranked), range(30))
    assert {i for pick in explored for i in pick} == {1, 2, 3, 4, 5}
    decaying = _fomo_server({"epsilon": 1.0, "epsilon_decay": 0.5}, ranked)
    assert decaying.method.exploration(0) == 1.0 and decaying.method.exploration(1) == 0.5
    assert set(_picks(decaying, range(2, 30))) == {(1, 2)}  # ε_t = 0 from round 2 on


def test_fedfomo_breaks_affinity_ties_at_random_and_reproducibly():
    ties = [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]  # 1-4 tie for the two places
    loop = _fomo_server({}, ties)  # the default ε has decayed to 0 by round 6
    picks = _picks(loop, range(6, 40))
    assert len(set(picks)) > 1 and all(5 not in p for p in picks)
    assert picks == _picks(_fomo_server({}, ties), range(6, 40))
    assert picks != _picks(_fomo_server({}, ties), range(6, 40), seed=1)


def test_select_models_takes_each_slot_from_the_ranking_or_the_permutation():
    from pfl.methods.fedfomo import select_models

    gen = torch_generator(0, "test")
    chosen = select_models(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([10, 11, 12]), 5, 0.0, gen)
    assert chosen.tolist() == [10, 12, 11]  # all of them, by affinity, never twice


# -- the run's optimizer for every part: APFL's v, FedRoD's personal head ---------------------------
def _one_client(name, args, rounds=1, **client):
    cfg = tiny_config(
        name,
        args,
        data=ONE_CLIENT,
        client={"epochs": 1, "batch_size": 16, "lr": 0.1, **client},
        trainer={"rounds": rounds},
    )
    loop = make_loop(cfg)
    loop.fit()
    return cfg, loop


@pytest.mark.parametrize(("momentum", "keep"), [(0.0, False), (0.9, False), (0.9, True)])
def test_apfl_personal_model_uses_the_run_optimizer(momentum, keep):
    """Two rounds: v's optimizer, like w's, starts afresh each participation unless momentum is kept."""
    a = 0.3
    cfg, loop = _one_client("apfl", {"mix": a}, rounds=2, momentum=momentum, weight_decay=0.01, keep_momentum=keep)
    net = initial_net(cfg, loop)
    v = [p.detach().clone().requires_grad_(True) for p in net.parameters()]
    names = [n for n, _ in net.named_parameters()]
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for r in range(2):
        if r == 0 or not keep:
            opt_w = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum, weight_decay=0.01)
            opt_v = torch.optim.SGD(v, lr=0.1, momentum=momentum, weight_decay=0.01)
        for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
            x, y = data.x[b], data.y[b]
            mixed = {n: a * vp + (1 - a) * p.detach() for n, vp, p in zip(names, v, net.parameters(), strict=True)}
            opt_w.zero_grad(), opt_v.zero_grad()
            F.cross_entropy(net(x), y).backward()
            F.cross_entropy(functional_call(net, mixed, (x,)), y).backward()
            opt_w.step(), opt_v.step()
    torch.testing.assert_close(loop.server["global"], flat_params(net), rtol=1e-5, atol=1e-6)
    v_flat = torch.cat([p.detach().reshape(-1) for p in v])
    torch.testing.assert_close(loop.clients[0]["v"], v_flat, rtol=1e-5, atol=1e-6)
    assert ("v_momentum" in loop.clients[0]) == (keep and momentum > 0)


@pytest.mark.parametrize(
    ("momentum", "head_init", "keep"),
    [(0.0, "zero", False), (0.9, "zero", False), (0.9, "init", False), (0.9, "zero", True)],
)
def test_fedrod_personal_head_uses_the_run_optimizer_and_its_init(momentum, head_init, keep):
    """Two rounds: the head's optimizer, like the model's, starts afresh each participation unless kept."""
    cfg, loop = _one_client("fedrod", {"head_init": head_init}, rounds=2, momentum=momentum, keep_momentum=keep)
    net = initial_net(cfg, loop)
    body, head = split_head(net)
    ph = nn.Linear(head.in_features, head.out_features)
    with torch.no_grad():
        for q, h in zip(ph.parameters(), head.parameters(), strict=True):
            q.copy_(h if head_init == "init" else torch.zeros_like(h))
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    log_prior = torch.bincount(data.y[idx], minlength=data.num_classes).float().clamp_min(1e-8).log()
    for r in range(2):
        if r == 0 or not keep:
            opt_g = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
            opt_p = torch.optim.SGD(ph.parameters(), lr=0.1, momentum=momentum)
        for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
            x, y = data.x[b], data.y[b]
            z = body(x)
            out_g = head(z)
            opt_g.zero_grad(), opt_p.zero_grad()
            (F.cross_entropy(out_g + log_prior, y) + F.cross_entropy(out_g.detach() + ph(z.detach()), y)).backward()
            opt_g.step(), opt_p.step()
    torch.testing.assert_close(loop.server["global"], flat_params(net), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loop.clients[0]["head"], flat_params(ph), rtol=1e-5, atol=1e-6)
    assert ("head_momentum" in loop.clients[0]) == (keep and momentum > 0)


def test_fedrod_untrained_client_is_evaluated_with_its_initial_head():
    for head_init in ("zero", "init"):
        loop = make_loop(tiny_config("fedrod", {"head_init": head_init}))
        head = loop.worker.flat.layout.head
        pm = loop.method.personal_state(loop.server, loop.client(0))
        expected = loop.init_state[head] * (2 if head_init == "init" else 1)
        torch.testing.assert_close(pm[head], expected)


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


# -- PGFed -----------------------------------------------------------------------------------------
def test_pgfed_alpha_stays_nonnegative_by_default():
    for name in ("pgfed", "pgfedmo", "pgfed_ce"):
        loop = make_loop(tiny_config(name, {"mu": 1.0, "eta2": 100.0}, trainer=HALF))
        for _ in range(3):
            loop.run_round()
        assert float(loop.server["alpha"].min()) == 0.0  # pushed to the bound and held there


def _full_grad(loop, cid, state, idx=None):
    """∇f and f of client ``cid`` at ``state`` over its train split (or ``idx``), by plain autograd."""
    flat, data = loop.worker.flat, loop.worker.data
    params = state[: flat.num_params].clone().requires_grad_(True)
    idx = data.clients[cid].train if idx is None else idx
    logits = functional_call(loop.worker.module.net, flat.param_dict(params), (data.x[idx],))
    loss = F.cross_entropy(logits, data.y[idx])
    (grad,) = torch.autograd.grad(loss, params)
    return grad, float(loss.detach())


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


# -- drop_last, kept momentum, the method-level optimizer ------------------------------------------
def _worker(**settings):
    data = build_data(DataConfig(source="digits", num_clients=2, alpha=1.0, min_samples=20), 0)
    net = build_model(ModelConfig(name="mlp", hidden=[8]), data.input_shape, data.num_classes)
    return Worker(net, data, TrainSettings(**{"epochs": 2, "batch_size": 16, "lr": 0.1, **settings}), seed=0)


def test_drop_last_drops_exactly_the_remainder_batch():
    full, dropped = _worker(), _worker(drop_last=True)
    n = len(full.data.clients[0].train)
    assert n % 16
    a = list(full.epoch_batches(0, 3, "train", 2))
    b = list(dropped.epoch_batches(0, 3, "train", 2))
    per_epoch = -(-n // 16)
    remainders = [per_epoch - 1, 2 * per_epoch - 1]
    assert [len(x) for _, x in a if len(x) < 16] == [n % 16, n % 16]
    kept = [pair for i, pair in enumerate(a) if i not in remainders]
    assert len(b) == len(kept) and all(e == f and torch.equal(x, y) for (e, x), (f, y) in zip(b, kept, strict=True))
    small = _worker(drop_last=True, batch_size=10_000)  # fewer samples than one batch: one batch of all
    assert [len(x) for _, x in small.epoch_batches(0, 0, "train", 1)] == [n]


def test_kept_momentum_is_one_optimizer_over_rounds_for_any_method():
    lr = 0.1
    for name, args in (("fedavg", {}), ("local", {}), ("fedprox", {"mu": 0.0}), ("fedper", {"personal_layers": 0})):
        cfg, loop = _one_client(name, args, rounds=2, momentum=0.9, keep_momentum=True)
        net = initial_net(cfg, loop)
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        data, idx = loop.worker.data, loop.worker.data.clients[0].train
        for r in range(2):
            for b in drawn_batches(cfg.seed, r, 0, "train", idx, 16):
                opt.zero_grad()
                F.cross_entropy(net(data.x[b]), data.y[b]).backward()
                opt.step()
        model = loop.clients[0]["personal"] if name == "local" else loop.server["global"]
        torch.testing.assert_close(model, flat_params(net), rtol=1e-5, atol=1e-6, msg=name)
        # The method's own setting wins over client.keep_momentum.
        _, fresh = _one_client(name, {**args, "keep_momentum": False}, rounds=2, momentum=0.9, keep_momentum=True)
        other = fresh.clients[0]["personal"] if name == "local" else fresh.server["global"]
        assert not torch.allclose(other, model, atol=1e-4), name


def test_method_momentum_overrides_the_client_setting():
    def global_after(args, momentum):
        loop = make_loop(tiny_config("fedavg", args, client={"momentum": momentum}))
        loop.run_round()
        return loop

    base = global_after({}, 0.0)
    overridden = global_after({"client_momentum": 0.0}, 0.9)
    assert overridden.worker.settings.momentum == 0.0
    assert torch.equal(base.server["global"], overridden.server["global"])
    assert not torch.equal(base.server["global"], global_after({}, 0.9).server["global"])


def test_method_optimizer_override_wins_on_the_command_line_and_is_recorded(tmp_path):
    common = ["fit", "--method", "fedavg", "--trainer.rounds", "1", "--data.num_clients", "6", "--model.hidden", "[16]"]
    common += ["--trainer.progress", "false", "--tracking.wandb", "false", "--tracking.root", str(tmp_path)]
    runs = {
        "override": ["--method.client_momentum", "0.0", "--client.momentum", "0.9"],
        "plain": ["--client.momentum", "0.0"],
        "momentum": ["--client.momentum", "0.9"],
    }
    out = {}
    for name, extra in runs.items():
        assert main([*common, *extra, "--tracking.name", name]) == 0
        out[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert out["override"]["hparams"]["client_momentum"] == 0.0
    assert out["plain"]["hparams"]["client_momentum"] is None
    acc = {k: v["metrics"]["pm.l_loss.mean"] for k, v in out.items()}
    assert acc["override"] == acc["plain"] != acc["momentum"]


# -- buffers (BatchNorm statistics): averaged by default, local on request --------------------------
def bn_mlp(cfg, input_shape, num_classes):
    """An MLP with one BatchNorm layer: 32 float buffers (running mean and variance of 16 features)."""
    width = int(torch.tensor(input_shape).prod())
    return nn.Sequential(nn.Flatten(), nn.Linear(width, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, num_classes))


@pytest.fixture
def bn_model():
    return ModelConfig(name="tests.test_methods_fidelity:bn_mlp")


def test_buffers_are_averaged_with_the_parameters(bn_model):
    loop = make_loop(tiny_config("fedavg", model=bn_model, trainer=HALF))
    p, b = loop.worker.flat.num_params, loop.worker.flat.num_buffers
    assert b == 32  # running mean and variance of 16 features
    _, uploads = exchanged_round(loop)
    total = sum(u.weight for u in uploads.values())
    mean = sum(u.state * (u.weight / total) for u in uploads.values())
    torch.testing.assert_close(loop.server["global"], mean)
    assert not torch.equal(loop.server["global"][p:], loop.init_state[p:])


def test_local_buffers_stay_on_each_client(bn_model):
    shared = make_loop(tiny_config("fedavg", model=bn_model, trainer=HALF))
    local = make_loop(tiny_config("fedavg", {"share_buffers": False}, model=bn_model, trainer=HALF))
    p = local.worker.flat.num_params
    _, up_shared = exchanged_round(shared)
    _, up_local = exchanged_round(local)
    for cid, u in up_local.items():
        assert u.state.numel() == p  # parameters only
        torch.testing.assert_close(u.state, up_shared[cid].state[:p])  # same start in round 0
        assert torch.equal(local.clients[cid]["buffers"], up_shared[cid].state[p:])
        pm = local.method.personal_state(local.server, local.client(cid))
        assert torch.equal(pm[:p], local.server["global"][:p]) and torch.equal(pm[p:], local.clients[cid]["buffers"])
    torch.testing.assert_close(local.server["global"][:p], shared.server["global"][:p])
    assert torch.equal(local.server["global"][p:], local.init_state[p:])  # the server never averages them
    # Round 1: a returning client starts from the global parameters and its own statistics.
    cid = next(iter(up_local))
    start = local.method.start(local.client(cid), local.server["global"])
    assert torch.equal(start[p:], local.clients[cid]["buffers"]) and torch.equal(start[:p], local.server["global"][:p])


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


def test_client_optimizer_settings_are_validated():
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    with pytest.raises(ConfigError, match="method.client_momentum"):
        method_class("fedavg")(client_momentum=1.0)
    with pytest.raises(ConfigError, match="method.ce_scalar"):
        method_class("pgfed_ce")(ce_scalar="sum")
    with pytest.raises(ConfigError, match="method.eval_mix"):
        method_class("apfl")(eval_mix="best")
    with pytest.raises(ConfigError, match="method.epsilon"):
        method_class("fedfomo")(epsilon=2.0)


def test_new_settings_reach_the_worker():
    cfg = tiny_config("pgfed", {"keep_momentum": True, "client_momentum": 0.5}, client={"drop_last": True})
    s = make_loop(cfg).worker.settings
    assert (s.momentum, s.keep_momentum, s.drop_last) == (0.5, True, True)
    s = make_loop(tiny_config("pgfed", client={"momentum": 0.3, "keep_momentum": True})).worker.settings
    assert (s.momentum, s.keep_momentum, s.drop_last) == (0.3, True, False)


OFFICIAL = ("local", "fedavg", "apfl", "fedrep", "fedrod", "pfedme", "perfedavg", "fedbabu", "fedfomo", "feddyn")
OFFICIAL += ("lgfedavg", "fedper", "pgfed", "pgfedmo")


@pytest.mark.parametrize("name", OFFICIAL)
def test_every_baseline_of_the_pgfed_code_has_an_official_config(name):
    import yaml

    from pfl.methods import method_class

    conf = yaml.safe_load((CONF / f"{name}_official.yaml").read_text())
    args = dict(conf["method"])
    method = method_class(args.pop("name"))(**args)
    assert conf["client"]["drop_last"] is True  # their loaders drop the last incomplete batch
    if hasattr(method, "client_momentum") and name not in ("perfedavg", "pfedme"):
        assert method.client_momentum in (0.0, 0.9)  # stated, so --client.momentum cannot change it
    paper = yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"]
    assert paper["name"] == conf["method"]["name"] and paper != conf["method"]


# -- declarations: defaults, class flags, validation -----------------------------------------------
BASELINES = ("local", "fedavg", "fedprox", "feddyn", "ditto", "apfl", "fedrod", "pfedme", "perfedavg", "fedper")
BASELINES += ("fedrep", "lgfedavg", "fedbabu", "fedfomo", "pgfed", "pgfedmo", "pgfed_ce")
# (has_global_model, has_personal_model): what the evaluation reports for each method (gm.*, P-models).
FLAGS = {"local": (False, True), "fedavg": (True, False), "fedprox": (True, False), "feddyn": (True, False)}
FLAGS |= {n: (False, True) for n in ("fedper", "fedrep", "lgfedavg", "fedfomo")}
FLAGS |= {n: (True, True) for n in ("ditto", "apfl", "fedrod", "pfedme", "perfedavg", "fedbabu", "pgfed", "pgfedmo")}
FLAGS |= {"pgfed_ce": (True, True)}


@pytest.mark.parametrize("name", BASELINES)
def test_defaults_are_the_paper_config_and_flags_are_declared(name):
    import yaml

    from pfl.methods import method_class

    conf = dict(yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"])
    cls = method_class(conf.pop("name"))
    default = cls()
    assert {k: getattr(default, k) for k in conf} == conf  # the class defaults are the paper's, as documented
    hparams = default.hparams()
    assert hparams.items() >= conf.items()
    inherited = {k: v for k, v in hparams.items() if k not in conf}  # fixed by the subclass: reported neutral
    assert inherited.items() <= {"finetune_epochs": 0, "share_buffers": True}.items()
    assert (cls.has_global_model, cls.has_personal_model) == FLAGS[name]
    assert cls.name == name and len(cls.description) > 20


BOUNDS = [
    ("ditto", "lam", 0.0, -0.01),
    ("ditto", "personal_epochs", 1, 0),
    ("ditto", "prox", "gradient", "exactly"),
    ("perfedavg", "inner_lr", 0.0, -0.01),
    ("perfedavg", "outer_lr", 1e-6, 0.0),
    ("pfedme", "lam", 0.0, -0.01),
    ("pfedme", "inner_steps", 1, 0),
    ("pfedme", "personal_lr", 1e-6, 0.0),
    ("pfedme", "beta", 1e-6, 0.0),
    ("pfedme", "personal_l2", 0.0, -0.01),
    ("apfl", "mix", 0.0, -0.01),
    ("apfl", "mix", 1.0, 1.01),
    ("apfl", "eval_mix", "local", "mixed"),
    ("fedfomo", "num_models", 0, -1),
    ("fedfomo", "val_frac", 0.01, 0.0),
    ("fedfomo", "val_frac", 0.99, 1.0),
    ("fedfomo", "epsilon", 0.0, -0.01),
    ("fedfomo", "epsilon", 1.0, 1.01),
    ("fedfomo", "epsilon_decay", 0.0, -0.01),
    ("feddyn", "alpha", 0.0, -0.01),
    ("feddyn", "weighting", "samples", "median"),
    ("fedrod", "head_lr", 1e-6, 0.0),
    ("fedrod", "head_init", "init", "ones"),
    ("fedavg", "finetune_epochs", 0, -1),
    ("fedavg", "client_momentum", 0.0, -0.01),
    ("fedavg", "client_momentum", 0.99, 1.0),
    ("fedprox", "mu", 0.0, -0.01),
    ("fedper", "personal_layers", 0, -1),
    ("fedrep", "head_epochs", 0, -1),
    ("lgfedavg", "global_layers", 0, -1),
    ("fedbabu", "head_layers", 0, -1),
    ("fedbabu", "finetune_epochs", 0, -1),
    ("fedbabu", "finetune_lr", 1e-6, 0.0),
    ("pgfed", "mu", 0.0, -0.01),
    ("pgfed", "eta2", 0.0, -0.01),
    ("pgfed", "beta", 0.0, -0.01),
    ("pgfed", "beta", 0.99, 1.0),
    ("pgfed", "alpha_init", 0.0, -0.01),
    ("pgfed_ce", "ce_scalar", "mean", "sum"),
    ("fedsam", "rho", 0.0, -0.01),
    ("fedsam", "p", 1.0, 0.99),
    ("fedala", "eta", 0.0, -0.01),
    ("fedala", "rand_percent", 0.5, 0.0),
    ("fedala", "rand_percent", 100.0, 100.01),
    ("fedala", "layer_idx", 0, -1),
    ("fedala", "threshold", 0.0, -0.01),
    ("fedala", "num_pre_loss", 1, 0),
    ("fedala", "max_start_epochs", 1, 0),
    ("fedamp", "alpha_k", 1e-6, 0.0),
    ("fedamp", "alpha_k", 1.0, float("inf")),
    ("fedamp", "sigma", 1e-6, 0.0),
    ("fedamp", "lam", 0.0, -0.01),
    ("fedu", "eta", 1e-6, 0.0),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})


def test_fedfomo_distances_are_over_the_parameters_only(bn_model, monkeypatch):
    import pfl.methods.fedfomo as fomo

    seen, weights = [], fomo.fomo_weights
    monkeypatch.setattr(fomo, "fomo_weights", lambda own, losses, d: seen.append(d) or weights(own, losses, d))
    loop = make_loop(tiny_config("fedfomo", model=bn_model, trainer={"fraction": 1.0}))
    p = loop.worker.flat.num_params
    exchanged_round(loop)  # round 0: nothing to download
    own = {cid: loop.clients[cid]["personal"].clone() for cid in range(6)}
    payloads, _ = exchanged_round(loop)
    expected = [[float((m[:p] - own[cid][:p]).norm()) for m in pl["models"]] for cid, pl in payloads.items()]
    assert seen == expected and loop.worker.flat.num_buffers > 0
