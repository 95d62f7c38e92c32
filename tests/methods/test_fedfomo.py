"""Tests of pfl/methods/fedfomo.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl.methods.base import ClientContext
from pfl.seeding import torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    _fit,
    _full_grad,
    exchanged_round,
)


def test_fedfomo_with_only_its_own_model_is_local():
    """With a validation split FedFomo trains on the whole train split (else it holds a part out)."""
    val = {"data": {"val_frac": 0.2}}
    a, b = _fit("local", **val), _fit("fedfomo", {"num_models": 0}, **val)
    assert a.clients.keys() == b.clients.keys()
    for cid in a.clients:
        assert torch.equal(a.clients[cid]["personal"], b.clients[cid]["personal"])
    c = _fit("fedfomo", {"num_models": 8}, trainer={"fraction": 0.5, "rounds": 4}, data={"alpha": 5.0})
    assert float(c.server["P"].abs().sum()) > 0  # similar clients (Dirichlet 5): downloads helped and were weighed


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


def test_fedfomo_affinity_delta_of_a_model_at_zero_distance_divides_by_1e_12():
    from pfl.methods.fedfomo import affinity_deltas

    w = affinity_deltas(1.0, [0.5, 2.0, 0.0], [0.0, 1.0, 4.0])
    assert w.tolist() == torch.tensor([0.5 / 1e-12, -1.0, 0.25]).tolist()


def _client_zero_downloads_three_models(monkeypatch, args):
    """After one round of a fedfomo run with ``args``, client 0's local update over three downloaded models:
    client 1's, the initial one and one a step down client 0's validation loss (a positive weight). Returns
    (loop, upload, own model, the three models, the validation loss of a state, the start of its fit)."""
    loop = make_loop(tiny_config("fedfomo", args, data={"val_frac": 0.2}, trainer={"fraction": 1.0}))
    exchanged_round(loop)
    ctx = loop.client(0)
    own = ctx.state["personal"]
    data, net, flat = loop.worker.data, loop.worker.module.net, loop.worker.flat
    val, p = data.clients[0].val, flat.num_params

    def val_loss(state):
        with torch.no_grad():
            return float(F.cross_entropy(functional_call(net, flat.param_dict(state[:p]), (data.x[val],)), data.y[val]))

    grad, _ = _full_grad(loop, 0, own, val)
    better = own.clone()
    better[:p] -= 0.5 * grad
    others = torch.stack([loop.clients[1]["personal"], loop.init_state, better])
    starts = []
    fit = ClientContext.fit
    monkeypatch.setattr(ClientContext, "fit", lambda self, start, **kw: starts.append(start) or fit(self, start, **kw))
    upload = loop.method.local_update(ctx, {"models": others, "ids": torch.tensor([1, 2, 3])})
    return loop, upload, own, others, val_loss, starts[0]


def test_fedfomo_weights_and_the_move_follow_the_formula(monkeypatch):
    loop, upload, own, others, val_loss, start = _client_zero_downloads_three_models(monkeypatch, {})
    p = loop.worker.flat.num_params
    gains = torch.tensor([max(0.0, val_loss(own) - val_loss(m)) for m in others])
    dists = torch.stack([(m[:p] - own[:p]).norm() for m in others])
    expected = gains / dists
    assert (expected == 0).any() and (expected > 0).any()  # both cases are exercised
    torch.testing.assert_close(upload["fomo"], expected, rtol=1e-4, atol=1e-6)
    move = own + ((expected / expected.sum())[:, None] * (others - own)).sum(0)
    torch.testing.assert_close(start, move, rtol=1e-4, atol=1e-6)
    loop.method.aggregate(loop.server, {0: upload})
    torch.testing.assert_close(loop.server["P"][0, 1:4], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("normalize", [True, False])
def test_fedfomo_signed_affinity_and_l1_distance_follow_the_authors_rule(monkeypatch, normalize):
    """``affinity: signed``, ``distance: l1``: the upload is (L_i(θ_i) − L_i(θ_j)) / ‖θ_j − θ_i‖₁ with its sign,
    the client still moves by the positive part only, and P adds the upload divided by |its sum| when
    ``normalize_affinity`` (the FedFomo authors' code), as it is otherwise: a worse model lowers P."""
    args = {"affinity": "signed", "distance": "l1", "normalize_affinity": normalize}
    loop, upload, own, others, val_loss, start = _client_zero_downloads_three_models(monkeypatch, args)
    p = loop.worker.flat.num_params
    signed = torch.tensor([val_loss(own) - val_loss(m) for m in others])
    expected = signed / torch.stack([(m[:p] - own[:p]).abs().sum() for m in others])
    assert (expected < 0).any() and (expected > 0).any()
    torch.testing.assert_close(upload["fomo"], expected, rtol=1e-4, atol=1e-6)
    positive = expected.clamp_min(0)
    torch.testing.assert_close(start, own + ((positive / positive.sum())[:, None] * (others - own)).sum(0))
    before = loop.server["P"][0, 1:4].clone()
    loop.method.aggregate(loop.server, {0: upload})
    added = expected / expected.sum().abs() if normalize else expected
    torch.testing.assert_close(loop.server["P"][0, 1:4] - before, added, rtol=1e-4, atol=1e-6)


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


def test_fedfomo_distances_are_over_the_parameters_only(bn_model, monkeypatch):
    import pfl.methods.fedfomo as fomo

    seen, deltas = [], fomo.affinity_deltas
    monkeypatch.setattr(fomo, "affinity_deltas", lambda own, losses, d: seen.append(d) or deltas(own, losses, d))
    loop = make_loop(tiny_config("fedfomo", model=bn_model, trainer={"fraction": 1.0}))
    p = loop.worker.flat.num_params
    exchanged_round(loop)  # round 0: nothing to download
    own = {cid: loop.clients[cid]["personal"].clone() for cid in range(6)}
    payloads, _ = exchanged_round(loop)
    expected = [[float((m[:p] - own[cid][:p]).norm()) for m in pl["models"]] for cid, pl in payloads.items()]
    assert seen == expected and loop.worker.flat.num_buffers > 0
