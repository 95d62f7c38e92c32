"""The ε-box min-norm QP of FedMGDA+: both solvers agree, answers are feasible and certified, and the
limits ε = 0 (FedAvg weights) and ε ≥ 1 (MGDA's simplex) come out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pfl.errors import ConfigError
from pfl.optim import capped_simplex
from pfl.optim.capped_simplex import (
    box_around,
    capped_gap,
    linear_minimizer,
    min_norm_capped,
    project_capped_simplex,
)
from pfl.optim.minnorm import min_norm


def gram(seed: int, k: int, p: int = 40) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, p, generator=gen, dtype=torch.float64)
    v = torch.randn(k, p, generator=gen, dtype=torch.float64) + 0.5 * shared
    return v @ v.T


@pytest.mark.parametrize("k", [3, 10, 30])
@pytest.mark.parametrize("eps", [0.02, 0.1, 0.3])
def test_cvxopt_and_projected_gradient_agree_and_are_certified(k, eps):
    g = gram(k, k)
    lo, up = box_around(np.full(k, 1.0 / k), eps)
    a = min_norm_capped(g, lo, up, solver="cvxopt")
    b = min_norm_capped(g, lo, up, solver="pgd")
    assert a.solver_used == "cvxopt" and b.solver_used == "pgd"
    assert abs(a.norm_sq - b.norm_sq) <= 1e-8 * float(g.diagonal().max())
    for r in (a, b):
        lam = r.weights.numpy()
        assert abs(lam.sum() - 1) < 1e-10 and (lam >= lo - 1e-10).all() and (lam <= up + 1e-10).all()
        assert r.gap <= 1e-7 * float(g.diagonal().max())


def test_limits_of_epsilon():
    g = gram(1, 6)
    lo, up = box_around(np.full(6, 1 / 6), 0.0)
    r = min_norm_capped(g, lo, up)
    assert r.solver_used == "fixed" and torch.allclose(r.weights, torch.full((6,), 1 / 6, dtype=torch.float64))
    lo, up = box_around(np.full(6, 1 / 6), 1.0)
    assert min_norm_capped(g, lo, up).norm_sq == pytest.approx(min_norm(gram=g).norm_sq, rel=1e-8, abs=1e-12)


def test_the_box_binds_and_the_certificate_sees_a_suboptimal_point():
    # one row far from the others: MGDA puts most weight on the short ones; the box stops it
    g = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 9.0]], dtype=torch.float64)
    lo, up = box_around(np.full(3, 1 / 3), 0.1)
    r = min_norm_capped(g, lo, up)
    assert r.weights[2] == pytest.approx(lo[2], abs=1e-9)
    gn = g.numpy()
    assert capped_gap(gn, np.full(3, 1 / 3), lo, up) > 1e-3  # uniform weights are not optimal here


def test_projection_and_linear_minimizer():
    rng = np.random.default_rng(0)
    lo, up = np.array([0.0, 0.1, 0.0, 0.2]), np.array([0.5, 0.4, 0.6, 0.3])
    for _ in range(20):
        v = rng.normal(size=4) * 2
        x = project_capped_simplex(v, lo, up)
        assert abs(x.sum() - 1) < 1e-12 and (x >= lo).all() and (x <= up).all()
        # optimality of the projection: (v − x)·(y − x) ≤ 0 for feasible y (the vertices of the greedy LMO)
        y = linear_minimizer(rng.normal(size=4), lo, up)
        assert (v - x) @ (y - x) <= 1e-9
    s = linear_minimizer(np.array([3.0, 1.0, 2.0, 0.0]), lo, up)
    np.testing.assert_allclose(s, [0.0, 0.4, 0.3, 0.3])  # fill the cheapest coordinates first, from l


def test_infeasible_bounds_are_refused():
    with pytest.raises(ConfigError, match="no point of the simplex"):
        min_norm_capped(gram(0, 3), np.full(3, 0.4), np.full(3, 0.9))


# ------------------------------------------------------------------ exact settings and branches


def test_documented_defaults_and_frozen_result():
    import dataclasses
    import inspect

    from pfl.optim import capped_simplex

    params = inspect.signature(min_norm_capped).parameters
    assert params["tol"].default == 1e-10 and params["max_iter"].default == 100_000
    assert inspect.signature(project_capped_simplex).parameters["iters"].default == 100
    assert capped_simplex.FEASIBILITY_TOL == 1e-12
    r = min_norm_capped(gram(0, 3), np.zeros(3), np.ones(3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.gap = 0.0


def test_box_around_is_clipped_to_the_unit_interval():
    lo, up = box_around(np.array([0.9, 0.1]), 0.5)
    np.testing.assert_allclose(lo, [0.4, 0.0])
    np.testing.assert_allclose(up, [1.0, 0.6])


def test_capped_gap_is_twice_the_linearised_decrease():
    gn = np.eye(2)  # at λ = (1, 0): ∇/2 = Gλ = (1, 0), the LMO picks (0, 1): gap 2 (1 − 0)
    assert capped_gap(gn, np.array([1.0, 0.0]), np.zeros(2), np.ones(2)) == 2.0
    assert capped_gap(gn, np.array([0.5, 0.5]), np.zeros(2), np.ones(2)) == 0.0


def projection_kkt(v, x, lo, up):
    """x = clip(v − τ, l, u) with Σx = 1: one τ for the free coordinates, v − l ≤ τ at l, v − u ≥ τ at u."""
    assert abs(x.sum() - 1) <= 1e-12 and (x >= lo).all() and (x <= up).all()
    free = (x > lo) & (x < up)
    tau = float(np.mean((v - x)[free])) if free.any() else None
    if tau is not None:
        np.testing.assert_allclose((v - x)[free], tau, rtol=0, atol=1e-9)
        assert (v - lo)[x == lo].max(initial=-np.inf) <= tau + 1e-9
        assert (v - up)[x == up].min(initial=np.inf) >= tau - 1e-9


def test_projection_meets_its_optimality_conditions_far_from_the_box():
    rng = np.random.default_rng(1)
    np.testing.assert_allclose(project_capped_simplex(np.zeros(2), np.zeros(2), np.ones(2)), [0.5, 0.5])
    np.testing.assert_allclose(project_capped_simplex(np.array([50.0, -50.0]), np.zeros(2), np.ones(2)), [1.0, 0.0])
    for scale in (0.1, 3.0, 100.0):
        for _ in range(10):
            k = int(rng.integers(2, 7))
            lo = rng.uniform(0, 0.5 / k, size=k)
            up = lo + rng.uniform(1.0 / k, 2.0 / k, size=k)  # Σl < 1 < Σu
            v = rng.normal(size=k) * scale + rng.normal() * scale
            projection_kkt(v, project_capped_simplex(v, lo, up), lo, up)


@pytest.mark.parametrize(
    ("lo", "up", "expected"),
    [
        ([0.0, 0.0, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),  # Σu = 1: C = {u}
        ([0.2, 0.3, 0.5], [1.0, 1.0, 1.0], [0.2, 0.3, 0.5]),  # Σl = 1: C = {l}
        ([0.25 - 0.45e-12] * 4, [0.25 + 0.45e-12] * 4, [0.25] * 4),  # u − l ≤ 1e-12 everywhere
    ],
)
def test_a_box_that_leaves_one_point_is_answered_without_solving(lo, up, expected):
    r = min_norm_capped(gram(2, len(lo)), np.array(lo), np.array(up))
    assert r.solver_used == "fixed" and r.iterations == 0 and r.gap == 0.0
    np.testing.assert_allclose(r.weights.numpy(), expected, rtol=0, atol=1e-15)


def test_feasibility_tolerance_and_shapes():
    g = gram(3, 2)
    assert min_norm_capped(g, np.array([0.5, 0.5 + 0.5e-12]), np.ones(2)).solver_used == "fixed"
    with pytest.raises(ConfigError, match="no point of the simplex"):
        min_norm_capped(g, np.array([0.5, 0.5 + 1.5e-12]), np.ones(2))
    with pytest.raises(ConfigError, match="capped_min_norm.bounds"):
        min_norm_capped(g, np.zeros(2), np.ones(3))
    with pytest.raises(ConfigError, match="capped_min_norm.bounds"):
        min_norm_capped(g, np.zeros(3), np.ones(2))
    with pytest.raises(ConfigError, match="capped_min_norm.gram"):
        min_norm_capped(torch.ones(2, 3), np.zeros(2), np.ones(2))
    with pytest.raises(ConfigError, match="capped_min_norm.gram"):
        min_norm_capped(torch.ones(3), np.zeros(3), np.ones(3))
    one = min_norm_capped(torch.eye(1, dtype=torch.float64) * 4.0, np.zeros(1), np.ones(1))  # K = 1
    assert one.weights.tolist() == [1.0] and one.norm_sq == 4.0


def test_a_unit_scale_gram_is_solved_and_a_zero_gram_takes_the_centre():
    g = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 0.5]], dtype=torch.float64)  # max diag 1
    lo, up = box_around(np.full(3, 1 / 3), 0.2)
    r = min_norm_capped(g, lo, up)
    assert r.solver_used == "cvxopt" and r.weights[2] == pytest.approx(up[2], abs=1e-9)
    z = min_norm_capped(torch.zeros(3, 3), lo, up)
    assert z.solver_used == "fixed" and z.weights.tolist() == pytest.approx([1 / 3] * 3)
    assert z.iterations == 0 and z.gap == 0.0 and z.norm_sq == 0.0


def test_an_uncertified_cvxopt_answer_is_finished_by_projected_gradient(monkeypatch):
    import cvxopt.solvers
    from cvxopt import matrix

    g = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 9.0]], dtype=torch.float64)
    lo, up = box_around(np.full(3, 1 / 3), 0.1)
    exact = min_norm_capped(g, lo, up, solver="pgd")
    uniform = {"status": "optimal", "x": matrix(np.full(3, 1 / 3)), "iterations": 4}  # gap > 1e-3
    monkeypatch.setattr(cvxopt.solvers, "qp", lambda *a, **kw: uniform)
    r = min_norm_capped(g, lo, up)
    assert r.solver_used == "cvxopt+pgd" and r.iterations > 4
    torch.testing.assert_close(r.weights, exact.weights, rtol=0, atol=1e-6)


def test_projected_gradient_steps_are_fista_with_restart():
    from pfl.optim.capped_simplex import _pgd_capped

    g = gram(4, 5).numpy()
    gn = g / g.diagonal().max()
    lo, up = box_around(np.full(5, 0.2), 0.15)
    lip = 2.0 * np.linalg.eigvalsh(gn)[-1]
    x = project_capped_simplex(np.full(5, 0.2), lo, up)
    y, t = x.copy(), 1.0
    for steps in range(1, 13):
        x_new = project_capped_simplex(y - 2.0 * gn @ y / lip, lo, up)
        if (y - x_new) @ (x_new - x) > 0:
            y, t = x_new.copy(), 1.0
        else:
            t_next = (1 + np.sqrt(1 + 4 * t * t)) / 2
            y, t = x_new + (t - 1) / t_next * (x_new - x), t_next
        x = x_new
        got, it = _pgd_capped(gn, lo, up, 0.0, steps, None)
        assert it == steps
        np.testing.assert_allclose(got, x, rtol=0, atol=1e-13)
    r = min_norm_capped(torch.from_numpy(g), lo, up, solver="pgd", tol=1e-6)
    assert r.iterations % 10 == 0  # the certificate is checked every 10 steps
    r = min_norm_capped(torch.from_numpy(g), lo, up, solver="pgd", tol=0.0, max_iter=7)
    assert r.iterations == 7 and g.diagonal().max() > 2.0
    assert r.gap > 1e-6 and r.gap == pytest.approx(capped_gap(g, r.weights.numpy(), lo, up), rel=1e-9)  # G's units


# -- the projection's last rescale, bounds met exactly, cvxopt's failures and the reported iterations ---
def test_projection_rescales_the_free_coordinates_to_sum_one_after_a_short_bisection():
    v = np.array([0.9, 0.4, -0.2, 0.05])
    lower, upper = np.zeros(4), np.full(4, 0.7)
    x = project_capped_simplex(v, lower, upper, iters=5)  # a coarse τ: the rescale does the rest
    assert abs(x.sum() - 1.0) < 1e-15 and bool((x >= lower).all() and (x <= upper).all())
    np.testing.assert_allclose(x, project_capped_simplex(v, lower, upper), atol=0.05)
    inside = np.array([0.5, 0.3, 0.2, 0.1])  # every coordinate free: the residual is shared four ways
    x = project_capped_simplex(inside, np.zeros(4), np.ones(4), iters=5)
    assert abs(x.sum() - 1.0) < 1e-15
    np.testing.assert_allclose(x, inside - 0.025, atol=1e-15)  # τ = (Σv − 1)/4


def test_bounds_that_meet_their_tolerance_exactly_are_accepted():
    tol = capped_simplex.FEASIBILITY_TOL
    gram = torch.eye(2, dtype=torch.float64)
    min_norm_capped(gram, np.array([0.3 + tol, 0.0]), np.array([0.3, 1.0]))  # l_0 = u_0 + tol
    min_norm_capped(gram, np.array([1.0 + tol, 0.0]), np.array([1.0 + tol, 1.0]))  # Σl = 1 + tol
    min_norm_capped(gram, np.zeros(2), np.array([1.0 - tol, 0.0]))  # Σu = 1 − tol


def test_cvxopt_failures_hand_over_to_projected_gradient(monkeypatch):
    from cvxopt import solvers

    gn = np.array([[2.0, 0.5], [0.5, 1.0]])
    lo, up = np.zeros(2), np.ones(2)

    def raises(*args, **kwargs):
        raise ValueError("singular")

    monkeypatch.setattr(solvers, "qp", raises)
    assert capped_simplex._cvxopt_capped(gn, lo, up) == (None, 0)
    monkeypatch.setattr(solvers, "qp", lambda *a, **k: {"status": "unknown", "x": None, "iterations": None})
    assert capped_simplex._cvxopt_capped(gn, lo, up) == (None, 0)
    monkeypatch.setattr(solvers, "qp", lambda *a, **k: {"status": "unknown", "x": [0.5, 0.5], "iterations": 3})
    assert capped_simplex._cvxopt_capped(gn, lo, up) == (None, 3)  # an answer without "optimal" is not used
    res = min_norm_capped(torch.tensor(gn), lo, up)
    assert res.solver_used == "cvxopt+pgd" and res.gap <= 1e-8


def test_an_uncertified_cvxopt_answer_counts_both_solvers_iterations(monkeypatch):
    gn = np.array([[2.0, 0.5], [0.5, 1.0]])
    lo, up = np.zeros(2), np.ones(2)
    rough = np.array([0.9, 0.1])  # feasible but far from the optimum
    monkeypatch.setattr(capped_simplex, "_cvxopt_capped", lambda *a: (rough.copy(), 7))
    res = min_norm_capped(torch.tensor(gn), lo, up)
    _, more = capped_simplex._pgd_capped(gn / 2.0, lo, up, capped_simplex.DEFAULT_TOL, 100_000, rough)
    assert res.solver_used == "cvxopt+pgd" and res.iterations == 7 + more


def test_cvxopt_runs_silently(capfd):
    min_norm_capped(torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64), np.zeros(2), np.ones(2))
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""
