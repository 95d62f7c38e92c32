"""FedPG descent pieces: fairness gradient, common and personalized directions, conflicts, line search."""

from __future__ import annotations

import math

import pytest
import torch

from pfl.errors import ConfigError
from pfl.optim.descent import (
    armijo_line_search,
    common_direction,
    cone_projection_coefficients,
    conflict_fraction,
    fairness_coefficients,
    fairness_gradient,
    fairness_value,
    line_search_candidates,
    personal_direction,
    personal_directions,
)
from pfl.optim.minnorm import gram_matrix, min_norm
from tests.helpers.device_tags import is_on_device, training_device

F64 = torch.float64


def rand(*shape: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=F64)
    return x + shift * torch.randn(shape[-1], generator=g, dtype=F64)


# ------------------------------------------------------------------ fairness objective


def toy_losses(w: torch.Tensor, m: int) -> torch.Tensor:
    """m positive, differentiable client losses of w (5,): shifted quadratics plus a softplus."""
    g = torch.Generator().manual_seed(m)
    centers = torch.randn(m, w.numel(), generator=g, dtype=F64)
    weights = torch.rand(m, generator=g, dtype=F64) + 0.5
    return weights * ((w - centers) ** 2).sum(1) + torch.nn.functional.softplus(centers @ w)


@pytest.mark.parametrize("m", [1, 2, 5, 9])
def test_fairness_gradient_matches_autograd(m):
    w = torch.randn(5, generator=torch.Generator().manual_seed(10 + m), dtype=F64, requires_grad=True)
    losses = toy_losses(w, m)
    f = -torch.nn.functional.cosine_similarity(losses, torch.ones_like(losses), dim=0)
    (expected,) = torch.autograd.grad(f, w, retain_graph=True)
    jac = torch.stack([torch.autograd.grad(losses[i], w, retain_graph=True)[0] for i in range(m)])
    got = fairness_gradient(losses.detach(), jac)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert fairness_value(losses.detach()) == pytest.approx(f.item(), abs=1e-14)


def test_fairness_coefficients_are_orthogonal_to_the_losses_and_zero_for_one_client():
    losses = torch.tensor([0.3, 1.2, 2.5, 0.9], dtype=F64)
    h = fairness_coefficients(losses)
    assert abs(float(h @ losses)) < 1e-14
    # spelled out as in the paper: (1/‖L‖)(((Lᵀ1)L)/(‖1‖‖L‖²) − 1/‖1‖)
    n, one = losses.norm(), math.sqrt(4)
    torch.testing.assert_close(h, (losses.sum() * losses / (one * n**2) - 1 / one) / n)
    assert fairness_coefficients(torch.tensor([0.7])).tolist() == [0.0]
    assert fairness_value(torch.full((6,), 2.0)) == pytest.approx(-1.0)
    with pytest.raises(ConfigError, match="fairness.losses"):
        fairness_value(torch.zeros(3))


# ------------------------------------------------------------------ common direction


CASES = [  # (m, P, fairness, history rows, rescale)
    (3, 40, False, 0, "none"),
    (8, 40, True, 0, "none"),
    (8, 40, True, 0, "mean"),
    (6, 40, True, 4, "mean"),
    (6, 40, True, 4, "median"),
    (6, 40, False, 4, "none"),
    (25, 10, True, 3, "mean"),  # more rows than dimensions
    (25, 10, True, 3, "median"),
]


@pytest.mark.parametrize(("m", "p", "fair", "hist", "rescale"), CASES)
def test_common_direction_conflicts_with_no_row(m, p, fair, hist, rescale):
    for seed in range(12):
        grads = rand(m, p, seed=seed, shift=(seed % 3) * 0.7)
        losses = torch.rand(m, generator=torch.Generator().manual_seed(seed), dtype=F64) + 0.1
        fairness = fairness_gradient(losses, grads) if fair else None
        history = rand(hist, p, seed=1000 + seed, shift=0.5) if hist else None
        d, lam, info = common_direction(grads, fairness, history, rescale)
        rows = torch.cat([grads] + ([fairness[None]] if fair else []) + ([history] if hist else []))
        scale = float((rows * rows).sum(1).max())
        dots = rows @ d
        # Lemma 1: row·d ≤ 0 for every row (client, ∇F, history), to a 1e-6 relative tolerance, and
        # (scale_k·row_k)·d ≤ −‖d‖² for the rows as they entered Q
        assert float(dots.max()) <= 1e-6 * scale
        assert float((info.scales * dots + d @ d).max()) <= 1e-6 * scale
        assert float(lam.min()) >= 0 and abs(float(lam.sum()) - 1) < 1e-12
        torch.testing.assert_close(info.slopes, dots, rtol=1e-9, atol=1e-9 * scale)
        torch.testing.assert_close(d, -(info.coefficients @ rows), rtol=1e-12, atol=1e-12)
        assert info.norm_sq == pytest.approx(float(d @ d), rel=1e-9, abs=1e-12 * scale)


def test_two_opposite_gradients_give_zero_direction():
    g = rand(30, seed=1)
    grads = torch.stack([g, -2.0 * g])
    fairness = fairness_gradient(torch.tensor([0.5, 1.5], dtype=F64), grads)
    for row in (None, fairness):
        d, _, info = common_direction(grads, row)
        assert float(d.abs().max()) < 1e-12 * float(g.abs().max()) and info.norm_sq < 1e-20


def test_one_client_gives_minus_its_gradient_with_and_without_fairness():
    g = rand(1, 50, seed=2)
    fairness = fairness_gradient(torch.tensor([0.8], dtype=F64), g)
    for row, rescale in ((None, "none"), (fairness, "none"), (fairness, "mean"), (fairness, "median")):
        d, lam, info = common_direction(g, row, None, rescale)
        torch.testing.assert_close(d, -g[0], rtol=0, atol=0)
        assert lam[0] == 1.0
    assert info.dropped == (1,)  # ∇F ≡ 0 with one client: F ≡ −1


def test_fedpg_with_one_client_is_gradient_descent():
    target = rand(6, seed=3)
    curvature = torch.linspace(0.5, 2.0, 6, dtype=F64)
    w_pg, w_gd = torch.zeros(6, dtype=F64), torch.zeros(6, dtype=F64)
    for _ in range(25):
        loss = float((curvature * (w_pg - target) ** 2).sum()) + 1.0
        grad = 2 * curvature * (w_pg - target)
        d, _, _ = common_direction(grad[None], fairness_gradient(torch.tensor([loss]), grad[None]))
        w_pg = w_pg + 0.1 * d
        w_gd = w_gd - 0.1 * 2 * curvature * (w_gd - target)
    torch.testing.assert_close(w_pg, w_gd, rtol=0, atol=0)


def test_rescale_brings_auxiliary_rows_to_the_mean_client_norm():
    grads = rand(5, 20, seed=4, shift=1.0)
    fairness = 1e-3 * rand(20, seed=5)
    history = 50.0 * rand(2, 20, seed=6)
    _, lam_paper, info_paper = common_direction(grads, fairness, history, rescale="none")
    _, lam_code, info_code = common_direction(grads, fairness, history, rescale="mean")
    mu = grads.norm(dim=1).mean()
    assert info_paper.scales.tolist() == [1.0] * 8
    torch.testing.assert_close(info_code.scales[5], mu / fairness.norm())
    torch.testing.assert_close(info_code.scales[6:], mu / history.norm(dim=1))
    assert not torch.allclose(lam_paper, lam_code)  # the tiny ∇F row dominates the paper's hull
    # already at norm μ: rescaling changes nothing
    fairness_mu = fairness * (mu / fairness.norm())
    history_mu = history * (mu / history.norm(dim=1))[:, None]
    d1, _, _ = common_direction(grads, fairness_mu, history_mu, rescale="none")
    d2, _, _ = common_direction(grads, fairness_mu, history_mu, rescale="mean")
    torch.testing.assert_close(d1, d2, rtol=1e-9, atol=1e-12)


def test_median_rescaling_matches_a_hand_computation():
    # client norms 3, 4, 12 (odd count: the middle one) and 3, 4, 6, 12 (even: the mean of 4 and 6)
    fairness = torch.tensor([0.0, 0.5, 0.0], dtype=F64)  # norm 0.5
    history = torch.tensor([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]], dtype=F64)  # norms 2, 1
    for norms, median in (([3.0, 4.0, 12.0], 4.0), ([3.0, 4.0, 6.0, 12.0], 5.0)):
        grads = torch.tensor([[n, 0.0, 0.0] if k % 2 else [0.0, 0.0, n] for k, n in enumerate(norms)], dtype=F64)
        _, _, info = common_direction(grads, fairness, history, rescale="median")
        expected = [1.0] * len(norms) + [median / 0.5, median / 2.0, median / 1.0]
        torch.testing.assert_close(info.scales, torch.tensor(expected, dtype=F64), rtol=1e-15, atol=0)
    _, _, info = common_direction(grads, fairness, history, rescale="mean")
    assert float(info.scales[4]) == pytest.approx(6.25 / 0.5)  # mean of 3, 4, 6, 12


def test_one_outlier_upload_leaves_the_median_weight_of_grad_f_and_switches_the_mean_one_off():
    """Clients g1 = 2e1, g2 = 2e2, g3 = 2(e1 + e2) (norms 2, 2, 2√2; median 2), ∇F ∝ e3. With ∇F at
    norm μ the min-norm point of the hull of {2e1, 2e2, μe3} is d = −(λ1·2, λ2·2, λ_F·μ) with
    λ ∝ 1/‖row‖², so λ_F = μ⁻² / (¼ + ¼ + μ⁻²); g3 is inactive (g3·d = −8/3 < −‖d‖² at μ = 2) at any
    scale k ≥ 1. An attack multiplies g3 by 100: the median stays 2 (λ_F = 1/3 before and after),
    the mean goes from (4 + 2√2)/3 to (4 + 200√2)/3 and λ_F to ≈ 2·10⁻⁴."""
    fairness = torch.tensor([0.0, 0.0, 0.01], dtype=F64)
    expected = lambda mu: mu**-2 / (0.5 + mu**-2)  # noqa: E731
    for k in (1.0, 100.0):
        grads = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [2.0 * k, 2.0 * k, 0.0]], dtype=F64)
        _, lam_median, _ = common_direction(grads, fairness, None, "median")
        _, lam_mean, _ = common_direction(grads, fairness, None, "mean")
        assert float(lam_median[3]) == pytest.approx(1 / 3, abs=1e-6)
        assert float(lam_mean[3]) == pytest.approx(expected((4 + 2 * math.sqrt(2) * k) / 3), abs=1e-6)
        assert float(lam_median[2]) == pytest.approx(0.0, abs=1e-6)  # the outlier's row is inactive
    assert float(lam_mean[3]) < 3e-4  # attacked: the mean rule switches ∇F off


def test_unknown_rescale_is_refused():
    with pytest.raises(ConfigError, match="common_direction.rescale: unknown value 'max'"):
        common_direction(rand(2, 3, seed=41), rescale="max")
    with pytest.raises(ConfigError, match="common_direction.rescale: unknown value True"):
        common_direction(rand(2, 3, seed=41), rescale=True)


def test_common_direction_bad_input():
    grads = rand(3, 8, seed=7)
    with pytest.raises(ConfigError, match="common_direction.fairness_row"):
        common_direction(grads, torch.ones(7, dtype=F64))
    with pytest.raises(ConfigError, match="common_direction.history"):
        common_direction(grads, None, torch.ones(2, 9, dtype=F64))
    with pytest.raises(ConfigError, match="common_direction.grads"):
        common_direction(torch.full((2, 8), float("nan")))


# ------------------------------------------------------------------ conflict metric


def test_conflict_fraction_sign_convention():
    # pseudo-gradients point uphill; FedAvg applies Δ = −mean(g); the client opposing the mean conflicts
    grads = torch.tensor([[1.0, 0.0], [1.0, 0.2], [-0.5, 0.0], [0.0, 1.0]], dtype=F64)
    update = -grads.mean(0)  # (−0.375, −0.3)
    assert conflict_fraction(grads, update) == pytest.approx(1 / 4)
    assert conflict_fraction(grads, -update) == pytest.approx(3 / 4)
    assert conflict_fraction(grads, torch.zeros(2, dtype=F64)) == 0.0
    assert conflict_fraction(torch.tensor([[1.0, 0.0]]), torch.tensor([1e-9, 1.0]), rel_tol=1e-6) == 0.0


def test_fedpg_update_has_no_conflict_where_fedavg_has():
    grads = torch.tensor([[1.0, 0.0], [1.0, 0.2], [-0.5, 0.5]], dtype=F64)  # all ascend along (0.2, 1)
    assert conflict_fraction(grads, -grads.mean(0)) == pytest.approx(1 / 3)
    d, _, _ = common_direction(grads)
    assert conflict_fraction(grads, 0.1 * d, rel_tol=1e-9) == 0.0


# ------------------------------------------------------------------ personalized direction


def assert_in_cone(d: torch.Tensor, others: torch.Tensor) -> None:
    scale = float((others * others).sum(1).max()) if others.numel() else 1.0
    assert others.numel() == 0 or float((others @ d).max()) <= 1e-8 * scale


@pytest.mark.parametrize(("m", "p"), [(2, 15), (6, 30), (12, 8)])
@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.6, 1.0])
def test_personal_direction_conflicts_with_no_other_client(m, p, gamma):
    for seed in range(4):
        grads = rand(m, p, seed=seed, shift=(seed % 3) * 0.6)
        common, _, _ = common_direction(grads)
        for use_common in (None, common):
            ds = personal_directions(grads, gamma, common=use_common)
            for i in range(m):
                others = torch.cat([grads[:i], grads[i + 1 :]])
                assert_in_cone(ds[i], others)
                assert float(grads[i] @ ds[i]) <= 1e-8 * float(grads[i] @ grads[i])
            i = seed % m  # the one-client entry point computes the same row
            others = torch.cat([grads[:i], grads[i + 1 :]])
            single = personal_direction(grads[i], others, gamma, common=use_common)
            torch.testing.assert_close(single, ds[i], rtol=1e-9, atol=1e-10)


def test_projection_is_the_closest_non_conflicting_direction():
    """KKT of min ‖d + g_i‖² s.t. g_j·d ≤ 0: d = −g_i − Σ μ_j g_j, μ ≥ 0, μ_j (g_j·d) = 0."""
    for seed in range(10):
        grads = rand(7, 20, seed=seed, shift=0.8)
        gram = gram_matrix(grads)
        coef = cone_projection_coefficients(gram, 2)
        d = -(coef @ grads)
        others = torch.cat([grads[:2], grads[3:]])
        mu = torch.cat([coef[:2], coef[3:]])
        assert coef[2] == 1.0 and float(mu.min()) >= 0
        assert_in_cone(d, others)
        assert float((mu * (others @ d)).abs().max()) <= 1e-8 * float(gram.diagonal().max())
        torch.testing.assert_close(personal_direction(grads[2], others, 1.0), d, rtol=1e-10, atol=1e-12)
        # g_i · d = −‖d‖² (Moreau decomposition)
        assert float(grads[2] @ d) == pytest.approx(-float(d @ d), rel=1e-8, abs=1e-10)


def test_personal_direction_closed_forms():
    own = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    # no other client, or none that −g_i conflicts with: the own steepest descent
    torch.testing.assert_close(personal_direction(own, torch.zeros(0, 3, dtype=F64), 1.0), -own)
    friends = torch.tensor([[1.0, 1.0, 0.0], [0.5, 0.0, 2.0]], dtype=F64)
    torch.testing.assert_close(personal_direction(own, friends, 1.0), -own)
    # one conflicting client: projection onto the half-space g_j·d ≤ 0 lands on its boundary
    gj = torch.tensor([-1.0, 1.0, 0.0], dtype=F64)
    d = personal_direction(own, gj[None], 1.0)
    torch.testing.assert_close(d, -own + (gj @ own) / (gj @ gj) * gj)
    assert abs(float(gj @ d)) < 1e-12 and float(own @ d) < 0
    # −g_i in the cone of the others: client i cannot improve without conflict, d_i = 0
    others = torch.tensor([[-1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]], dtype=F64)
    assert float(personal_direction(own, others, 1.0).abs().max()) < 1e-10


def test_gamma_zero_is_the_common_direction_and_gamma_mixes_linearly():
    grads = rand(5, 12, seed=11, shift=0.5)
    mgda = -(min_norm(grads).direction)
    torch.testing.assert_close(personal_directions(grads, 0.0), mgda.expand(5, -1), rtol=1e-9, atol=1e-12)
    common, _, _ = common_direction(grads, fairness_gradient(torch.rand(5, dtype=F64) + 0.1, grads))
    torch.testing.assert_close(personal_directions(grads, 0.0, common=common), common.expand(5, -1))
    d0, d1 = personal_directions(grads, 0.0, common=common), personal_directions(grads, 1.0)
    torch.testing.assert_close(personal_directions(grads, 0.3, common=common), 0.7 * d0 + 0.3 * d1)


def test_personal_direction_bad_input():
    with pytest.raises(ConfigError, match="personal.gamma"):
        personal_direction(torch.ones(3), torch.ones(1, 3), 1.5)
    with pytest.raises(ConfigError, match="personal.others"):
        personal_direction(torch.ones(3), torch.ones(1, 4), 0.5)


# ------------------------------------------------------------------ S-FedPG line search


class QuadraticOracle:
    """L_i(w + ηd) = L_i + η·slope_i + ½η²·curv_i (+ an optional per-client offset that ignores the
    slope, to break Armijo on purpose). Records every η it is asked for."""

    def __init__(self, losses, slopes, curv, offset=None):
        self.losses, self.slopes = torch.tensor(losses, dtype=F64), torch.tensor(slopes, dtype=F64)
        self.curv = torch.tensor(curv, dtype=F64)
        self.offset = torch.zeros_like(self.losses) if offset is None else torch.tensor(offset, dtype=F64)
        self.calls: list[float] = []

    def __call__(self, eta: float) -> torch.Tensor:
        self.calls.append(eta)
        return self.losses + eta * self.slopes + 0.5 * eta**2 * self.curv + self.offset * (eta > 0)


def search(oracle: QuadraticOracle, **kw):
    args = dict(eta=0.1, s=2, beta=0.5, sigma=1.0, prev_all_present=True, losses=oracle.losses, slopes=oracle.slopes)
    args.update(kw)
    return armijo_line_search(oracle, **args)


def test_candidates_follow_algorithm_1():
    assert line_search_candidates(0.1, 2, 1.0, True) == pytest.approx([0.4, 0.2, 0.1, 0.05, 0.025])
    assert line_search_candidates(0.1, 2, 1.0, False) == pytest.approx([0.1, 0.05, 0.025])
    assert line_search_candidates(0.1, 2, 2.0, True) == pytest.approx([0.4, 0.2, 0.1, 0.05, 0.025, 0.0125])
    assert line_search_candidates(0.1, 1, 0.1, True) == pytest.approx([0.2])  # η_lb = 0.5 > η_ub: η_ub alone
    assert line_search_candidates(0.1, 0, 1.0, True) == pytest.approx([0.1])


def test_armijo_accepts_the_largest_candidate_that_satisfies_it():
    # Armijo holds for client i iff η ≤ 2(1 − β)|slope_i|/curv_i: 0.12 and 0.3 → binding 0.12
    oracle = QuadraticOracle([1.0, 2.0], [-1.2, -3.0], [10.0, 10.0])
    r = search(oracle)
    assert r.rule == "armijo" and r.eta == pytest.approx(0.1)
    assert oracle.calls == pytest.approx([0.4, 0.2, 0.1]) and r.trials == 3
    torch.testing.assert_close(r.losses, oracle(0.1))
    assert all(r.losses <= oracle.losses + 0.5 * 0.1 * oracle.slopes)


def test_armijo_on_f_can_reject_a_step_the_clients_accept():
    # the high-loss client falls much faster: F = −cos(L, 1) falls at first (∇F·d < 0), but at η_ub = 0.4
    # the losses have crossed (0.8 vs 0.2) and F is back up, though both clients pass their own test
    l0, slopes = torch.tensor([1.0, 2.0], dtype=F64), torch.tensor([-0.5, -4.5], dtype=F64)
    f_slope = float(fairness_coefficients(l0) @ slopes)  # ∇F·d = Σ h_i g_i·d
    assert f_slope < 0
    assert search(QuadraticOracle(l0.tolist(), slopes.tolist(), [0.0, 0.0])).eta == pytest.approx(0.4)
    oracle = QuadraticOracle(l0.tolist(), slopes.tolist(), [0.0, 0.0])
    r = search(oracle, fairness_slope=f_slope)
    assert r.rule == "armijo" and r.eta < 0.4 and r.trials == len(oracle.calls) > 1

    def f_armijo(eta: float) -> bool:
        return fairness_value(l0 + eta * slopes) <= fairness_value(l0) + 0.5 * eta * f_slope

    assert f_armijo(r.eta) and not any(f_armijo(eta) for eta in oracle.calls[:-1])


def test_mean_loss_fallback_when_one_client_never_meets_armijo():
    # client 1's loss rises by 0.05 at every step: Armijo fails everywhere; the mean still drops
    oracle = QuadraticOracle([1.0, 1.0], [-1.0, -1.0], [8.0, 8.0], offset=[0.0, 0.05])
    r = search(oracle)
    assert r.rule == "mean_loss" and r.trials == 5
    means = {eta: mean for eta, mean in r.tried}
    assert r.eta == max(eta for eta, mean in means.items() if mean < 1.0)
    assert r.eta == pytest.approx(0.2)  # at 0.4: mean = 1 − 0.4 + 0.64 + 0.025 > 1


def test_best_seen_when_no_candidate_lowers_the_mean():
    oracle = QuadraticOracle([1.0, 1.0], [-1.0, -1.0], [4.0, 4.0], offset=[0.3, 0.3])
    r = search(oracle)
    assert r.rule == "best_seen" and r.trials == 5
    best = min(r.tried, key=lambda t: t[1])
    assert r.eta == best[0] and r.eta == pytest.approx(0.2)


def test_absent_client_caps_the_first_trial_at_eta():
    oracle = QuadraticOracle([1.0], [-1.0], [0.0])
    r = search(oracle, prev_all_present=False)
    assert oracle.calls[0] == pytest.approx(0.1) and r.eta == pytest.approx(0.1) and r.rule == "armijo"
    oracle = QuadraticOracle([1.0], [-1.0], [0.0])
    assert search(oracle, prev_all_present=True).eta == pytest.approx(0.4)


def test_divergent_losses_fail_and_rank_last():
    calls = []

    def oracle(eta):
        calls.append(eta)
        return torch.tensor([float("nan") if eta > 0.15 else 1.0 - eta], dtype=F64)

    r = armijo_line_search(
        oracle, eta=0.1, s=2, beta=0.5, sigma=1.0, prev_all_present=True,
        losses=torch.tensor([1.0], dtype=F64), slopes=torch.tensor([-1.0], dtype=F64),
    )  # fmt: skip
    assert r.rule == "armijo" and r.eta == pytest.approx(0.1) and calls == pytest.approx([0.4, 0.2, 0.1])


def test_line_search_bad_input():
    oracle = QuadraticOracle([1.0], [-1.0], [0.0])
    for field, kw in (("line_search.beta", {"beta": 1.0}), ("line_search.sigma", {"sigma": 0.0})):
        with pytest.raises(ConfigError, match=field):
            search(oracle, **kw)
    with pytest.raises(ConfigError, match="line_search.slopes"):
        search(oracle, slopes=torch.ones(2))


# ------------------------------------------------------------------ edge cases of the rules


def test_auxiliary_row_at_the_zero_tolerance_is_dropped_and_above_it_kept():
    """A row with ‖row‖ ≤ 1e-12 · max_i ‖g_i‖ is dropped (scale 0, λ 0); just above it stays in the hull."""
    grads = torch.tensor([[4.0, 0.0], [0.0, 3.0]], dtype=F64)  # largest client norm 4: the bound is 4e-12
    d, lam, info = common_direction(grads, torch.tensor([4e-12, 0.0], dtype=F64))  # exactly at the bound
    assert info.dropped == (2,) and info.scales.tolist() == [1.0, 1.0, 0.0] and lam[2] == 0.0
    torch.testing.assert_close(d, common_direction(grads)[0], rtol=0, atol=0)
    d, lam, info = common_direction(grads, torch.tensor([6e-12, 0.0], dtype=F64))
    assert info.dropped == () and info.scales.tolist() == [1.0, 1.0, 1.0]
    assert float(d.norm()) <= 6e-12  # the kept tiny row pulls the min-norm point to it
    # all-zero client gradients: the bound is 0, and a zero auxiliary row still meets it
    zeros = torch.zeros(2, 3, dtype=F64)
    _, _, info = common_direction(zeros, torch.zeros(3, dtype=F64), torch.zeros(1, 3, dtype=F64))
    assert info.dropped == (2, 3) and info.scales.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_common_direction_info_counts_its_rows():
    grads = rand(4, 6, seed=20)
    _, _, info = common_direction(grads)
    assert (info.num_clients, info.has_fairness, info.num_history) == (4, False, 0)
    fairness = fairness_gradient(torch.tensor([0.2, 0.4, 0.6, 0.9], dtype=F64), grads)
    _, lam, info = common_direction(grads, fairness, rand(3, 6, seed=21))
    assert (info.num_clients, info.has_fairness, info.num_history) == (4, True, 3) and lam.numel() == 8
    _, lam, info = common_direction(grads, None, torch.zeros(0, 6, dtype=F64))
    assert (info.has_fairness, info.num_history) == (False, 0) and lam.numel() == 4


def test_rows_enter_as_given_by_default_as_in_the_paper():
    import inspect

    assert inspect.signature(common_direction).parameters["rescale"].default == "none"
    grads = rand(4, 10, seed=22, shift=1.0)
    fairness, history = 1e-2 * rand(10, seed=23), 20.0 * rand(2, 10, seed=24)
    d, lam, info = common_direction(grads, fairness, history)
    d_paper, lam_paper, _ = common_direction(grads, fairness, history, rescale="none")
    assert info.scales.tolist() == [1.0] * 7
    torch.testing.assert_close(d, d_paper, rtol=0, atol=0)
    torch.testing.assert_close(lam, lam_paper, rtol=0, atol=0)


def test_results_are_immutable():
    import dataclasses

    _, _, info = common_direction(rand(2, 3, seed=25))
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.norm_sq = 0.0
    r = search(QuadraticOracle([1.0], [-1.0], [0.0]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.eta = 1.0


def test_refused_shapes_name_their_field():
    with pytest.raises(ConfigError, match="fairness.losses"):
        fairness_value(torch.ones(2, 3))
    grads = rand(3, 4, seed=26)
    for bad in (torch.zeros(0, 4, dtype=F64), torch.ones(4, dtype=F64)):  # no client; one vector, not (m, P)
        with pytest.raises(ConfigError, match="common_direction.grads"):
            common_direction(bad)
        with pytest.raises(ConfigError, match="conflict.grads"):
            conflict_fraction(bad, torch.ones(4, dtype=F64))
        with pytest.raises(ConfigError, match="personal.grads"):
            personal_directions(bad, 0.5)
    with pytest.raises(ConfigError, match="personal.clients"):
        personal_directions(grads, 0.5, clients=[0, 3])
    with pytest.raises(ConfigError, match="personal.index"):
        cone_projection_coefficients(gram_matrix(grads), 3)


def test_conflict_tolerance_is_on_the_cosine_so_scale_free():
    """With rel_tol = τ a row counts iff cos(g_i, Δ) > τ, whatever the norms of g_i and Δ."""
    grads = torch.tensor([[10.0, 0.0], [0.0, 0.1], [3.0, 4.0], [1.0, 3.0]], dtype=F64)  # cos 1, 0, 0.6, 0.32
    update = torch.tensor([5.0, 0.0], dtype=F64)
    for gs, us in ((1.0, 1.0), (7.0, 0.01), (0.02, 300.0)):
        assert conflict_fraction(gs * grads, us * update, rel_tol=0.5) == pytest.approx(2 / 4)
        assert conflict_fraction(gs * grads, us * update, rel_tol=0.3) == pytest.approx(3 / 4)


class TableOracle:
    """Losses looked up per tried η (the candidates of eta=0.1, s=2, σ=1: 0.4, 0.2, 0.1, 0.05, 0.025)."""

    def __init__(self, table):
        self.table = {eta: torch.tensor(losses, dtype=F64) for eta, losses in table.items()}

    def __call__(self, eta: float) -> torch.Tensor:
        return self.table[eta]


def table_search(table, **kw):
    args = dict(eta=0.1, s=2, beta=0.5, sigma=1.0, prev_all_present=True)
    args |= dict(losses=torch.tensor([1.0, 1.0], dtype=F64), slopes=torch.tensor([-1.0, -1.0], dtype=F64)) | kw
    return armijo_line_search(TableOracle(table), **args)


def test_mean_loss_fallback_takes_the_largest_step_that_strictly_lowered_the_mean():
    # client 2 never falls, so Armijo fails everywhere; at 0.4 the mean only equals the start (1.0)
    table = {0.4: [1.0, 1.0], 0.2: [0.9, 1.0], 0.1: [0.99, 1.0], 0.05: [0.98, 1.0], 0.025: [1.2, 1.2]}
    r = table_search(table)
    assert r.rule == "mean_loss" and r.trials == 5 and r.eta == pytest.approx(0.2)  # not the largest mean drop
    assert r.losses.tolist() == [0.9, 1.0]


def test_best_seen_ties_keep_the_smaller_step():
    r = table_search({eta: [1.1, 1.1] for eta in (0.4, 0.2, 0.1, 0.05, 0.025)})
    assert r.rule == "best_seen" and r.eta == pytest.approx(0.025)


def test_armijo_conditions_are_not_strict():
    # every client's loss exactly on its Armijo line L_i + βη g_i·d: accepted at the first candidate
    l0, slopes = torch.tensor([1.0, 2.0], dtype=F64), torch.tensor([-1.0, -3.0], dtype=F64)
    r = table_search({eta: (l0 + (0.5 * eta) * slopes).tolist() for eta in (0.4, 0.2)}, losses=l0, slopes=slopes)
    assert r.rule == "armijo" and r.trials == 1 and r.eta == pytest.approx(0.4)
    # F exactly on its Armijo line: every loss halved leaves F = −cos(L, 1) unchanged, ∇F·d = 0
    l0 = torch.tensor([1.0, 3.0], dtype=F64)
    table = {eta: (0.5 * l0).tolist() for eta in (0.4, 0.2, 0.1, 0.05, 0.025)}
    r = table_search(table, losses=l0, slopes=-l0, fairness_slope=0.0)
    assert r.rule == "armijo" and r.trials == 1


def test_armijo_on_f_demands_its_predicted_decrease():
    # F unchanged at every step while ∇F·d = −0.1 predicts a fall: no candidate passes Eq. (6) for F
    l0 = torch.tensor([1.0, 3.0], dtype=F64)
    table = {eta: (0.5 * l0).tolist() for eta in (0.4, 0.2, 0.1, 0.05, 0.025)}
    r = table_search(table, losses=l0, slopes=-l0, fairness_slope=-0.1)
    assert r.rule == "mean_loss" and r.trials == 5 and r.eta == pytest.approx(0.4)


def test_window_exponent_zero_tries_eta_alone():
    oracle = QuadraticOracle([1.0], [-1.0], [0.0])
    r = search(oracle, s=0)
    assert oracle.calls == pytest.approx([0.1]) and r.eta == pytest.approx(0.1) and r.rule == "armijo"


def test_lower_bound_has_a_relative_round_off_slack_of_1e_12():
    # η = 1, s = 1: candidates 2, 1, 0.5, … down to η_lb = 0.5/σ
    assert line_search_candidates(1.0, 1, 1.0, True) == [2.0, 1.0, 0.5]
    assert line_search_candidates(1.0, 1, 1 / (1 + 0.5e-12), True) == [2.0, 1.0, 0.5]  # 0.5e-12 below: tried
    assert line_search_candidates(1.0, 1, 1 / (1 + 1.5e-12), True) == [2.0, 1.0]  # 1.5e-12 below: not


def test_line_search_refuses_bad_settings_before_any_trial(monkeypatch):
    import pfl.optim.descent as descent

    def no_candidates(*args):
        raise AssertionError("candidates built for a refused setting")

    monkeypatch.setattr(descent, "line_search_candidates", no_candidates)
    oracle = QuadraticOracle([1.0], [-1.0], [0.0])
    cases = [("line_search.eta", {"eta": e}) for e in (0.0, -0.1, math.inf)]  # η = 0 would halve forever
    cases += [("line_search.s", {"s": s}) for s in (-1, 1.5)] + [("line_search.beta", {"beta": 0.0})]
    for field, kw in cases:
        with pytest.raises(ConfigError, match=field):
            search(oracle, **kw)
    assert oracle.calls == []


def test_the_line_search_holds_on_the_losses_device_whatever_the_oracle_answers_on():
    """S-FedPG's uploaded losses and slopes live on the training device; its oracle builds the trial
    losses from numbers on the host: the search compares them on the losses' device."""
    with training_device() as dev:
        losses = torch.tensor([1.0, 1.0], dtype=F64, device=dev)
        slopes = torch.tensor([-1.0, -1.0], dtype=F64, device=dev)
        r = armijo_line_search(
            lambda eta: torch.tensor([1.0 - eta, 1.0 - eta], dtype=F64),  # on the host
            eta=0.1, s=1, beta=0.5, sigma=1.0, prev_all_present=True, losses=losses, slopes=slopes,
        )  # fmt: skip
        assert r.rule == "armijo" and r.eta == 0.2 and is_on_device(r.losses)
