"""Tests of pfl/federation/attacks.py: who is malicious, and what their uploads become."""

from __future__ import annotations

import pytest
import torch

from pfl.config import AttackConfig, ModelConfig
from pfl.engine.flat import ModelLayout
from pfl.federation.attacks import Attack, malicious_clients, reference_of
from pfl.methods import Upload
from pfl.methods.fedavg import FedAvg
from pfl.methods.fedpg import FedPG
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import exchanged_round


def test_malicious_clients_are_drawn_once_from_the_seed():
    a = malicious_clients(3, 20, 0.1)
    assert len(a) == 2 and list(a) == sorted(a)
    assert list(malicious_clients(3, 20, 0.1)) == list(a) and list(malicious_clients(4, 20, 0.1)) != list(a)
    assert len(malicious_clients(0, 20, 0.0)) == 0 and len(malicious_clients(0, 5, 0.01)) == 1


@pytest.mark.parametrize("kind", ["scale", "gaussian"])
def test_attack_changes_exactly_the_malicious_uploads_every_round(kind):
    attack = {"kind": kind, "fraction": 0.34}
    attacked = make_loop(tiny_config("fedavg", attack=attack, trainer={"rounds": 2}))
    clean = make_loop(tiny_config("fedavg", trainer={"rounds": 2}))
    bad = attacked.evals.malicious
    assert len(bad) == 2
    seen: list[dict[int, Upload]] = []
    aggregate = attacked.method.aggregate
    attacked.method.aggregate = lambda server, uploads: (seen.append(uploads), aggregate(server, uploads))[1]
    for _ in range(2):
        w = clean.server["global"].clone()
        attacked.run_round()
        _, honest = exchanged_round(clean)
        changed = {c for c in honest if not torch.equal(honest[c].state, seen[-1][c].state)}
        assert changed == bad & set(honest)
        for c in changed:
            if kind == "scale":
                torch.testing.assert_close(seen[-1][c].state, w + 100 * (honest[c].state - w), rtol=1e-5, atol=1e-5)
            else:  # fedavg uploads parameters: they become N(0, 1)
                z = seen[-1][c].state
                assert abs(float(z.mean())) < 0.1 and abs(float(z.std()) - 1) < 0.1
        attacked.server["global"] = clean.server["global"].clone()  # compare the next round from the same w


def test_gaussian_attack_on_a_gradient_method_draws_the_pseudo_gradient():
    layout = ModelLayout(4000, 0, (("0", slice(0, 4000)),), torch.device("cpu"))
    attack = Attack(AttackConfig(kind="gaussian", fraction=0.5, scale=0.3), 0, 4, FedPG(), layout)
    assert attack.space == "update"
    w = torch.full((4000,), 2.0)
    uploads = {c: Upload(w - 0.01, 1.0, {"loss": torch.ones(1)}) for c in range(4)}
    out = attack.apply(uploads, {c: {"global": w} for c in range(4)}, round_idx=3)
    for c in range(4):
        if c in attack.malicious:
            g = w - out[c].state
            assert abs(float(g.mean())) < 0.03 and abs(float(g.std()) - 0.3) < 0.03
            assert out[c].extras is uploads[c].extras
        else:
            assert out[c] is uploads[c]
    again = attack.apply(uploads, {c: {"global": w} for c in range(4)}, round_idx=3)
    assert all(torch.equal(again[c].state, out[c].state) for c in range(4))  # keyed noise


def test_a_parameters_only_upload_is_scaled_around_the_global_parameters_not_zero():
    # FedAvg with share_buffers false is sent the whole model (with BatchNorm statistics) and uploads
    # its parameters only: no payload tensor has the upload's shape, and the reference is the method's.
    model = ModelConfig(name="tests.methods.helpers:bn_mlp")
    local_buffers = {"share_buffers": False}
    cfg = dict(model=model, trainer={"rounds": 1})
    attacked = make_loop(tiny_config("fedavg", local_buffers, attack={"kind": "scale", "fraction": 0.34}, **cfg))
    clean = make_loop(tiny_config("fedavg", local_buffers, **cfg))
    p = attacked.server.layout.num_params
    assert attacked.server.layout.num_buffers > 0
    w = clean.server["global"][:p].clone()
    seen: list[dict[int, Upload]] = []
    aggregate = attacked.method.aggregate
    attacked.method.aggregate = lambda server, uploads: (seen.append(uploads), aggregate(server, uploads))[1]
    attacked.run_round()
    _, honest = exchanged_round(clean)
    bad = attacked.evals.malicious & set(honest)
    assert bad
    for c in bad:
        assert seen[0][c].state.numel() == p
        torch.testing.assert_close(seen[0][c].state, w + 100 * (honest[c].state - w), rtol=1e-5, atol=1e-5)


def test_malicious_clients_are_distinct():
    for seed in range(5):
        a = malicious_clients(seed, 10, 0.9)
        assert len(set(a.tolist())) == len(a) == 9


def test_the_reference_is_the_named_payload_tensor_of_the_uploads_shape_then_any_then_the_fallback():
    state, g, other = torch.zeros(4), torch.full((4,), 1.0), torch.full((4,), 2.0)
    whole = torch.full((6,), 3.0)  # the full model: not in the coordinates of a 4-element upload
    assert reference_of({"other": other, "global": g}, state) is g  # the named key before any other
    assert reference_of({"global": whole, "other": other}, state) is other
    assert reference_of({"first": whole, "other": other}, state) is other
    assert reference_of({"first": 1.0, "other": other}, state) is other  # not a tensor: skipped
    fallback = torch.full((4,), 5.0)
    assert reference_of({"global": whole}, state, fallback) is fallback
    assert reference_of(None, state, fallback) is fallback
    for ref in (reference_of({"global": whole}, state, whole), reference_of({"global": whole}, state)):
        assert torch.equal(ref, torch.zeros(4))


def small_attack(kind: str, method=None, space: str = "auto", params: int = 6, buffers: int = 2) -> Attack:
    layout = ModelLayout(params, buffers, (("0", slice(0, params)),), torch.device("cpu"))
    cfg = AttackConfig(kind=kind, fraction=1.0, scale=10.0, space=space)
    return Attack(cfg, 0, 1, method if method is not None else FedAvg(), layout)


def test_only_the_parameters_of_a_full_state_are_attacked_and_a_shared_part_whole():
    attack = small_attack("scale")
    ref, state = torch.zeros(8), torch.arange(1.0, 9.0)
    out = attack.apply({0: Upload(state, 1.0)}, {0: {"global": ref}}, round_idx=0)[0].state
    assert torch.equal(out[:6], 10 * state[:6]) and torch.equal(out[6:], state[6:])  # buffers as trained
    part = torch.arange(1.0, 5.0)  # a shared part of 4 elements, fewer than the 6 parameters
    out = attack.apply({0: Upload(part, 1.0)}, {0: {"shared": torch.zeros(4)}}, round_idx=0)[0].state
    assert torch.equal(out, 10 * part)


def test_gaussian_noise_is_the_keyed_draw_around_the_reference_in_update_space_and_alone_in_parameter_space():
    from pfl.seeding import torch_generator

    ref, state = torch.full((8,), 0.5), torch.ones(8)
    noise = torch.randn(6, generator=torch_generator(0, 3, 0, "attack")) * 10.0
    auto = small_attack("gaussian")
    assert auto.space == "parameters"  # FedAvg uploads models
    out = auto.apply({0: Upload(state, 1.0)}, {0: {"global": ref}}, round_idx=3)[0].state
    assert torch.equal(out[:6], noise) and torch.equal(out[6:], state[6:])
    update = small_attack("gaussian", space="update")
    out = update.apply({0: Upload(state, 1.0)}, {0: {"global": ref}}, round_idx=3)[0].state
    assert torch.equal(out[:6], ref[:6] + noise)


def test_without_the_server_an_averaging_methods_attack_uses_the_payload_only():
    attack = small_attack("scale", params=4, buffers=0)
    out = attack.apply({0: Upload(torch.ones(4), 1.0)}, {0: {}}, round_idx=0)  # no server: no fallback
    assert torch.equal(out[0].state, 10 * torch.ones(4))  # around 0
