"""pfl.metrics.evaluate's rows and summaries at their edges: the forward pass, the per-client gain, the
global model's keys and tails, the defaults of score_clients and the new clients' ids."""

from __future__ import annotations

import pytest
import torch

from pfl.methods import ClientContext
from pfl.methods.fedavg import FedAvg
from pfl.metrics.evaluate import (
    evaluate_new_clients,
    honest_metrics,
    predict,
    score_clients,
    summarize_rows,
    union_of,
)
from tests.metrics.test_metrics_eval import known_federation


def _rows(**extra):
    return [{"client": c, "pm.l_acc": a, "gm.l_acc": g, **extra} for c, (a, g) in enumerate([(1.0, 0.5), (0.5, 0.25)])]


def test_predict_builds_no_graph_and_an_empty_index_gives_no_output():
    worker, state, _ = known_federation()
    out = predict(worker, state, torch.arange(3))
    assert out.shape == (3, 2) and not out.requires_grad
    assert len(predict(worker, state, torch.zeros(0, dtype=torch.long))) == 0


def test_rows_carry_each_clients_gain_over_the_reference():
    rows = _rows()
    summarize_rows(rows, "classification", reference=[0.75, 0.75])
    assert [(r["ref.pm.l_acc"], r["gain"]) for r in rows] == [(0.75, 0.25), (0.75, -0.25)]


def test_global_model_keys_need_their_scores():
    one = summarize_rows(_rows()[:1], "classification")  # a single client (one rank's share)
    assert one["gm.l_acc.mean"] == 0.5 and one["gm.l_acc.top5"] == one["gm.l_acc.bottom5"] == 0.5
    m = summarize_rows(_rows(), "classification", {"global_loss": 0.3})
    assert "gm.acc" not in m and "gm.loss" not in m  # no accuracy on the global test: no key
    assert (m["gm.l_acc.top5"], m["gm.l_acc.bottom5"]) == (0.5, 0.25)
    m = summarize_rows(_rows(), "classification", {"global": 0.6, "global_loss": 0.3})
    assert (m["gm.acc"], m["gm.loss"]) == (0.6, 0.3)


def test_score_clients_scores_the_global_model_by_default():
    worker, state, _ = known_federation()
    ctx = lambda cid: ClientContext(cid, 0, worker, {}, state)  # noqa: E731
    rows, gm_global = score_clients(FedAvg(), {"global": state}, worker, ctx, [0, 1])
    assert gm_global["global"] == pytest.approx(0.6) and [r["gm.l_acc"] for r in rows] == [1.0, 0.5]


def test_new_clients_get_ids_after_the_federations():
    worker, state, _ = known_federation()
    worker.new_clients = [worker.data.clients[0], worker.data.clients[1]]
    seen = []

    class Recording(FedAvg):
        def adapt_new_client(self, server, client, epochs):
            seen.append(client.cid)
            return state

    evaluate_new_clients(Recording(), {"global": state}, worker, 0, 0, state)
    n = worker.data.num_clients
    assert seen == [n, n + 1]


def test_honest_rows_have_tails_for_classification_and_an_empty_union_scores_nothing():
    rows = [{"client": c, "pm.l_acc": a} for c, a in enumerate([1.0, 0.5, 0.25])]
    out = honest_metrics(rows, {2}, "classification")
    assert (out["honest.pm.l_acc.top5"], out["honest.pm.l_acc.bottom5"]) == (1.0, 0.5)
    samples, positions = union_of({"l": torch.zeros(0, dtype=torch.long)})
    assert len(samples) == 0 and positions == {}
