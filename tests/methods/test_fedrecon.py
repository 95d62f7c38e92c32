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
    trained = client.fit(rebuilt, terms=[Freeze(client.params(rebuilt), head)])
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
