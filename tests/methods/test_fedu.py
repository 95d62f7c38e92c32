"""Tests of pfl/methods/fedu.py."""

from __future__ import annotations

import pytest
import torch

from pfl.errors import ConfigError
from pfl.methods.fedu import FedU
from pfl.seeding import torch_generator
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import exchanged_round, personal, run


def test_fedu_without_coupling_is_local_bit_for_bit():
    cfg = {"trainer": {"clients_per_round": 4}}
    fedu = run(make_loop(tiny_config("fedu", {"lam": 0.0}, **cfg)), 3)
    local = run(make_loop(tiny_config("local", **cfg)), 3)
    assert torch.equal(personal(fedu), personal(local))


@pytest.mark.parametrize("graph", ["full", "random"])
def test_fedu_takes_one_laplacian_step_over_the_sampled_clients(graph):
    cfg = tiny_config("fedu", {"lam": 0.5, "eta": 0.1, "graph": graph}, trainer={"clients_per_round": 3}, seed=3)
    loop = make_loop(cfg)
    if graph == "full":
        a = torch.ones(6, 6, dtype=torch.float64)
    else:  # symmetric, a_ij the mean of two keyed U[0, 1) draws
        r = torch.rand(6, 6, generator=torch_generator(3, "fedu", "graph"), dtype=torch.float64)
        a = (r + r.T) / 2
    assert torch.equal(loop.server["A"], a - torch.diag(a.diagonal()))
    _, uploads = exchanged_round(loop)
    cids = sorted(uploads)
    for i in cids:
        pull = sum(float(a[i, j]) * (uploads[i].state - uploads[j].state) for j in cids if j != i)
        assert torch.allclose(loop.server["models"][i], uploads[i].state - 0.1 * 0.5 * pull, atol=1e-6)
    for i in set(range(6)) - set(cids):
        assert torch.equal(loop.server["models"][i], loop.init_state)


def test_fedu_laplacian_step_size_is_the_client_lr_unless_eta_sets_it():
    """Three clients, all sampled, a random graph, λ = 0.5: w_i ← w_i − ηλ Σ_j a_ij (w_i − w_j) with
    η = client.lr (0.07) for eta: null, the given η otherwise; with lr_decay, the round's decayed lr."""
    lr, lam = 0.07, 0.5
    groups = {"data": {"num_clients": 3}, "trainer": {"fraction": 1.0}, "seed": 3}
    # (eta, client.lr_decay, rounds run before the checked one, the step size expected in it)
    for eta, decay, before, expected_eta in ((None, 1.0, 0, lr), (0.02, 1.0, 0, 0.02), (None, 0.5, 1, lr * 0.5)):
        client = {"lr": lr, "lr_decay": decay}
        loop = make_loop(tiny_config("fedu", {"lam": lam, "eta": eta, "graph": "random"}, client=client, **groups))
        a = loop.server["A"]
        assert a[0, 1] != a[0, 2] and torch.equal(a, a.T)
        for _ in range(before):
            loop.run_round()
        loop.server.round = loop.round  # as run_round sets it
        _, uploads = exchanged_round(loop)
        w = {i: uploads[i].state for i in range(3)}
        for i, j, k in ((0, 1, 2), (1, 0, 2), (2, 0, 1)):
            pull = float(a[i, j]) * (w[i] - w[j]) + float(a[i, k]) * (w[i] - w[k])
            torch.testing.assert_close(loop.server["models"][i], w[i] - expected_eta * lam * pull, rtol=1e-5, atol=1e-6)
    assert FedU().eta is None and FedU(eta=0.05).eta == 0.05


def test_fedu_refuses_an_unknown_graph_before_training():
    with pytest.raises(ConfigError, match="method.graph"):
        FedU(graph="ring")
    assert FedU(graph="random").graph == "random"
