"""Tests of pfl/methods/pfedhn.py."""

from __future__ import annotations

import pytest
import torch

from pfl.errors import ConfigError
from pfl.methods import method_class
from pfl.optim.hypernet import HyperNetwork, layer_sizes
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import SAM_HALF as HALF
from tests.methods.helpers import equal_servers as _equal_servers
from tests.methods.helpers import exchanged_round
from tests.methods.helpers import fit_half_momentum as _fit


@pytest.mark.parametrize("sam_gradient", ["paper", "surrogate"])
def test_plgu_ghn_with_rho_zero_is_pfedhn(sam_gradient):
    pfedhn, ghn = _fit("pfedhn"), _fit("plgu_ghn", {"rho": 0.0, "sam_gradient": sam_gradient})
    assert _equal_servers(pfedhn, ghn)
    assert pfedhn.evaluate()["pm.l_acc.mean"] == ghn.evaluate()["pm.l_acc.mean"]
    assert not _equal_servers(pfedhn, _fit("plgu_ghn", {"sam_gradient": sam_gradient}))


def test_plgu_ghn_passes_its_gradient_rule_to_the_server_step():
    paper, surrogate = _fit("plgu_ghn"), _fit("plgu_ghn", {"sam_gradient": "surrogate"})
    assert paper.method.sam_gradient == "paper"
    assert _equal_servers(paper, _fit("plgu_ghn", {"sam_gradient": "paper"}))
    assert not _equal_servers(paper, surrogate)


# -- pFedHN -------------------------------------------------------------------------------------------
def test_pfedhn_round_descends_the_distance_to_the_trained_weights_by_autograd():
    loop = make_loop(tiny_config("pfedhn", trainer=HALF))
    method = loop.method
    before = {k: v.clone() for k, v in loop.server["hn"].items()}
    payloads, uploads = exchanged_round(loop)
    hn = HyperNetwork(
        loop.server.num_clients, layer_sizes(loop.flat.layout.layer_slices()), generator=torch.Generator()
    )
    hn.load_state_dict(before)
    cids = sorted(uploads)
    for cid in cids:  # each client trained the hypernetwork's output for it
        torch.testing.assert_close(payloads[cid]["params"], hn(cid).detach(), rtol=0, atol=0)
    w = hn(cids)
    target = torch.stack([payloads[c]["params"] + uploads[c]["delta"] for c in cids])
    surrogate = 0.5 * (w - target).pow(2).sum(dim=1)  # ½‖w_i − (w_i + Δw_i)‖², target held fixed
    phi = hn.phi_parameters()
    g_phi = torch.autograd.grad(surrogate.mean(), phi, retain_graph=True)  # φ: mean over the round's clients
    (g_v,) = torch.autograd.grad(surrogate.sum(), [hn.embeddings])  # v_i: its own client's gradient
    named = dict(hn.named_parameters())
    grads = {name: g for name, g in zip([n for n in named if n != "embeddings"], g_phi, strict=True)}
    grads["embeddings"] = g_v
    for name, p in named.items():  # first SGD step: momentum buffer = gradient (+ weight decay)
        expected = p.detach() - method.hn_lr * (grads[name] + method.hn_weight_decay * p.detach())
        torch.testing.assert_close(loop.server["hn"][name], expected, rtol=0, atol=1e-6)
    assert not torch.equal(loop.server["hn"]["embeddings"], before["embeddings"])


def test_pfedhn_personal_model_is_the_hypernetwork_output():
    loop = _fit("pfedhn")
    n = loop.flat.num_params
    hn = loop.method.hypernet(loop.server)
    for cid in range(loop.server.num_clients):
        state = loop.method.personal_state(loop.server, loop.client(cid))
        assert torch.equal(state[:n], hn(cid).detach())


# -- mutation-testing survivors: pfedhn --
SMALL_HN = {"hidden": 4, "n_hidden": 1, "embed_dim": 2, "chunk": 8, "chunk_embed_dim": 2}


@pytest.mark.parametrize(
    ("name", "field", "ok", "bad"),
    [
        ("pfedhn", "hn_lr", 1e-6, 0.0),
        ("pfedhn", "hn_momentum", 0.0, 1.0),
        ("pfedhn", "hn_weight_decay", 0.0, -0.01),
        ("pfedhn", "embed_lr", 0.5, 0.0),
        ("pfedhn", "hidden", 1, 0),
        ("pfedhn", "n_hidden", 1, 0),
        ("pfedhn", "embed_dim", 1, 0),
        ("pfedhn", "chunk", 1, 0),
        ("pfedhn", "chunk_embed_dim", 1, 0),
        ("pfedhn", "max_grad_norm", 0.5, 0.0),
        ("pfedhn", "finetune_epochs", 0, -1),
        ("plgu_ghn", "rho", 0.0, -0.01),
        ("plgu_ghn", "p", 1.0, 0.99),
    ],
)
def test_pfedhn_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})


def _hn_server(method, layers: list[int], num_clients: int = 3):
    from pfl.engine.flat import ModelLayout
    from pfl.methods import ServerContext

    bounds = torch.tensor([0, *layers]).cumsum(0).tolist()
    slices = tuple((str(i), slice(a, b)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)))
    layout = ModelLayout(bounds[-1], 0, slices, torch.device("cpu"))
    server = ServerContext(0, num_clients, num_clients, layout, torch.zeros(bounds[-1]))
    server.state = method.init_server(server)
    return server


def _hn_of(server, layers: list[int]) -> HyperNetwork:
    hn = HyperNetwork(server.num_clients, layers, generator=torch.Generator(), **SMALL_HN)
    hn.load_state_dict(server["hn"])
    return hn


def test_pfedhn_hypernetwork_shell_follows_the_target_layout():
    """One method object serving two layouts (same federation): the shell is rebuilt for the layer sizes,
    here a dedicated run of 4 + 4 and a chunked layer of 12 then one of 4."""
    method = method_class("pfedhn")(**SMALL_HN)
    servers = {(4, 4): _hn_server(method, [4, 4]), (12, 4): _hn_server(method, [12, 4])}
    for layers in ((4, 4), (12, 4), (4, 4)):
        server = servers[layers]
        expected = _hn_of(server, list(layers))(1).detach()
        assert torch.equal(method.payload(server, 1)["params"], expected)


def test_pfedhn_server_momentum_carries_over_rounds():
    """Two aggregates equal two steps of one SGD optimizer (momentum 0.9) kept across them."""
    from pfl.methods import Upload
    from pfl.optim.hypernet import hn_server_update

    method = method_class("pfedhn")(hn_lr=0.1, hn_momentum=0.9, **SMALL_HN)
    server = _hn_server(method, [4, 4])
    ref = _hn_of(server, [4, 4])
    opt = torch.optim.SGD(ref.param_groups(None), lr=0.1, momentum=0.9, weight_decay=method.hn_weight_decay)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        deltas = {c: torch.randn(8, generator=gen) for c in range(3)}
        method.aggregate(server, {c: Upload(None, 1.0, {"delta": d}) for c, d in deltas.items()})
        hn_server_update(ref, opt, [0, 1, 2], torch.stack([deltas[c] for c in range(3)]), None)
    assert set(server["hn_momentum"]) == {name for name, _ in ref.named_parameters()}
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(server["hn"][name], value, rtol=0, atol=1e-6)


def test_pfedhn_clients_keep_their_trained_buffers():
    from pfl.models import ModelConfig

    loop = make_loop(tiny_config("pfedhn", model=ModelConfig(name="tests.methods.helpers:bn_mlp"), trainer=HALF))
    n, b = loop.flat.num_params, loop.flat.num_buffers
    assert b > 0
    _, uploads = exchanged_round(loop)
    for cid, upload in uploads.items():
        assert upload["delta"].numel() == n
        buffers = loop.clients[cid]["buffers"]
        assert buffers.numel() == b and not torch.equal(buffers, loop.init_state[n:])
        assert torch.equal(loop.method.personal_state(loop.server, loop.client(cid))[n:], buffers)


def test_pfedhn_finetune_epochs_fine_tune_the_hypernetwork_output_before_scoring():
    loop = _fit("pfedhn", {"finetune_epochs": 1})
    n = loop.flat.num_params
    client = loop.client(0)
    start = loop.method.local_start(client, loop.method.hypernet(loop.server)(0).detach())
    state = loop.method.personal_state(loop.server, client)
    assert torch.equal(state, client.fit(start, epochs=1, purpose="finetune"))
    assert not torch.equal(state[:n], start[:n])
