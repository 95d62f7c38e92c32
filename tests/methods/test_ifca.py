"""Tests of pfl/methods/ifca.py."""

from __future__ import annotations

import pytest
import torch

from pfl.federation.loop import comparable_metrics
from pfl.methods.model_rows import cluster_starts
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    BN_CNN,
    GN_WRN,
    NEW,
    VAL,
    assert_independent_cluster_starts,
    cluster_loop,
    exchanged_round,
    new_client_context,
    personal,
    resumed_after,
    run,
)


@pytest.mark.parametrize("clusters", [2, 3])
def test_ifca_clients_train_the_cluster_with_the_lowest_loss(clusters):
    loop = make_loop(tiny_config("ifca", {"clusters": clusters}))
    run(loop, 2)
    models = loop.server["models"]
    assert not torch.equal(models[0], models[1])
    payloads, uploads = exchanged_round(loop)
    picked = set()
    for cid, up in uploads.items():
        c = loop.client(cid)
        losses = torch.tensor([c.evaluate(m, c.train_idx).loss for m in payloads[cid]["models"]])
        assert int(up["cluster"]) == int(torch.argmin(losses))
        picked.add(int(up["cluster"]))
    assert picked != {0}  # some client prefers a cluster other than the first


def test_ifca_new_client_fine_tunes_the_cluster_with_the_lowest_loss():
    loop = run(make_loop(tiny_config("ifca", {"clusters": 2}, data=NEW)), 2)
    picks = []
    for models in (loop.server["models"].clone(), loop.server["models"].flip(0)):  # either cluster can win
        loop.server["models"] = models
        for j in range(len(loop.worker.new_clients)):
            ctx = new_client_context(loop, j)
            losses = torch.tensor([ctx.evaluate(m, ctx.train_idx).loss for m in models])
            start = models[int(torch.argmin(losses))]
            picks.append(int(torch.argmin(losses)))
            assert torch.equal(loop.method.adapt_new_client(loop.server, ctx, epochs=0), start)
            for epochs in (1, 2):
                tuned = new_client_context(loop, j).fit(start, epochs=epochs, purpose="new_client")
                assert not torch.equal(tuned, start)
                adapted = loop.method.adapt_new_client(loop.server, new_client_context(loop, j), epochs)
                assert torch.equal(adapted, tuned)
    assert set(picks) == {0, 1}, picks


@pytest.mark.parametrize("model", [BN_CNN, GN_WRN], ids=["batchnorm", "groupnorm"])
def test_ifca_clusters_start_from_independent_initialisations_of_the_network(model):
    loop = cluster_loop("ifca", model)
    assert_independent_cluster_starts(loop, loop.server["models"], model)
    assert torch.equal(loop.server["models"], cluster_starts(loop.server, 3, "ifca"))  # keyed by the method


# -- FedORA and its table's baselines (IFCA, FeSEM, FedAMP, FedU): seeds, client order, resume, one cluster --
NEW_METHODS = ["fedora", "ifca", "fesem", "fedamp", "fedu"]


@pytest.mark.parametrize("name", NEW_METHODS)
def test_same_seed_same_numbers_and_client_order_does_not_matter(name):
    cfg = tiny_config(name, data=VAL, trainer={"clients_per_round": 4})
    a, b = make_loop(cfg), make_loop(cfg)
    for loop, order in ((a, sorted), (b, lambda ids: sorted(ids, reverse=True))):
        for _ in range(2):
            sampled = loop.sampled_clients().tolist()
            payloads = {c: loop.method.payload(loop.server, c) for c in sampled}
            uploads = {c: loop.method.local_update(loop.client(c), payloads[c]) for c in order(sampled)}
            loop.method.aggregate(loop.server, uploads)
            loop.progress.round += 1
    for key in a.server.state:
        assert torch.equal(a.server[key], b.server[key]), key
    assert torch.equal(personal(a), personal(b))


@pytest.mark.parametrize("name", NEW_METHODS[1:])  # fedora: test_resume_keeps_bases_graph_and_stores
def test_resume_equals_the_uninterrupted_run(name, tmp_path):
    cfg = tiny_config(name, trainer={"rounds": 4, "clients_per_round": 4}, data=VAL)
    full = make_loop(cfg).fit()
    _, resumed = resumed_after(cfg, 2, tmp_path)
    assert comparable_metrics(resumed.fit()) == comparable_metrics(full)


@pytest.mark.parametrize("name", ["ifca", "fesem"])
def test_one_cluster_is_fedavg_bit_for_bit(name):
    cfg = {"trainer": {"clients_per_round": 3, "rounds": 3}}
    fedavg = make_loop(tiny_config("fedavg", **cfg))
    clustered = make_loop(tiny_config(name, {"clusters": 1}, **cfg))
    a, b = fedavg.fit()["metrics"], clustered.fit()["metrics"]
    key = "models" if name == "ifca" else "centers"
    assert torch.equal(clustered.server[key][0], fedavg.server["global"])
    assert a["pm.l_acc.mean"] == b["pm.l_acc.mean"]
