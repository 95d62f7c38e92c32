"""Tests of pfl/federation/attacks.py: who is malicious, and what their uploads become."""

from __future__ import annotations

import pytest
import torch

from pfl.config import AttackConfig
from pfl.engine.flat import ModelLayout
from pfl.federation.attacks import Attack, malicious_clients
from pfl.methods import Upload
from pfl.methods.fedpg import FedPG
from tests.conftest import make_loop, tiny_config
from tests.methods_helpers import exchanged_round


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
    bad = attacked.attack.malicious
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
