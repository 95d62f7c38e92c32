"""Tests of pfl/methods/fedala.py."""

from __future__ import annotations

import pytest
import torch

from pfl.errors import ConfigError
from pfl.methods.fedala import FedALA
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import assert_global_is_fedavgs


def test_fedala_with_weights_fixed_at_one_downloads_the_global_model():
    assert_global_is_fedavgs(make_loop(tiny_config("fedala", {"eta": 0.0})))


def _ala_by_hand(cfg, loop, cid, g, own, weights, passes, stop_after):
    """FedALA's adaptive local aggregation written out: on the top layer, θ̂ = g + (θ − g)(1 − W); per
    used batch W ← clip(W + η ∇θ̂ ⊙ (θ − g), 0, 1); ``passes`` passes, stopping early after ``stop_after``."""
    import math

    import torch.nn.functional as F
    from torch.func import functional_call

    from tests.methods.reference import drawn_batches, initial_net

    flat, data, m = loop.worker.flat, loop.worker.data, loop.method
    net = initial_net(cfg, loop)
    sl, idx, bs = flat.layout.head, data.clients[cid].train, cfg.client.batch_size
    p = flat.num_params
    away, params = own[sl] - g[sl], g[:p].clone()
    params[sl] = g[sl] + away * (1 - weights)
    used, per_pass = max(1, int(m.rand_percent / 100 * (len(idx) // bs))), math.ceil(len(idx) / bs)
    assert used < per_pass
    batches = iter(drawn_batches(cfg.seed, loop.round, cid, "ala", idx, bs, epochs=passes))
    for _ in range(min(passes, stop_after)):
        for j in range(per_pass):
            b = next(batches)
            if j >= used:
                continue
            live = params.clone().requires_grad_(True)
            loss = F.cross_entropy(functional_call(net, flat.param_dict(live), (data.x[b],)), data.y[b])
            (grad,) = torch.autograd.grad(loss, live)
            weights = (weights + m.eta * grad[sl] * away).clamp(0.0, 1.0)
            params[sl] = g[sl] + away * (1 - weights)
    return params, weights


@pytest.mark.parametrize(
    ("rand_percent", "num_pre_loss", "threshold", "stop_after"),
    [(50.0, 1, 0.01, 2), (99.5, 1, 0.0, 4), (5.0, 2, 1e-9, 4), (50.0, 2, 1e9, 3)],
)
def test_fedala_adaptive_local_aggregation_matches_a_hand_written_loop(
    rand_percent, num_pre_loss, threshold, stop_after
):
    """A start phase of at most 4 passes, then a later round's single pass from the learnt W. The start
    phase stops once more than num_pre_loss losses are in and the std of the last num_pre_loss is below
    the threshold: after 2 passes for one loss (its std is 0 < 0.01), never at threshold 0 or 1e-9.
    The used batches are whole ones: 99.5% of client 1's 20 full batches is 19 (of 20.19 batches: 20)."""
    args = {"eta": 1.0, "rand_percent": rand_percent, "max_start_epochs": 4, "num_pre_loss": num_pre_loss}
    cfg = tiny_config("fedala", {**args, "threshold": threshold})
    loop = make_loop(cfg)
    loop.run_round()
    cid = 1
    client, g = loop.client(cid), loop.server["global"].clone()
    own = client.state["personal"].clone()
    assert "ala_weights" not in client.state  # round 0 had nothing to aggregate: this is the start phase
    ones = torch.ones(loop.worker.flat.layout.head.stop - loop.worker.flat.layout.head.start)
    for passes, stop, w0 in ((4, stop_after, ones), (1, 1, None)):
        w0 = w0 if w0 is not None else client.state["ala_weights"].clone()
        start = loop.method.adaptive_local_aggregation(client, g, own)
        params, weights = _ala_by_hand(cfg, loop, cid, g, own, w0, passes, stop)
        assert not torch.equal(weights, w0)
        torch.testing.assert_close(client.state["ala_weights"], weights, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(start[: len(params)], params, rtol=1e-5, atol=1e-6)


def test_fedala_with_drop_last_passes_over_the_batches_an_epoch_keeps():
    """With client.drop_last each ALA pass is the epoch's whole batches only: counted as the fit's
    batches are, not as ceil(n / batch_size) (which asked for a batch the pass never draws)."""
    cfg = tiny_config("fedala", {"eta": 1.0, "max_start_epochs": 3}, client={"drop_last": True, "batch_size": 15})
    loop = make_loop(cfg)
    for _ in range(3):
        loop.run_round()
    client = loop.client(1)
    assert client.num_samples % 15 and client.batches_per_epoch == client.num_samples // 15
    assert "ala_weights" in client.state


def test_fedala_learns_weights_in_the_unit_box_on_the_top_layers_only():
    loop = make_loop(tiny_config("fedala", {"eta": 1.0, "layer_idx": 1, "max_start_epochs": 5}))
    loop.run_round()
    g = loop.server["global"].clone()
    client = loop.client(0)
    own = client.state["personal"].clone()
    start = loop.method.adaptive_local_aggregation(client, g, own)
    head = loop.worker.flat.layout.head
    w = client.state["ala_weights"]
    assert w.shape == (head.stop - head.start,)
    assert float(w.min()) >= 0 and float(w.max()) <= 1 and float(w.min()) < 1  # learnt, clipped
    assert torch.equal(start[: head.start], g[: head.start])  # lower layers: the global model
    mixed = g[head] + (own[head] - g[head]) * (1 - w)
    assert torch.allclose(start[head], mixed)
    fedavg = make_loop(tiny_config("fedavg"))
    fedavg.run_round()
    loop.run_round()
    fedavg.run_round()
    assert not torch.equal(loop.server["global"], fedavg.server["global"])


def test_fedala_with_layer_idx_zero_mixes_every_parameter():
    loop = make_loop(tiny_config("fedala", {"eta": 1.0, "layer_idx": 0, "max_start_epochs": 5}))
    loop.run_round()
    client, num_params = loop.client(0), loop.worker.flat.layout.num_params
    assert loop.method.top(client) == slice(0, num_params)
    g, own = loop.server["global"].clone(), client.state["personal"].clone()
    loop.method.adaptive_local_aggregation(client, g, own)
    assert client.state["ala_weights"].shape == (num_params,)


def test_fedala_layer_idx_may_name_every_layer_of_the_model_and_no_more():
    layers = make_loop(tiny_config("fedala")).worker.flat.layout.num_layers
    make_loop(tiny_config("fedala", {"layer_idx": layers}))  # every layer: accepted
    with pytest.raises(ConfigError, match="method.layer_idx"):
        make_loop(tiny_config("fedala", {"layer_idx": layers + 1}))


def test_fedala_evaluates_the_model_the_client_trained_from_its_ala_mix():
    # Its P-model is the client's model trained from the ALA mix: no fine-tuning on top, no re-mixing.
    assert FedALA().finetune_epochs == 0
    cfg = tiny_config("fedala", {"max_start_epochs": 2})
    loop = make_loop(cfg)
    loop.run_round()
    loop.run_round()
    for cid in range(cfg.data.num_clients):
        client = loop.client(cid)
        assert loop.method.personal_state(loop.server, client) is client.state["personal"]
    assert not torch.equal(loop.client(0).state["personal"], loop.server["global"])
