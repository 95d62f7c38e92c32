"""Tests of pfl/methods/fedmgda.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pfl.config import AttackConfig
from pfl.engine.flat import ModelLayout
from pfl.errors import ConfigError
from pfl.federation.attacks import Attack
from pfl.methods import ServerContext, Upload, method_class
from tests.methods.helpers import bare_server

ROOT = Path(__file__).resolve().parents[2]


def mgda_round(epsilon: float, grads: dict[int, torch.Tensor]):
    method = method_class("fedmgda_plus")(epsilon=epsilon)
    p = next(iter(grads.values())).numel()
    server = bare_server(method, p, num_clients=len(grads))
    w = server["global"].clone()
    method.aggregate(server, {c: Upload(w - g, 1.0) for c, g in grads.items()})
    return server, server["global"] - w


def test_fedmgda_weights_stay_in_the_epsilon_box_on_the_simplex():
    gen = torch.Generator().manual_seed(9)
    grads = {c: torch.randn(7, generator=gen, dtype=torch.float64) for c in range(5)}
    for eps in (0.0, 0.05, 0.1, 1.0):
        server, _ = mgda_round(eps, grads)
        lam = server["lambda"]
        assert abs(float(lam.sum()) - 1) < 1e-9
        assert bool((lam >= max(0.0, 0.2 - eps) - 1e-9).all() and (lam <= 0.2 + eps + 1e-9).all())
    _, step = mgda_round(0.0, grads)  # ε = 0: FedAvg on normalised updates
    expected = -sum(g / g.norm() for g in grads.values()) / 5
    torch.testing.assert_close(step, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("center", ["samples", "uniform"])
def test_fedmgda_box_is_around_the_sample_weights_by_default_or_uniform(center):
    """Sizes 10, 30, 60: λ⁰ = (0.1, 0.3, 0.6) (the paper) or 1/3 each. At ε = 0 the step is
    −Σ λ⁰_i ĝ_i exactly; at ε = 0.05 every λ_i stays within 0.05 of λ⁰_i."""
    from pfl.methods.fedmgda import FedMGDAPlus

    gen = torch.Generator().manual_seed(11)
    grads = {c: torch.randn(5, generator=gen, dtype=torch.float64) for c in range(3)}
    sizes = {0: 10.0, 1: 30.0, 2: 60.0}
    lam0 = torch.tensor([0.1, 0.3, 0.6] if center == "samples" else [1 / 3] * 3, dtype=torch.float64)
    for eps in (0.0, 0.05):
        method = FedMGDAPlus(epsilon=eps, center=center)
        server = bare_server(method, 5, num_clients=3)
        w = server["global"].clone()
        method.aggregate(server, {c: Upload(w - g, sizes[c]) for c, g in grads.items()})
        assert float((server["lambda"] - lam0).abs().max()) <= eps + 1e-9
        if eps == 0.0:
            expected = -sum(lam0[c] * g / g.norm() for c, g in grads.items())
            torch.testing.assert_close(server["global"] - w, expected, rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="method.center: unknown value 'median'"):
        FedMGDAPlus(center="median")


def test_fedmgda_epsilon_01_can_conflict_where_mgda_does_not():
    """Nine clients agree, one points the other way: the common direction needs weight ≈ 1/2 on the
    tenth, but ε = 0.1 caps it at 0.2, so the step raises its loss (FedPG's Fig. 1 argument)."""
    a = torch.tensor([1.0, 0.0], dtype=torch.float64)
    b = torch.tensor([-1.0, 0.01], dtype=torch.float64)
    grads = {**{c: a.clone() for c in range(9)}, 9: b}
    server, step = mgda_round(0.1, grads)
    assert float(b @ step) > 0 and server["stats"]["conflicts"] == 1
    server, step = mgda_round(1.0, grads)
    assert all(float(g @ step) <= 1e-12 for g in grads.values()) and server["stats"]["conflicts"] == 0


# -- configuration: FedPG, S-FedPG, FedMGDA+ and SplitGP ---------------------------------------------
@pytest.mark.parametrize("name", ["fedpg", "sfedpg", "fedmgda_plus", "splitgp"])
def test_class_defaults_are_the_paper_config(name):
    import yaml

    conf = dict(yaml.safe_load((ROOT / "conf" / "method" / f"{name}.yaml").read_text())["method"])
    default = method_class(conf.pop("name"))()
    assert {k: getattr(default, k) for k in conf} == conf
    assert default.hparams().items() >= conf.items()


# -- mutation-testing survivors: fedmgda_plus --
def test_fedmgda_hyperparameters_are_checked_at_their_bounds():
    from pfl.methods.fedmgda import FedMGDAPlus

    assert FedMGDAPlus(epsilon=0.0).epsilon == 0.0 and FedMGDAPlus(lr_decay=1.0).lr_decay == 1.0
    for field, bad in (("epsilon", -0.01), ("server_lr", 0.0), ("server_lr", math.inf)):
        with pytest.raises(ConfigError, match=f"method.{field}"):
            FedMGDAPlus(**{field: bad})
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match="method.lr_decay"):
            FedMGDAPlus(lr_decay=bad)


def test_fedmgda_attacks_in_auto_space_perturb_the_pseudo_gradient():
    layout = ModelLayout(4, 0, (("0", slice(0, 4)),), torch.device("cpu"))
    attack = Attack(
        AttackConfig(kind="gaussian", fraction=0.5, scale=0.3), 0, 4, method_class("fedmgda_plus")(), layout
    )
    assert attack.space == "update"


def test_fedmgda_step_is_added_to_w_with_the_decayed_rate_and_unit_or_raw_rows():
    """ε = 0 is FedAvg on the normalised updates: the step is −η·lr_decay^t·mean(ĝ_i), added to a nonzero w,
    whatever the norms (below 1 here; a zero update stays a zero row); normalize=False uses the raw g_i."""
    from pfl.methods.fedmgda import FedMGDAPlus

    grads = {0: torch.tensor([0.3, 0.0, 0.0], dtype=torch.float64), 1: torch.tensor([0.0, 0.4, 0.0]).double()}
    grads[2] = torch.zeros(3, dtype=torch.float64)
    w0 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    for normalize, direction in ((True, [1.0, 1.0, 0.0]), (False, [0.3, 0.4, 0.0])):
        method = FedMGDAPlus(epsilon=0.0, server_lr=0.8, lr_decay=0.5, normalize=normalize)
        server = bare_server(method, 3, num_clients=3, round_idx=2)
        server["global"] = w0.clone()
        method.aggregate(server, {c: Upload(w0 - g, 1.0) for c, g in grads.items()})
        expected = w0 - 0.8 * 0.25 * torch.tensor(direction, dtype=torch.float64) / 3
        torch.testing.assert_close(server["global"], expected, rtol=0, atol=1e-8)


def test_fedmgda_buffers_are_the_sample_weighted_mean_and_stay_out_of_the_solve():
    from pfl.methods.fedmgda import FedMGDAPlus

    p, b = 2, 2
    layout = ModelLayout(p, b, (("0", slice(0, p)),), torch.device("cpu"))
    method = FedMGDAPlus(epsilon=0.0)
    server = ServerContext(0, 2, 2, layout, torch.zeros(p + b, dtype=torch.float64))
    server.state = method.init_server(server)
    w = torch.tensor([1.0, 1.0, 5.0, 7.0], dtype=torch.float64)
    server["global"] = w.clone()
    states = {0: torch.tensor([0.0, 1.0, 1.0, 2.0]).double(), 1: torch.tensor([1.0, -1.0, 3.0, 10.0]).double()}
    method.aggregate(server, {0: Upload(states[0], 1.0), 1: Upload(states[1], 3.0)})
    # ĝ_0 = (1, 0), ĝ_1 = (0, 1): the buffers' differences do not enter the normalisation; at ε = 0
    # λ = λ⁰ = the sample shares (1/4, 3/4).
    expected = torch.tensor([0.75, 0.25, 0.25 * 1.0 + 0.75 * 3.0, 0.25 * 2.0 + 0.75 * 10.0], dtype=torch.float64)
    torch.testing.assert_close(server["global"], expected, rtol=0, atol=1e-12)


def test_fedmgda_conflict_statistics_count_over_rounds():
    """Round 1 has one client with g_i·Δ > 0, round 2 two clients with g_i·Δ = 0 exactly (not conflicts),
    round 3 only zero updates (Δ = 0: no conflict); the share of conflicting rounds is 1/1, 1/2, 1/3."""
    from pfl.methods.fedmgda import FedMGDAPlus

    e = torch.eye(3, dtype=torch.float64)
    a, b = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), torch.tensor([-1.0, 0.01, 0.0], dtype=torch.float64)
    rounds = [
        (0.1, {**{c: a.clone() for c in range(9)}, 9: b}, 1),
        (0.0, {0: e[0], 1: -e[0], 2: e[1]}, 0),
        (0.1, {0: torch.zeros(3, dtype=torch.float64), 1: torch.zeros(3, dtype=torch.float64)}, 0),
    ]
    method = FedMGDAPlus()
    server = bare_server(method, 3, num_clients=10)
    assert server["rounds"] == 0 and server["conflict_rounds"] == 0
    for t, (eps, grads, conflicts) in enumerate(rounds, start=1):
        method.epsilon = eps
        w = server["global"].clone()
        method.aggregate(server, {c: Upload(w - g, 1.0) for c, g in grads.items()})
        assert server["stats"]["conflicts"] == conflicts
        assert server["rounds"] == t and server["conflict_rounds"] == 1
        assert server["stats"]["conflict_rounds"] == 1 / t
