"""The evaluation pipeline on federations whose answers are known: a fixed model with known per-sample
correctness, communication of real methods, P-model sources, round selection, reference, new
clients, regression and the run's figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from pfl.data import ClientSplit, FederatedData, build_data
from pfl.engine.trainer import ClientTrainer, FitSpec, TrainSettings
from pfl.errors import ConfigError
from pfl.federation.loop import comparable_metrics
from pfl.methods import ClientContext
from pfl.methods.fedavg import FedAvg
from pfl.metrics.evaluate import EvalSets, evaluate_federation
from pfl.runner.assembly import build_loop
from pfl.runner.outputs import FileOutputs, RunFiles
from pfl.runner.plan import plan_run
from pfl.runner.reference import ensure_local_reference, reference_key
from tests.conftest import make_loop, tiny_config

# -- a model with known answers -------------------------------------------------------------------
# Linear(2, 2) with identity weights predicts argmax(x); x = e_pred, y = pred (correct) or 1 - pred.
CORRECT = {"c0": [1, 1, 1, 1], "c1": [1, 0, 1, 0], "c2": [0, 0, 1, 0, 0], "c3": [0, 0], "global": [1, 0, 1, 1, 0]}


def known_federation():
    xs, ys, splits, start = [], [], {}, 0
    rng = np.random.default_rng(0)
    for name, flags in {**CORRECT, **{f"t{k}": [1, 1] for k in range(4)}}.items():
        preds = rng.integers(0, 2, len(flags))
        xs += [np.eye(2, dtype=np.float32)[p] for p in preds]
        ys += [int(p) if f else 1 - int(p) for p, f in zip(preds, flags, strict=True)]
        splits[name] = torch.arange(start, start + len(flags))
        start += len(flags)
    clients = [ClientSplit(splits[f"t{k}"], splits[f"c{k}"]) for k in range(4)]
    data = FederatedData("known", torch.tensor(np.stack(xs)), torch.tensor(ys), 2, clients, splits["global"])
    worker = ClientTrainer(nn.Sequential(nn.Flatten(), nn.Linear(2, 2)), data, TrainSettings(), seed=0)
    state = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # weight = I, bias = 0
    correct = torch.zeros(len(ys))
    for name, flags in CORRECT.items():
        correct[splits[name]] = torch.tensor(flags, dtype=torch.float32)
    return worker, state, correct


def test_every_metric_matches_the_hand_computed_value():
    worker, state, correct = known_federation()
    sets = EvalSets.build(worker, seed=0, share_of_others=0.5)
    ctx = lambda cid: ClientContext(cid, 0, worker, {}, state)  # noqa: E731
    m, rows = evaluate_federation(FedAvg(), {"global": state}, worker, ctx, sets, reference=[1.0, 0.4, 0.2, 0.25])
    per_client = [1.0, 0.5, 0.2, 0.0]
    assert [r["pm.l_acc"] for r in rows] == per_client == [r["gm.l_acc"] for r in rows]
    assert m["pm.l_acc.mean"] == pytest.approx(0.425)
    assert m["pm.l_acc.std"] == pytest.approx(np.std(per_client))
    assert (m["pm.l_acc.top5"], m["pm.l_acc.bottom5"]) == (1.0, 0.0)
    assert m["gm.acc"] == pytest.approx(0.6)
    # S/G-tests: the accuracy on exactly the drawn samples (hand-computed from per-sample correctness);
    # the paper's S-test = own test + (m - 1)·c = round(3 × 0.5) = 2 other clients' tests, each own-sized.
    for cid, row in enumerate(rows):
        n = len(worker.data.clients[cid].test)
        assert len(sets.s[cid]) == 3 * n and len(sets.g[cid]) == n
        assert row["pm.s_acc"] == pytest.approx(float(correct[sets.s[cid]].mean()))
        assert row["pm.g_acc"] == pytest.approx(float(correct[sets.g[cid]].mean()))
    # LOCAL reference: ties (1.0 vs 1.0, 0.2 vs 0.2) pass, 0.0 < 0.25 fails.
    assert m["ptr"] == 0.75
    assert m["r_acc.mean"] == pytest.approx((0.0 + 0.25 + 0.0 - 1.0) / 4)
    assert m["gain.mean"] == pytest.approx((0.0 + 0.1 + 0.0 - 0.25) / 4)


def test_eval_sets_are_seeded_and_fixed():
    worker, _, _ = known_federation()
    a, b = EvalSets.build(worker, 3, 0.5), EvalSets.build(worker, 3, 0.5)
    assert all(torch.equal(x, y) for x, y in zip(a.s + a.g, b.s + b.g, strict=True))


def test_one_model_call_per_distinct_model_not_per_client_or_sample():
    worker, state, _ = known_federation()
    calls = []
    worker.module.net.register_forward_hook(lambda *_: calls.append(1))
    ctx = lambda cid: ClientContext(cid, 0, worker, {}, state)  # noqa: E731
    sets = EvalSets.build(worker, 0, 0.5)
    shared, _ = evaluate_federation(FedAvg(), {"global": state}, worker, ctx, sets)
    assert len(calls) == 1  # FedAvg's P-models are the global model: one pass scores them all
    calls.clear()
    own = {cid: state.clone() for cid in range(worker.data.num_clients)}  # equal values, distinct models
    apart, _ = evaluate_federation(FedAvg(), {"global": state}, worker, ctx, sets, personal=own.__getitem__)
    assert len(calls) == worker.data.num_clients + 1  # each P-model once, the global model once
    assert shared == apart  # batching changes the passes, not the numbers


def test_a_p_model_scores_each_sample_once_however_many_sets_hold_it():
    """The paper's S-test repeats samples (a small other test is drawn with replacement) and overlaps
    the G-test: the model still sees each distinct sample of a client's sets once."""
    worker, state, correct = known_federation()
    sets = EvalSets.build(worker, 0, 0.5)
    seen = []
    worker.module.net.register_forward_hook(lambda _m, inputs, _o: seen.append(len(inputs[0])))
    own = {cid: state.clone() for cid in range(worker.data.num_clients)}
    ctx = lambda cid: ClientContext(cid, 0, worker, {}, state)  # noqa: E731
    _, rows = evaluate_federation(FedAvg(), {"global": state}, worker, ctx, sets, personal=own.__getitem__)
    per_model = seen[: worker.data.num_clients]
    for cid, n in enumerate(per_model):
        split = worker.data.clients[cid]
        union = torch.cat([split.test, split.val, sets.s[cid], sets.g[cid]]).unique()
        assert n == len(union) < len(split.test) + len(split.val) + len(sets.s[cid]) + len(sets.g[cid])
        assert rows[cid]["pm.s_acc"] == float(correct[sets.s[cid]].sum()) / len(sets.s[cid])


# -- communication ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fedavg", "ditto"])
def test_fedavg_bytes_are_two_models_per_sampled_client(method):
    loop = make_loop(tiny_config(method, trainer={"rounds": 2, "clients_per_round": 3}))
    m = loop.fit()["metrics"]
    model_bytes = loop.flat.state.numel() * loop.flat.state.element_size()
    per_round = 3 * model_bytes
    assert m["comm.up_bytes.per_round"] + m["comm.down_bytes.per_round"] == 2 * per_round
    assert m["comm.up_bytes.total"] == m["comm.down_bytes.total"] == 2 * per_round


def test_local_exchanges_nothing():
    m = make_loop(tiny_config("local", trainer={"rounds": 1})).fit()["metrics"]
    assert m["comm.up_bytes.total"] == m["comm.down_bytes.total"] == 0


# -- which model is the P-model ----------------------------------------------------------------------
def test_pm_source_local_update_uses_the_model_trained_before_aggregation():
    loop = make_loop(
        tiny_config("fedavg", trainer={"rounds": 1, "clients_per_round": 3}, eval={"pm_source": "local_update"})
    )
    loop.fit()
    sampled = sorted(loop.evals.trained)
    assert len(sampled) == 3
    for row in loop.client_rows:
        cid = row["client"]
        test = loop.worker.data.clients[cid].test
        if cid in sampled:
            loop.worker.train(cid, loop.init_state, 0)  # the same keyed local update, redone by hand
            assert torch.equal(loop.worker.snapshot(), loop.evals.trained[cid])
            assert row["pm.l_acc"] == pytest.approx(loop.worker.evaluate(loop.evals.trained[cid], test).acc)
        else:  # never trained: the global model
            assert row["pm.l_acc"] == row["gm.l_acc"]
    assert any(loop.client_rows[c]["pm.l_acc"] != loop.client_rows[c]["gm.l_acc"] for c in sampled)


@pytest.mark.parametrize("name", ["ditto", "apfl", "fedrod", "pfedme", "perfedavg", "local"])
def test_pm_source_local_update_leaves_methods_with_personal_models_alone(name):
    """FedPG's convention replaces the P-model only of methods that have none of their own."""
    cfg = tiny_config(name, trainer={"rounds": 2})
    own = make_loop(cfg).fit()
    swapped = make_loop(tiny_config(name, trainer={"rounds": 2}, eval={"pm_source": "local_update"})).fit()
    assert swapped["pm_source"] == "method"
    assert comparable_metrics(swapped) == comparable_metrics(own)


def test_pm_source_local_update_scores_the_locally_trained_model_of_global_only_methods():
    cfg = tiny_config("fedavg", trainer={"rounds": 2}, eval={"pm_source": "local_update"})
    loop = make_loop(cfg)
    s = loop.fit()
    assert s["pm_source"] == "local_update"
    cid = 0
    trained = loop.evals.trained[cid]
    expected = loop.worker.evaluate(trained, loop.worker.data.clients[cid].test).acc
    assert loop.client_rows[cid]["pm.l_acc"] == pytest.approx(expected)
    assert s["metrics"]["pm.l_acc.mean"] != s["metrics"]["gm.l_acc.mean"]


# -- which round is reported ----------------------------------------------------------------------
def test_best_val_reports_the_best_validation_round():
    cfg = tiny_config("fedavg", trainer={"rounds": 4}, data={"val_frac": 0.2}, eval={"select": "best_val"})
    loop = make_loop(cfg)
    s = loop.fit()
    vals = [h["pm.val_acc.mean"] for h in loop.history]
    best = loop.history[int(np.argmax(vals))]
    assert s["selected_round"] == best["round"]
    assert s["metrics"]["pm.l_acc.mean"] == best["pm.l_acc.mean"]


def test_best_val_without_validation_split_fails_early():
    with pytest.raises(ConfigError, match="eval.select"):
        make_loop(tiny_config("fedavg", eval={"select": "best_val"})).fit()


def test_best_test_labels_every_selected_key():
    loop = make_loop(tiny_config("fedavg", trainer={"rounds": 3}, eval={"select": "best_test", "target": 0.0}))
    s = loop.fit()
    round_keys = [k for k in s["metrics"] if k != "rounds_to_target"]
    assert round_keys and all(k.startswith("best_test.") for k in round_keys)
    best = max(loop.history, key=lambda h: h["pm.l_acc.mean"])
    assert s["metrics"]["best_test.pm.l_acc.mean"] == best["pm.l_acc.mean"]
    assert s["metrics"]["rounds_to_target"] == 1 and s["select"] == "best_test"


# -- the LOCAL reference ------------------------------------------------------------------------
def test_local_reference_is_run_once_then_reused(tmp_path):
    track = {"root": str(tmp_path), "wandb": False}
    s1 = make_loop(tiny_config("fedavg", eval={"reference": "local"}, tracking=track)).fit()
    local = make_loop(tiny_config("local"))
    local.fit()
    ref = [r["pm.l_acc"] for r in local.client_rows]
    assert s1["reference"]["reused"] is False and s1["reference"]["method"] == "local"
    stored = json.loads((tmp_path / "_reference" / f"local-{s1['reference']['key']}" / "reference.json").read_text())
    assert stored["values"] == ref  # the cached reference is what a LOCAL run gives on this split and seed
    loop = make_loop(tiny_config("ditto", eval={"reference": "local"}, tracking=track))
    s2 = loop.fit()
    assert s2["reference"]["reused"] is True and s2["reference"]["key"] == s1["reference"]["key"]
    values = [r["pm.l_acc"] for r in loop.client_rows]
    assert s2["metrics"]["ptr"] == pytest.approx(np.mean([v >= r for v, r in zip(values, ref, strict=True)]))
    assert s2["metrics"]["gain.mean"] == pytest.approx(np.mean(np.subtract(values, ref)))
    assert reference_key(tiny_config("ditto", seed=0)) == reference_key(tiny_config("fedavg", seed=0))
    assert reference_key(tiny_config("fedavg", seed=1)) != reference_key(tiny_config("fedavg", seed=0))
    assert reference_key(tiny_config("fedavg", data={"alpha": 0.1})) != reference_key(tiny_config("fedavg"))


# -- held-out new clients -------------------------------------------------------------------------
def _with_new_client(cfg):
    data = build_data(cfg.data, cfg.seed)
    data.new_clients = [data.clients.pop()]  # the last client never takes part
    return data


@pytest.mark.parametrize("epochs", [0, 2])
def test_new_clients_are_scored_after_fine_tuning_the_global_model(epochs):
    cfg = tiny_config("fedavg", trainer={"rounds": 2}, eval={"new_client_epochs": epochs})
    loop = build_loop(plan_run(cfg, _with_new_client(cfg)))
    m = loop.fit()["metrics"]
    w, split = loop.worker, loop.worker.new_clients[0]
    start = loop.server["global"]
    if epochs:
        w.train(w.data.num_clients, start, loop.round, FitSpec(epochs=epochs, purpose="new_client"))
        start = w.snapshot()
    assert m["new.acc.mean"] == pytest.approx(w.evaluate(start, split.test).acc)
    assert m["new.acc.std"] == 0.0


def test_no_new_clients_no_new_keys():
    m = make_loop(tiny_config("fedavg", trainer={"rounds": 1})).fit()["metrics"]
    assert not any(k.startswith("new.") for k in m)


# -- regression ------------------------------------------------------------------------------------
def linear_regression_federation(num_clients=4, n=40, dim=3, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=dim)
    x = rng.normal(size=(num_clients * n, dim)).astype(np.float32)
    y = (x @ w + 0.05 * rng.normal(size=len(x))).astype(np.float32)
    clients = [
        ClientSplit(torch.arange(k * n, k * n + 30), torch.arange(k * n + 30, (k + 1) * n)) for k in range(num_clients)
    ]
    return FederatedData("linreg", torch.tensor(x), torch.tensor(y), 1, clients, torch.zeros(0, dtype=torch.long))


def test_regression_mae_and_reference(tmp_path):
    data = linear_regression_federation()
    cfg = tiny_config(
        "fedavg",
        trainer={"rounds": 3},
        model={"name": "logreg"},
        eval={"reference": "local", "protocols": ["local", "sg", "global", "new"]},
        tracking={"root": str(tmp_path), "wandb": False},
    )
    loop = build_loop(plan_run(cfg, data), reference=ensure_local_reference(cfg, data, None))
    zero = torch.zeros_like(loop.init_state)
    m0, rows0 = evaluate_federation(FedAvg(), {"global": zero}, loop.worker, loop.client)
    for cid, row in enumerate(rows0):  # the zero model predicts 0: its MAE is the mean |y|
        assert row["pm.mae"] == pytest.approx(float(data.y[data.clients[cid].test].abs().mean()), rel=1e-5)
    before = evaluate_federation(FedAvg(), loop.server, loop.worker, loop.client)[0]["pm.mae.mean"]
    s = loop.fit()
    m = s["metrics"]
    assert s["task"] == "regression" and m["pm.mae.mean"] < 0.5 * before
    assert {"r_mae.mean", "ptr_mae", "gain_mae.mean", "pm.s_mae.mean", "pm.g_mae.mean"} <= set(m)
    assert not any("acc" in k for k in m)
    assert 0.0 <= m["ptr_mae"] <= 1.0


# -- figures -------------------------------------------------------------------------------------
def test_fit_writes_curves_and_client_histogram(tmp_path):
    loop = make_loop(
        tiny_config("fedavg", trainer={"rounds": 2}), run_dir=tmp_path, callbacks=[FileOutputs(RunFiles(tmp_path))]
    )
    loop.fit()
    for name in ("curves.png", "clients_hist.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_bad_eval_options_name_the_field():
    from pfl.config import validate

    bad = (("select", "best"), ("reference", "fedavg"), ("pm_source", "x"), ("s_acc_others", 0.0), ("s_test", "half"))
    for field, value in bad:
        with pytest.raises(ConfigError, match=f"eval.{field}"):
            validate(tiny_config("fedavg", eval={field: value}))


def test_a_paper_s_test_with_rho_at_most_one_is_refused_before_training(tmp_path):
    """6 clients, c = 0.2: (m - 1)·c = 1 other client, ρ = 1, which the paper's S-test rejects."""
    from pfl.runner.experiment import run_experiment

    cfg = tiny_config("fedavg", eval={"protocols": ["local", "sg"], "s_acc_others": 0.2})
    with pytest.raises(ConfigError, match="eval.s_acc_others: .*ρ = 1; the paper's S-test needs ρ > 1"):
        run_experiment(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_resume_keeps_communication_totals_and_round_history(tmp_path):
    ev = {"select": "best_val", "protocols": ["local", "sg", "global"]}
    full = make_loop(tiny_config("fedavg", trainer={"rounds": 4}, data={"val_frac": 0.2}, eval=ev))
    expected = full.fit()
    cut = tiny_config("fedavg", trainer={"rounds": 2}, data={"val_frac": 0.2}, eval=ev)
    make_loop(cut, run_dir=tmp_path, callbacks=[FileOutputs(RunFiles(tmp_path))]).fit()
    resumed = make_loop(
        tiny_config("fedavg", trainer={"rounds": 4}, data={"val_frac": 0.2}, eval=ev),
        run_dir=tmp_path,
        callbacks=[FileOutputs(RunFiles(tmp_path))],
    )
    assert resumed.checkpointer.resume(tmp_path)
    got = resumed.fit()
    assert got["selected_round"] == expected["selected_round"]
    for key in ("comm.up_bytes.total", "comm.down_bytes.total", "pm.l_acc.mean", "pm.s_acc.mean"):
        assert got["metrics"][key] == expected["metrics"][key]
    assert resumed.selected_rows == full.selected_rows


def test_full_eval_config_from_the_command_line(tmp_path):
    from pfl.cli import main

    args = ["--data.num_clients", "4", "--trainer.rounds", "2", "--trainer.eval_every", "1", "--model.hidden", "[8]"]
    args += ["--tracking.wandb", "false", "--trainer.progress", "false", "--tracking.root", str(tmp_path)]
    args += ["--tracking.name", "r", "--config", "conf/eval/full.yaml", "--eval.target", "0.0"]
    assert main(["fit", *args]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["metrics"]["rounds_to_target"] == 1 and s["reference"]["method"] == "local"
    assert {"ptr", "r_acc.mean", "gain.mean", "pm.s_acc.mean", "comm.up_bytes.total"} <= set(s["metrics"])
    assert main(["fit", *args, "--eval.select", "best"]) == 2  # bad input fails before training


def test_validation_scores_average_over_clients_that_have_a_validation_split():
    worker, state, correct = known_federation()
    c0 = worker.data.clients[0]
    worker.data.clients[0] = ClientSplit(c0.train, c0.test, worker.data.clients[1].test)  # acc 0.5 samples
    ctx = lambda cid: ClientContext(cid, 0, worker, {}, state)  # noqa: E731
    m, rows = evaluate_federation(FedAvg(), {"global": state}, worker, ctx)
    assert m["pm.val_acc.mean"] == 0.5 and m["pm.val_acc.std"] == 0.0
    assert "pm.val_acc" in rows[0] and "pm.val_acc" not in rows[1]
    assert "pm.s_acc.mean" not in m  # no S/G-tests without EvalSets
