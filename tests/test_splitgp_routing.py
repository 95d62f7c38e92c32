"""SplitGP's inference rule: a sample the client-side model is unsure of (entropy ≥ E_th) is predicted
by the full model, the server completing it from the client's features (pfl.metrics.routing)."""

from __future__ import annotations

import math

import pytest
import torch

from pfl.errors import ConfigError
from pfl.methods.splitgp import SplitGP
from pfl.metrics.evaluate import predict
from pfl.metrics.routing import entropy, route, routed_scores
from pfl.runner.experiment import run_experiment
from tests.conftest import make_loop, tiny_config

# Three samples over three classes: a confident client output, a uniform one, a mildly peaked one.
OUT_CLIENT = torch.tensor([[10.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
OUT_SERVER = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 5.0], [3.0, 0.0, 0.0]])
Y = torch.tensor([0, 2, 1])


def test_entropy_of_a_softmax_by_hand():
    p = math.e / (math.e + 2)
    q = 1 / (math.e + 2)
    expected = [0.0, math.log(3), -(p * math.log(p) + 2 * q * math.log(q))]
    torch.testing.assert_close(entropy(OUT_CLIENT), torch.tensor(expected), atol=1e-3, rtol=0)
    assert float(entropy(OUT_CLIENT)[1]) == pytest.approx(math.log(3), abs=1e-6)


def test_routing_by_hand_on_a_tiny_batch():
    # H = (≈0.0009, log 3 ≈ 1.0986, ≈0.9754): at E_th = 0.5 samples 1 and 2 go to the server.
    pred, to_server = route(OUT_CLIENT, OUT_SERVER, 0.5)
    assert to_server.tolist() == [False, True, True]
    assert pred.tolist() == [0, 2, 0]  # client's 0; server's 2 and 0
    assert routed_scores(OUT_CLIENT, OUT_SERVER, Y, 0.5) == (2 / 3, 2 / 3)
    # Each model alone gets one of three: the client says 0, 0, 0 and the server 1, 2, 0.
    assert routed_scores(OUT_CLIENT, OUT_SERVER, Y, 10.0) == (1 / 3, 0.0)
    assert routed_scores(OUT_CLIENT, OUT_SERVER, Y, 0.0) == (1 / 3, 1.0)
    # A sample whose entropy equals E_th goes to the server; just above it, it stays on the client.
    h2 = entropy(OUT_CLIENT)[2]
    above = torch.nextafter(h2, torch.tensor(math.inf))  # the next float32: outputs are float32
    assert route(OUT_CLIENT, OUT_SERVER, float(h2))[1].tolist() == [False, True, True]
    assert route(OUT_CLIENT, OUT_SERVER, float(above))[1].tolist() == [False, True, False]
    assert route(OUT_CLIENT, OUT_SERVER, 1.0)[1].tolist() == [False, True, False]


def test_entropy_threshold_is_checked():
    assert SplitGP(entropy_threshold=0.0).entropy_threshold == 0.0
    assert SplitGP(entropy_threshold=None).entropy_threshold is None
    for bad in (-0.01, math.inf, math.nan):
        with pytest.raises(ConfigError, match="method.entropy_threshold"):
            SplitGP(entropy_threshold=bad)


def _trained(threshold: float | None, **groups):
    loop = make_loop(tiny_config("splitgp", {"entropy_threshold": threshold}, **groups))
    loop.run_round()
    loop.run_round()
    metrics = loop.evaluate()
    return loop, metrics, loop.client_rows


def _own_accuracy(loop, state: torch.Tensor, cid: int) -> float:
    idx = loop.worker.data.clients[cid].test
    out = predict(loop.worker, state, idx)
    return int((out.argmax(1) == loop.worker.data.y[idx]).sum()) / len(idx)


def test_full_model_routes_the_clients_features_through_the_servers_part():
    loop, _, _ = _trained(0.5)
    tail = loop.method.head_slice(loop.server.layout)
    for cid in range(loop.worker.data.num_clients):
        ctx = loop.peek_client(cid)
        client_side, full, threshold = loop.method.routing(loop.server, ctx)
        assert threshold == 0.5
        assert torch.equal(client_side, loop.method.personal_state(loop.server, ctx))
        assert torch.equal(full[: tail.start], client_side[: tail.start])  # φ_i
        assert torch.equal(full[tail], loop.server["global"][tail])  # the server's θ
    assert SplitGP(entropy_threshold=None).routing(loop.server, loop.peek_client(0)) is None


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
