"""Tests of pfl/methods/fesem.py."""

from __future__ import annotations

import pytest
import torch

from pfl.methods import weighted_mean_of
from pfl.methods.model_rows import cluster_starts
from pfl.seeding import torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    BN_CNN,
    GN_WRN,
    NEW,
    assert_independent_cluster_starts,
    cluster_loop,
    exchanged_round,
    new_client_context,
    run,
)


def test_fesem_assigns_each_upload_to_the_nearest_centre():
    loop = make_loop(tiny_config("fesem", {"clusters": 3}))
    run(loop, 1)
    before = loop.server["centers"].clone()
    _, uploads = exchanged_round(loop)
    for cid, up in uploads.items():
        dist = (up.state - before).pow(2).sum(dim=1)
        assert int(loop.server["assign"][cid]) == int(torch.argmin(dist))
    for j in range(3):  # each centre is the weighted mean of its members (or kept)
        members = {c: u for c, u in uploads.items() if int(loop.server["assign"][c]) == j}
        expected = weighted_mean_of(members) if members else before[j]
        assert torch.allclose(loop.server["centers"][j], expected)


@pytest.mark.parametrize("model", [BN_CNN, GN_WRN], ids=["batchnorm", "groupnorm"])
def test_fesem_centres_start_from_independent_initialisations_of_the_network(model):
    loop = cluster_loop("fesem", model)
    assert_independent_cluster_starts(loop, loop.server["centers"], model)
    assert torch.equal(loop.server["centers"], cluster_starts(loop.server, 3, "fesem"))  # keyed by the method


# -- mutation-testing survivors: fesem --
def test_fesem_initial_assignments_are_keyed_by_the_seed_not_the_global_rng():
    loop = make_loop(tiny_config("fesem", {"clusters": 3}))
    server, n = loop.server, loop.server.num_clients
    expected = torch.randint(3, (n,), generator=torch_generator(server.seed, "fesem", "assign"))
    with torch.random.fork_rng():
        for seed in (1, 2):
            torch.manual_seed(seed)
            assert torch.equal(loop.method.init_server(server)["assign"], expected)


def test_fesem_new_client_fine_tunes_the_centre_with_the_lowest_loss():
    loop = run(make_loop(tiny_config("fesem", {"clusters": 2}, data=NEW)), 2)
    centers = loop.server["centers"]
    assert not torch.equal(centers[0], centers[1])
    for j in range(len(loop.worker.new_clients)):
        ctx = new_client_context(loop, j)
        losses = torch.tensor([ctx.evaluate(m, ctx.train_idx).loss for m in centers])
        start = centers[int(torch.argmin(losses))]
        assert torch.equal(loop.method.adapt_new_client(loop.server, ctx, epochs=0), start)
        tuned = new_client_context(loop, j).fit(start, epochs=1, purpose="new_client")
        assert not torch.equal(tuned, start)
        assert torch.equal(loop.method.adapt_new_client(loop.server, new_client_context(loop, j), 1), tuned)
