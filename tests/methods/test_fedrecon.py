"""Tests of pfl/methods/fedrecon.py."""

from __future__ import annotations

import pytest
import torch

from pfl.errors import ConfigError
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import assert_global_is_fedavgs


def test_fedrecon_without_local_parameters_is_fedavg():
    assert_global_is_fedavgs(make_loop(tiny_config("fedrecon", {"local_layers": 0})))


def test_fedrecon_reconstructs_only_the_local_layers_and_keeps_nothing():
    loop = make_loop(tiny_config("fedrecon", {"local_layers": 1}))
    payloads_before = loop.server["global"].clone()
    loop.run_round()
    assert not loop.clients  # stateless clients
    head = loop.worker.flat.layout.head
    assert torch.equal(loop.server["global"][head], payloads_before[head])  # local layers never leave clients
    client = loop.client(2)
    start = loop.method.compose(
        loop.server["global"][loop.method.mask(loop.server.layout)], client.init_state, client.layout
    )
    rebuilt = loop.method.reconstruct(client, start, "check")
    assert torch.equal(rebuilt[: head.start], start[: head.start])  # the global part is frozen
    assert not torch.equal(rebuilt[head], start[head])
    assert torch.equal(start[head], client.init_state[head])  # from scratch: the initial local layers


# -- mutation-testing survivors: fedrecon --
# Synthetic data: every input feature varies, so the first weight (input feature 0) has a gradient; on
# digits feature 0 is a corner pixel, always 0, and freezing it or not shows nowhere.
SYNTHETIC = {"source": "synthetic", "num_clients": 6}


def test_fedrecon_hyperparameters_are_checked_at_their_bounds():
    from pfl.methods.fedrecon import FedRecon

    for field, ok, bad in (("local_layers", 0, -1), ("recon_epochs", 1, 0), ("recon_lr", 0.5, 0.0)):
        assert getattr(FedRecon(**{field: ok}), field) == ok
        with pytest.raises(ConfigError, match=f"method.{field}"):
            FedRecon(**{field: bad})


def test_fedrecon_reconstruction_freezes_every_global_parameter_on_synthetic_data():
    loop = make_loop(tiny_config("fedrecon", {"local_layers": 1}, data=SYNTHETIC))
    method, client, head = loop.method, loop.client(0), loop.worker.flat.layout.head
    start = method.compose(loop.server["global"][method.mask(loop.server.layout)], client.init_state, client.layout)
    assert float(client.fit(start, purpose="check")[0] - start[0]) != 0  # the first weight has a gradient here
    rebuilt = method.reconstruct(client, start, "check")
    assert torch.equal(rebuilt[: head.start], start[: head.start]) and not torch.equal(rebuilt[head], start[head])


def test_fedrecon_round_reconstructs_then_trains_the_global_part_and_can_keep_the_local_layers():
    """reset_local=False: the upload is the global part of (reconstruct, then train with the local layers
    frozen), the client keeps the whole state and reconstructs from it next round."""
    from pfl.engine.terms import Freeze

    cfg = tiny_config("fedrecon", {"local_layers": 1, "reset_local": False}, data=SYNTHETIC)
    a, b = make_loop(cfg), make_loop(cfg)
    head, mask = a.worker.flat.layout.head, a.method.mask(a.server.layout)
    payload = a.method.payload(a.server, 0)
    upload = a.method.local_update(a.client(0), payload)
    client = b.client(0)
    start = b.method.compose(payload["shared"], client.init_state, client.layout)
    rebuilt = b.method.reconstruct(client, start, "reconstruct")
    trained = client.fit(rebuilt, terms=[Freeze(client.params(rebuilt), head)], indices=b.method.phases(client)[1])
    assert torch.equal(upload.state, trained[mask]) and torch.equal(a.clients[0]["personal"], trained)
    assert torch.equal(trained[head], rebuilt[head]) and not torch.equal(rebuilt[head], start[head])
    assert a.method.base(a.client(0)) is a.clients[0]["personal"]


def test_fedrecon_new_client_reconstructs_from_the_initial_local_layers():
    loop = make_loop(tiny_config("fedrecon", {"local_layers": 1, "reset_local": False}, data=SYNTHETIC))
    loop.run_round()
    method, head = loop.method, loop.worker.flat.layout.head
    cid = next(iter(loop.clients))
    client = loop.client(cid)
    got = method.adapt_new_client(loop.server, client, epochs=5)
    start = method.compose(loop.server["global"][method.mask(loop.server.layout)], client.init_state, client.layout)
    assert torch.equal(got, method.reconstruct(client, start, "new_client"))
    assert torch.equal(got[: head.start], loop.server["global"][: head.start]) and not torch.equal(got, start)


# -- support_query: the paper's split of each client's data (Algorithm 1) --
def _relabelled(cfg, cid: int, positions: slice | None = None):
    """A loop of ``cfg`` whose client ``cid`` has the labels of its train samples at ``positions`` changed."""
    loop = make_loop(cfg)
    if positions is not None:
        data = loop.worker.data
        idx = loop.client(cid).train_idx[positions]
        data.y[idx] = (data.y[idx] + 1) % loop.client(cid).num_classes
    return loop


def _phases_of(loop) -> tuple[torch.Tensor, torch.Tensor]:
    """Client 0's reconstructed state and its upload in round 0."""
    client, method = loop.client(0), loop.method
    shared = loop.server["global"][method.mask(loop.server.layout)]
    start = method.compose(shared, client.init_state, client.layout)
    rebuilt = method.reconstruct(client, start, "reconstruct")
    return rebuilt, method.local_update(client, {"shared": shared}).state


EVEN, ODD = slice(0, None, 2), slice(1, None, 2)


def test_fedrecon_support_query_reconstructs_on_the_support_and_updates_on_the_query():
    """Reconstruction reads only the support samples (even positions of the train split); the global
    update reads the query samples (odd positions); the two sets split the train split."""
    cfg = tiny_config("fedrecon", {"local_layers": 1, "support_query": True}, data=SYNTHETIC)
    plain = _phases_of(_relabelled(cfg, 0))
    query_changed = _phases_of(_relabelled(cfg, 0, ODD))
    support_changed = _phases_of(_relabelled(cfg, 0, EVEN))
    assert torch.equal(query_changed[0], plain[0])  # the query's labels do not reach l
    assert not torch.equal(support_changed[0], plain[0])
    assert not torch.equal(query_changed[1], plain[1])  # the query trains g
    loop = make_loop(cfg)
    support, query = loop.method.phases(loop.client(0))
    train = loop.client(0).train_idx
    assert torch.equal(support, train[EVEN]) and torch.equal(query, train[ODD])


def test_fedrecon_support_query_global_update_reads_only_the_query(monkeypatch):
    """With the reconstruction held fixed, the global update reads the query samples and not the support."""
    from pfl.methods.fedrecon import FedRecon

    monkeypatch.setattr(FedRecon, "reconstruct", lambda self, client, start, purpose: start)
    cfg = tiny_config("fedrecon", {"local_layers": 1, "support_query": True}, data=SYNTHETIC)
    plain = _phases_of(_relabelled(cfg, 0))[1]
    assert torch.equal(_phases_of(_relabelled(cfg, 0, EVEN))[1], plain)
    assert not torch.equal(_phases_of(_relabelled(cfg, 0, ODD))[1], plain)


def test_fedrecon_splits_by_default_as_the_paper_does():
    cfg = tiny_config("fedrecon", {"local_layers": 1}, data=SYNTHETIC)
    assert cfg.method.support_query is True
    loop = make_loop(cfg)
    support, query = loop.method.phases(loop.client(0))
    train = loop.client(0).train_idx
    assert torch.equal(support, train[EVEN]) and torch.equal(query, train[ODD])


def test_fedrecon_without_the_split_reconstructs_on_the_whole_train_split():
    cfg = tiny_config("fedrecon", {"local_layers": 1, "support_query": False}, data=SYNTHETIC)
    loop = make_loop(cfg)
    assert loop.method.phases(loop.client(0)) == (None, None)
    assert not torch.equal(_phases_of(_relabelled(cfg, 0, ODD))[0], _phases_of(loop)[0])  # odd samples count


def test_fedrecon_a_client_too_small_to_split_uses_its_whole_split_for_both_phases():
    from pfl.methods.fedrecon import FedRecon

    class One:
        train_idx = torch.tensor([7])

    class Two:
        train_idx = torch.tensor([7, 3])

    assert FedRecon(support_query=True).phases(One()) == (None, None)
    support, query = FedRecon(support_query=True).phases(Two())
    assert (support.tolist(), query.tolist()) == ([7], [3])


def test_fedrecon_support_query_rounds_train_in_lockstep_as_sequentially():
    from tests.engine.test_lockstep_real_runs import CLIENT, DATA, _vectorized
    from tests.helpers.same_runs import assert_close, assert_same_metrics

    def loop():
        method = {"local_layers": 1, "support_query": True}
        return make_loop(
            tiny_config("fedrecon", method, trainer={"rounds": 2, "eval_every": 2}, client=CLIENT, data=DATA)
        )

    seq, vec = loop(), _vectorized(loop())
    seq.fit(), vec.fit()
    assert vec.dispatcher.lockstep.stacked_fits > 0 and vec.dispatcher.lockstep.sequential_fits == 0
    assert_close(vec.server.state, seq.server.state, "server")
    assert_close(dict(vec.clients.items()), dict(seq.clients.items()), "clients")
    assert_same_metrics(vec.history[-1], seq.history[-1])
