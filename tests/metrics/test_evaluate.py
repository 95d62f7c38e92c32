"""Tests of pfl/metrics/evaluate.py: which samples the S-test sets hold, the routed scores (``route.*``)
of a method with an inference rule and the honest scores (``honest.*``) that leave the malicious clients
out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pfl.data import ClientSplit, FederatedData
from pfl.engine.trainer import ClientTrainer, TrainSettings
from pfl.metrics.evaluate import EvalSets, predict
from pfl.runner.experiment import run_experiment
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import _trained


def _equal_test_federation(clients: int, test_size: int) -> ClientTrainer:
    """``clients`` clients with one training sample and ``test_size`` test samples each, disjoint."""
    per = 1 + test_size
    splits = [ClientSplit(torch.tensor([k * per]), torch.arange(k * per + 1, (k + 1) * per)) for k in range(clients)]
    x, y = torch.zeros(clients * per, 2), torch.zeros(clients * per, dtype=torch.long)
    data = FederatedData("equal", x, y, 2, splits, torch.zeros(0, dtype=torch.long))
    return ClientTrainer(nn.Sequential(nn.Flatten(), nn.Linear(2, 2)), data, TrainSettings(), seed=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_s_test_is_the_own_test_then_every_other_clients_test_once(seed):
    """With c = 1 the paper's S-test mixes in all m - 1 other clients, each share their whole test (the
    share equals the pool): the S-set is the own test, then each other client's test sample exactly
    once, never a sample of the client's own test in the "others" part and never one twice."""
    worker = _equal_test_federation(clients=5, test_size=6)
    tests = [c.test for c in worker.data.clients]
    sets = EvalSets.build(worker, seed, share_of_others=1.0)
    for cid, s_set in enumerate(sets.s):
        own, others = s_set[:6], s_set[6:]
        assert torch.equal(own, tests[cid])
        expected = torch.cat([t for k, t in enumerate(tests) if k != cid])
        assert torch.equal(others.sort().values, expected.sort().values)


def _own_accuracy(loop, state: torch.Tensor, cid: int) -> float:
    idx = loop.worker.data.clients[cid].test
    out = predict(loop.worker, state, idx)
    return int((out.argmax(1) == loop.worker.data.y[idx]).sum()) / len(idx)


@pytest.mark.parametrize("with_sg", [False, True])
def test_threshold_extremes_are_the_client_side_and_the_full_model(with_sg):
    groups = {"eval": {"protocols": ["local", "sg", "global"], "s_test": "mixed"}} if with_sg else {}
    low, low_metrics, low_rows = _trained(0.0, **groups)
    high, high_metrics, high_rows = _trained(50.0, **groups)
    sets = ("l", "s", "g") if with_sg else ("l",)
    for row in high_rows:  # nothing routed: the client-side model, i.e. the P-model's scores
        assert row["route.l_acc"] == row["pm.l_acc"] and row["route.l_server"] == 0.0
        if with_sg:
            assert row["route.s_acc"] == row["pm.s_acc"] and row["route.g_acc"] == row["pm.g_acc"]
    for row in low_rows:  # everything routed: the full model (φ_i, θ) on the client's own test
        cid = row["client"]
        _, full, _ = low.method.routing(low.server, low.peek_client(cid))
        assert row["route.l_acc"] == _own_accuracy(low, full, cid) and row["route.l_server"] == 1.0
    assert high_metrics["route.l_acc.mean"] == high_metrics["pm.l_acc.mean"]
    for s in sets:
        assert low_metrics[f"route.{s}_server.mean"] == 1.0 and high_metrics[f"route.{s}_server.mean"] == 0.0
    # the same training: the threshold only changes the evaluation
    assert low_metrics["pm.l_acc.mean"] == high_metrics["pm.l_acc.mean"]


def test_no_routed_metrics_without_a_threshold_or_for_other_methods():
    _, metrics, rows = _trained(None)
    assert not [k for k in metrics if k.startswith("route.")] and not [k for r in rows for k in r if "route" in k]
    fedavg = make_loop(tiny_config("fedavg"))
    fedavg.run_round()
    assert not [k for k in fedavg.evaluate() if k.startswith("route.")]


def test_routed_evaluation_runs_end_to_end(tmp_path):
    cfg = tiny_config("splitgp", {"entropy_threshold": 2.0}, eval={"protocols": ["local", "sg", "global"]})
    summary = run_experiment(cfg, run_dir=tmp_path / "run")
    final = summary["metrics"]
    keys = [k for k in final if k.startswith("route.")]
    assert {"route.l_acc.mean", "route.s_acc.mean", "route.g_acc.mean", "route.l_server.mean"} <= set(keys)
    for k in keys:
        assert 0.0 <= final[k] <= 1.0
    assert 0.0 < final["route.l_server.mean"] < 1.0  # a trained client-side model is unsure of some samples


def test_honest_metrics_leave_the_malicious_clients_out():
    sg = {"protocols": ["local", "sg", "global"]}  # the S- and G-tests are measured when asked for
    loop = make_loop(tiny_config("fedpg", attack={"kind": "scale", "fraction": 0.34}, eval=sg))
    loop.run_round()
    metrics = loop.evaluate()
    honest_rows = [r for r in loop.client_rows if r["client"] not in loop.evals.malicious]
    assert len(honest_rows) == 4
    for key in ("pm.l_acc", "pm.s_acc", "pm.g_acc", "gm.l_acc"):
        assert metrics[f"honest.{key}.mean"] == pytest.approx(sum(r[key] for r in honest_rows) / 4)
    assert metrics["honest.clients"] == 4
    clean = make_loop(tiny_config("fedpg"))
    clean.run_round()
    assert not any(k.startswith("honest.") for k in clean.evaluate())
