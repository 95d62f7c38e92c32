"""Min-norm (simplex QP) and Gram-form NNLS: Gram products, solver agreement, optimality conditions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pfl.errors import ConfigError
from pfl.optim import minnorm
from pfl.optim.minnorm import gram_from_blocks, gram_matrix, min_norm, nnls_gram, project_simplex

SOLVERS = ("cvxopt", "pgd", "frank_wolfe")


def vectors(k: int, p: int, seed: int, shift: float = 0.5) -> torch.Tensor:
    """Random rows with a shared component, so the min-norm point has a mixed active set."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(p, generator=g, dtype=torch.float64)
    return torch.randn(k, p, generator=g, dtype=torch.float64) + shift * common


# ------------------------------------------------------------------ Gram matrix


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_gram_matrix_equals_vvt_for_tensor_and_row_sequence(chunk):
    v = vectors(6, 100, seed=0)
    expected = v @ v.T
    torch.testing.assert_close(gram_matrix(v, chunk=chunk), expected, rtol=1e-13, atol=1e-12)
    torch.testing.assert_close(gram_matrix(list(v), chunk=chunk), expected, rtol=1e-13, atol=1e-12)


def test_gram_matrix_is_float64_from_float32_rows():
    v = vectors(4, 1000, seed=1).float()
    gram = gram_matrix(v, chunk=33)
    assert gram.dtype == torch.float64
    torch.testing.assert_close(gram, v.double() @ v.double().T, rtol=1e-13, atol=1e-10)


def test_gram_from_a_generator_of_column_blocks():
    v = vectors(5, 90, seed=2)
    blocks = (v[:, a : a + 20] for a in range(0, 90, 20))
    torch.testing.assert_close(gram_from_blocks(blocks), v @ v.T, rtol=1e-13, atol=1e-12)


def test_gram_rejects_empty_and_ragged_input():
    with pytest.raises(ConfigError):
        gram_matrix([])
    with pytest.raises(ConfigError):
        gram_matrix([torch.ones(3), torch.ones(4)])
    with pytest.raises(ConfigError):
        gram_from_blocks(iter([]))


# ------------------------------------------------------------------ closed forms


def test_simplex_projection_matches_closed_cases():
    np.testing.assert_allclose(project_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_simplex(np.array([2.0, 0.0])), [1.0, 0.0])
    np.testing.assert_allclose(project_simplex(np.array([1.0, 1.0])), [0.5, 0.5])
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = project_simplex(rng.normal(size=7) * 3)
        assert x.min() >= 0 and abs(x.sum() - 1) < 1e-12


@pytest.mark.parametrize("solver", SOLVERS)
def test_closed_form_cases(solver):
    # orthogonal unit vectors: λ = (½, ½), ‖·‖² = ½
    r = min_norm(torch.eye(2, dtype=torch.float64), solver=solver)
    torch.testing.assert_close(r.weights, torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert r.norm_sq == pytest.approx(0.5, abs=1e-12)
    # v1 = (1, 0) is the min-norm point of the segment to v2 = (2, 1): v1·(v2 − v1) > 0
    r = min_norm(torch.tensor([[1.0, 0.0], [2.0, 1.0]], dtype=torch.float64), solver=solver)
    torch.testing.assert_close(r.weights, torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-9, rtol=0)
    # opposite vectors: 0 is in the hull
    r = min_norm(torch.tensor([[1.0, 2.0], [-2.0, -4.0]], dtype=torch.float64), solver=solver)
    torch.testing.assert_close(r.weights, torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
    assert r.norm_sq == pytest.approx(0.0, abs=1e-12)
    assert float(r.direction.abs().max()) < 1e-10


def test_one_vector_and_all_zero_vectors_are_trivial():
    r = min_norm(torch.tensor([[3.0, 4.0]]))
    assert r.solver_used == "trivial" and r.weights.tolist() == [1.0] and r.norm_sq == pytest.approx(25.0)
    r = min_norm(torch.zeros(3, 5))
    assert r.solver_used == "trivial" and r.norm_sq == 0.0


# ------------------------------------------------------------------ agreement and optimality


@pytest.mark.parametrize(("k", "p"), [(2, 10), (5, 40), (20, 100), (60, 200)])
@pytest.mark.parametrize("seed", range(3))
def test_solvers_agree_on_objective_and_unique_weights(k, p, seed):
    v = vectors(k, p, seed)  # K < P: G positive definite, the minimiser λ is unique
    results = {s: min_norm(v, solver=s) for s in SOLVERS}
    ref = results["cvxopt"]
    assert ref.solver_used == "cvxopt"
    for name, r in results.items():
        assert r.solver_used == name
        assert abs(r.norm_sq - ref.norm_sq) <= 1e-6 * ref.norm_sq
        assert float((r.weights - ref.weights).abs().max()) <= 1e-6


@pytest.mark.parametrize("seed", range(3))
def test_unpolished_solvers_agree_on_the_objective(seed):
    v = vectors(30, 120, seed)
    values = [min_norm(v, solver=s, polish=False).norm_sq for s in SOLVERS]
    assert max(values) - min(values) <= 1e-6 * min(values)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(("k", "p"), [(8, 50), (40, 10)])  # (40, 10): rank-deficient, λ not unique
def test_kkt_every_vector_has_nonnegative_angle_with_the_min_norm_point(solver, k, p):
    for seed in range(5):
        v = vectors(k, p, seed, shift=1.0 if seed % 2 else 0.0)
        r = min_norm(v, solver=solver)
        lam = r.weights
        assert float(lam.min()) >= 0 and abs(float(lam.sum()) - 1) < 1e-12
        scale = float((v * v).sum(1).max())
        # v_k · u ≥ ‖u‖² for every k (u = Σ λ_k v_k), the optimality condition of the simplex QP
        assert float((v @ r.direction - r.norm_sq).min()) >= -1e-9 * scale
        assert r.gap <= 1e-9 * scale


def test_frank_wolfe_out_of_steps_is_finished_by_projected_gradient(monkeypatch):
    v = vectors(40, 100, seed=3)
    frank_wolfe = minnorm._pairwise_frank_wolfe
    monkeypatch.setattr(minnorm, "_pairwise_frank_wolfe", lambda gn, tol, max_iter: frank_wolfe(gn, tol, 5))
    r = min_norm(v, solver="frank_wolfe", polish=False)
    assert r.solver_used == "frank_wolfe+pgd" and r.iterations > 5
    ref = min_norm(v, solver="cvxopt")
    assert abs(r.norm_sq - ref.norm_sq) <= 1e-6 * ref.norm_sq


def test_gram_only_input_gives_no_direction_and_the_same_weights():
    v = vectors(10, 60, seed=4)
    from_vectors = min_norm(v)
    from_gram = min_norm(gram=v @ v.T)
    assert from_gram.direction is None
    torch.testing.assert_close(from_gram.weights, from_vectors.weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(from_vectors.direction, from_vectors.weights @ v)


def test_weights_are_invariant_to_the_scale_of_the_vectors():
    v = vectors(12, 40, seed=5)
    a, b = min_norm(v), min_norm(v * 1e-4)
    torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=1e-9)
    assert b.norm_sq == pytest.approx(a.norm_sq * 1e-8, rel=1e-9)


def test_float32_vectors_give_a_float32_direction():
    v = vectors(6, 80, seed=6).float()
    r = min_norm(v)
    assert r.direction.dtype == torch.float32 and r.weights.dtype == torch.float64


# ------------------------------------------------------------------ solver choice and fallback


def test_auto_uses_cvxopt_for_small_k_and_frank_wolfe_above_the_threshold(monkeypatch):
    v = vectors(8, 30, seed=7)
    assert min_norm(v).solver_used == "cvxopt"
    monkeypatch.setattr(minnorm, "AUTO_CVXOPT_MAX_K", 5)
    r = min_norm(v)
    assert r.solver_used == "frank_wolfe"
    torch.testing.assert_close(r.weights, min_norm(v, solver="cvxopt").weights, rtol=0, atol=1e-9)


@pytest.mark.parametrize("failure", ["raise", "status"])
def test_cvxopt_failure_falls_back_to_an_iterative_solver(monkeypatch, failure):
    import cvxopt.solvers

    def broken_qp(*args, **kwargs):
        if failure == "raise":
            raise ValueError("Rank(A) < p or Rank([P; A; G]) < n")
        return {"status": "unknown", "x": None, "iterations": 200}

    v = vectors(10, 40, seed=8)
    expected = min_norm(v, solver="cvxopt").weights
    monkeypatch.setattr(cvxopt.solvers, "qp", broken_qp)
    for solver in ("auto", "cvxopt"):
        r = min_norm(v, solver=solver)
        assert r.solver_used == "frank_wolfe"
        torch.testing.assert_close(r.weights, expected, rtol=0, atol=1e-9)
    r = nnls_gram(v @ v.T, v @ torch.ones(40, dtype=torch.float64))
    assert r.solver_used == "pgd"


def test_bad_input_is_refused():
    v = vectors(3, 4, seed=9)
    with pytest.raises(ConfigError, match="min_norm"):
        min_norm()
    with pytest.raises(ConfigError, match="min_norm"):
        min_norm(v, gram=v @ v.T)
    with pytest.raises(ConfigError, match="min_norm.solver"):
        min_norm(v, solver="newton")
    with pytest.raises(ConfigError, match="min_norm.gram"):
        min_norm(gram=torch.ones(2, 3))
    with pytest.raises(ConfigError, match="min_norm.vectors"):
        min_norm(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ConfigError, match="nnls_gram.rhs"):
        nnls_gram(v @ v.T, torch.ones(2))


# ------------------------------------------------------------------ NNLS in Gram form


def nnls_kkt_violation(gram: torch.Tensor, rhs: torch.Tensor, mu: torch.Tensor) -> float:
    grad = gram @ mu - rhs
    return max(float((-grad).clamp_min(0).max()), float((mu * grad).abs().max()), float((-mu).clamp_min(0).max()))


@pytest.mark.parametrize(("k", "p"), [(3, 20), (15, 60), (30, 10)])
@pytest.mark.parametrize("seed", range(3))
def test_nnls_solvers_agree_and_meet_kkt(k, p, seed):
    v = vectors(k, p, seed, shift=0.0)
    x = torch.randn(p, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)
    gram, rhs = v @ v.T, v @ x
    results = {s: nnls_gram(gram, rhs, solver=s) for s in ("cvxopt", "pgd")}
    scale = float(gram.diagonal().max())
    residuals = {s: x - r.coef @ v for s, r in results.items()}  # x − Vᵀμ: unique even when μ is not
    for s, r in results.items():
        assert r.solver_used == s
        assert nnls_kkt_violation(gram, rhs, r.coef) <= 1e-9 * scale
        assert r.residual <= 1e-9 * scale
    torch.testing.assert_close(residuals["cvxopt"], residuals["pgd"], rtol=0, atol=1e-7)
    if k <= p:  # full row rank: μ itself is unique
        torch.testing.assert_close(results["cvxopt"].coef, results["pgd"].coef, rtol=0, atol=1e-6)


def test_nnls_closed_forms():
    gram = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    r = nnls_gram(gram, torch.tensor([4.0, -1.0], dtype=torch.float64))
    torch.testing.assert_close(r.coef, torch.tensor([2.0, 0.0], dtype=torch.float64), rtol=0, atol=1e-10)
    r = nnls_gram(torch.zeros(2, 2), torch.tensor([-1.0, -2.0]))
    assert r.solver_used == "trivial" and r.coef.tolist() == [0.0, 0.0]


# ------------------------------------------------------------------ documented settings and results


def test_documented_defaults_and_constants():
    """docs/fedpg.md's public API: the defaults, the auto threshold, the ridge, the polish thresholds."""
    import inspect

    for fn in (min_norm, nnls_gram):
        params = inspect.signature(fn).parameters
        assert params["tol"].default == 1e-10 and params["max_iter"].default == 100_000
        assert params["polish"].default is True and params["solver"].default == "auto"
    assert inspect.signature(gram_matrix).parameters["chunk"].default == 65536
    assert [b.shape[1] for b in minnorm.column_blocks(torch.zeros(1, 70_000))] == [65536, 4464]
    assert minnorm.AUTO_CVXOPT_MAX_K == 500 and minnorm.CVXOPT_RIDGE == 1e-12
    assert minnorm.POLISH_THRESHOLDS == (1e-9, 1e-6, 1e-3)


def test_results_are_immutable():
    import dataclasses

    r = min_norm(torch.eye(2, dtype=torch.float64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.norm_sq = 0.0
    n = nnls_gram(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.residual = 0.0


def test_gram_of_a_single_row_and_refused_shapes():
    v = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert gram_matrix([v]).tolist() == [[25.0]]
    with pytest.raises(ConfigError, match="min_norm.vectors"):
        min_norm(torch.ones(3))  # 1-D
    with pytest.raises(ConfigError, match="min_norm.vectors"):
        min_norm(torch.zeros(0, 3))  # K = 0


def test_trivial_answers_report_no_iterations_and_no_gap():
    r = min_norm(torch.zeros(4, 5))
    assert r.weights.tolist() == [0.25] * 4 and r.iterations == 0 and r.gap == 0.0
    n = nnls_gram(torch.zeros(2, 2), torch.tensor([-1.0, 0.5]))
    assert n.iterations == 0 and n.residual == 0.5  # r − Gμ = r at μ = 0: its largest positive part
    n = nnls_gram(torch.zeros(2, 2), torch.tensor([-1.0, -0.5]))
    assert n.residual == 0.0


@pytest.mark.parametrize("polish", [True, False])
def test_auto_threshold_is_k_500_for_both_problems(monkeypatch, polish):
    ran = []

    def stub(name, value):
        return lambda gn, *a, **kw: (ran.append(name), value(gn.shape[0]))[1]

    monkeypatch.setattr(minnorm, "_cvxopt_simplex", stub("cvxopt", lambda k: (np.full(k, 1.0 / k), 3)))
    monkeypatch.setattr(minnorm, "_pairwise_frank_wolfe", stub("fw", lambda k: (np.full(k, 1.0 / k), 3)))
    monkeypatch.setattr(minnorm, "_cvxopt_orthant", stub("cvxopt", lambda k: (np.zeros(k), 3)))
    monkeypatch.setattr(minnorm, "_pgd", stub("pgd", lambda k: (np.zeros(k), 3)))
    for k, simplex, nnls in ((500, "cvxopt", "cvxopt"), (501, "frank_wolfe", "pgd")):
        eye = torch.eye(k, dtype=torch.float64)
        assert min_norm(gram=eye, polish=polish).solver_used == simplex
        assert nnls_gram(eye, -torch.ones(k, dtype=torch.float64), polish=polish).solver_used == nnls
    assert ran == ["cvxopt", "cvxopt", "fw", "pgd"]


def test_cvxopt_gets_the_ridged_normalised_problem_quietly(monkeypatch, capsys):
    import cvxopt.solvers

    calls = []
    qp = cvxopt.solvers.qp

    def spy(*args, **kwargs):
        calls.append(([np.array(a) for a in args], kwargs["options"]))
        return qp(*args, **kwargs)

    monkeypatch.setattr(cvxopt.solvers, "qp", spy)
    v = vectors(4, 10, seed=11)
    gram = v @ v.T
    gn = gram.numpy() / float(gram.diagonal().max())
    min_norm(gram=gram, solver="cvxopt")
    nnls_gram(gram, v @ torch.ones(10, dtype=torch.float64), solver="cvxopt")
    assert capsys.readouterr().out == ""
    options = {"show_progress": False, "abstol": 1e-11, "reltol": 1e-11, "feastol": 1e-11, "maxiters": 200}
    (simplex, opt_s), (orthant, opt_o) = calls
    assert opt_s == opt_o == options
    np.testing.assert_array_equal(simplex[0], gn + 1e-12 * np.eye(4))
    np.testing.assert_array_equal(simplex[5], [[1.0]])  # Σλ = 1
    np.testing.assert_array_equal(orthant[0], gn + 1e-12 * np.eye(4))


def fake_qp(x, status="optimal"):
    from cvxopt import matrix

    return lambda *a, **kw: {
        "status": status,
        "x": None if x is None else matrix(np.asarray(x, float)),
        "iterations": 7,
    }


@pytest.mark.parametrize(
    ("x", "status"),
    [([0.2, 0.8], "unknown"), ([0.0, 0.0], "optimal"), ([-1.0, -2.0], "optimal"), ([np.nan, 1.0], "optimal")],
)
def test_cvxopt_answers_that_are_not_optimal_or_not_a_weighting_fall_back(monkeypatch, x, status):
    import cvxopt.solvers

    monkeypatch.setattr(cvxopt.solvers, "qp", fake_qp(x, status))
    r = min_norm(torch.eye(2, dtype=torch.float64), solver="cvxopt", polish=False)
    assert r.solver_used == "frank_wolfe" and r.weights.tolist() == [0.5, 0.5]
    if status != "optimal":
        n = nnls_gram(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), polish=False)
        assert n.solver_used == "pgd"


def test_cvxopt_weights_are_normalised_to_sum_one(monkeypatch):
    import cvxopt.solvers

    monkeypatch.setattr(cvxopt.solvers, "qp", fake_qp([1.0, 3.0]))
    r = min_norm(torch.eye(2, dtype=torch.float64), solver="cvxopt", polish=False)
    assert r.solver_used == "cvxopt" and r.iterations == 7 and r.weights.tolist() == [0.25, 0.75]
    n = nnls_gram(torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), polish=False)
    assert n.solver_used == "cvxopt" and n.coef.tolist() == [1.0, 3.0]  # the orthant: taken as it is


def test_an_unconverged_certificate_is_reported_in_the_units_of_g():
    v = 3.0 * vectors(6, 20, seed=12)
    gram = v @ v.T
    r = min_norm(gram=gram, solver="pgd", tol=0.0, max_iter=3, polish=False)
    lam = r.weights
    glam = gram @ lam
    assert r.iterations == 3 and r.gap > 1e-3
    assert r.gap == pytest.approx(2.0 * float(lam @ glam - glam.min()), rel=1e-9)
    rhs = v @ torch.ones(20, dtype=torch.float64)
    n = nnls_gram(gram, rhs, solver="pgd", tol=0.0, max_iter=3, polish=False)
    grad = gram @ n.coef - rhs
    expected = max(float((-grad).clamp_min(0).max()), float((n.coef * grad).abs().max()))
    assert n.iterations == 3 and n.residual > 1e-3 and n.residual == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_polish_makes_a_loose_iterate_exact(seed):
    v = vectors(8, 30, seed, shift=1.0)
    exact = min_norm(v, solver="cvxopt")
    loose = min_norm(v, solver="pgd", tol=1e-4, polish=False)
    polished = min_norm(v, solver="pgd", tol=1e-4)  # polish is the default
    assert float((loose.weights - exact.weights).abs().max()) > 1e-8
    torch.testing.assert_close(polished.weights, exact.weights, rtol=0, atol=1e-12)
    assert polished.gap <= 1e-12 * float((v * v).sum(1).max())
    x = torch.randn(30, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    gram, rhs = v @ v.T, v @ x
    exact = nnls_gram(gram, rhs, solver="cvxopt")
    loose = nnls_gram(gram, rhs, solver="pgd", tol=1e-4, polish=False)
    polished = nnls_gram(gram, rhs, solver="pgd", tol=1e-4)
    assert float((loose.coef - exact.coef).abs().max()) > 1e-8
    torch.testing.assert_close(polished.coef, exact.coef, rtol=0, atol=1e-10)


def reference_fista(gn, linear, steps, simplex):
    """FISTA with gradient restart written out (docs/fedpg.md): step 1/L, L = c·λ_max(G), c = 2 on the
    simplex (objective λᵀGλ) and 1 on the orthant (½μᵀGμ − rᵀμ), start at the centre or at 0."""
    c = 2.0 if simplex else 1.0
    lip = c * np.linalg.eigvalsh(gn)[-1]
    k = gn.shape[0]
    x = np.full(k, 1.0 / k) if simplex else np.zeros(k)
    y, t = x.copy(), 1.0
    for _ in range(steps):
        z = y - (c * gn @ y - linear) / lip
        x_new = project_simplex(z) if simplex else np.maximum(z, 0.0)
        if np.dot(y - x_new, x_new - x) > 0:
            y, t = x_new.copy(), 1.0
        else:
            t_next = (1 + np.sqrt(1 + 4 * t * t)) / 2
            y, t = x_new + (t - 1) / t_next * (x_new - x), t_next
        x = x_new
    return x


@pytest.mark.parametrize("simplex", [True, False])
def test_projected_gradient_steps_are_fista_with_restart(simplex):
    v = vectors(6, 20, seed=13, shift=1.0)
    g = (v @ v.T).numpy()
    gn = g / g.diagonal().max()
    linear = np.zeros(6) if simplex else gn @ np.linspace(-1.0, 1.0, 6)
    for steps in (1, 2, 5, 30):
        x, it = minnorm._pgd(gn, linear, 0.0, steps, simplex=simplex)
        assert it == steps
        np.testing.assert_allclose(x, reference_fista(gn, linear, steps, simplex), rtol=0, atol=1e-13)
    x, it = minnorm._pgd(gn, linear, 1e-6, 10_000, simplex=simplex)  # the first step that certifies
    cert = (lambda z: minnorm._simplex_gap(gn, z)) if simplex else (lambda z: minnorm._nnls_residual(gn, linear, z))
    assert cert(x) <= 1e-6 < cert(reference_fista(gn, linear, it - 1, simplex))


def reference_pairwise_fw(gn, steps):
    """Pairwise Frank–Wolfe with exact line search from the vertex of least norm, Gλ updated by the
    step's two columns (fewer than 200 steps: no refresh); returns λ and the number of drop steps."""
    k = gn.shape[0]
    start = int(np.argmin(np.diag(gn)))
    lam, glam = np.zeros(k), gn[:, start].copy()
    lam[start] = 1.0
    drops = 0
    for _ in range(steps):
        s = int(np.argmin(glam))
        support = np.nonzero(lam > 0)[0]
        a = int(support[np.argmax(glam[support])])
        curve = gn[s, s] + gn[a, a] - 2 * gn[s, a]
        step = min(lam[a], (glam[a] - glam[s]) / curve)
        drops += step == lam[a]
        lam[s] += step
        lam[a] = max(lam[a] - step, 0.0)
        glam += step * (gn[:, s] - gn[:, a])
    return lam, drops


def test_pairwise_frank_wolfe_steps_and_stop():
    v = vectors(8, 30, seed=2, shift=0.0)
    g = (v @ v.T).numpy()
    gn = g / g.diagonal().max()
    gap = minnorm._simplex_gap
    for tol in (1e-3, 1e-4, 1e-5, 1e-6):
        lam, it = minnorm._pairwise_frank_wolfe(gn, tol, 10_000)
        assert gap(gn, lam) <= tol
        ref, drops = reference_pairwise_fw(gn, it - 1)  # the last step only certifies
        np.testing.assert_allclose(lam, ref, rtol=0, atol=1e-12)
        assert gap(gn, reference_pairwise_fw(gn, it - 2)[0]) > tol  # it stopped at the first certified iterate
    assert drops > 0  # the run moves all weight off some vertex
    # The certificate is the Frank–Wolfe gap itself (2(λᵀGλ − min Gλ)), no multiple of it: with tol a
    # little above the gap of one iterate, the run stops at the first iterate whose gap is within tol.
    gaps = [gap(gn, reference_pairwise_fw(gn, n)[0]) for n in range(25)]
    for n in range(1, 25):
        tol = 1.2 * gaps[n]
        _, it = minnorm._pairwise_frank_wolfe(gn, tol, 10_000)
        assert it - 1 == next(m for m, g in enumerate(gaps) if g <= tol)
    for steps in (1, 3, 10):  # out of steps: the iterate after max_iter steps
        lam, it = minnorm._pairwise_frank_wolfe(gn, 0.0, steps)
        assert it == steps
        np.testing.assert_allclose(lam, reference_pairwise_fw(gn, steps)[0], rtol=0, atol=1e-12)


def test_tol_zero_stops_at_an_exact_answer():
    eye = torch.eye(2, dtype=torch.float64)  # λ = (½, ½) is reached exactly: gap 0.0 ≤ tol = 0
    r = min_norm(eye, solver="pgd", tol=0.0, max_iter=50, polish=False)
    assert r.iterations == 1 and r.gap == 0.0
    r = min_norm(eye, solver="frank_wolfe", tol=0.0, max_iter=50, polish=False)
    assert r.solver_used == "frank_wolfe" and r.iterations == 2 and r.weights.tolist() == [0.5, 0.5]
    n = nnls_gram(eye, torch.tensor([1.0, -1.0], dtype=torch.float64), solver="pgd", tol=0.0, max_iter=50)
    assert n.iterations == 1 and n.coef.tolist() == [1.0, 0.0]


def test_polish_supports_are_the_entries_above_fractions_of_the_largest():
    """docs/fedpg.md: candidate supports are the entries above 1e-9, 1e-6 and 1e-3 of the largest."""

    def supports(x):
        return [s.tolist() for s in minnorm._supports(np.array(x))]

    assert supports([0.5, 0.5, 7e-4]) == [[0, 1, 2]]  # 7e-4 > 1e-3 · 0.5
    assert supports([1.0, 1e-3, 1e-7]) == [[0], [0, 1], [0, 1, 2]]  # strictly above: 1e-3 is out at 1e-3
    assert supports([4.0, 3e-3, 1e-6]) == [[0], [0, 1], [0, 1, 2]]
    assert supports([0.0, 0.0]) == [[]]


def test_polish_keeps_the_input_when_the_exact_solution_on_its_support_is_negative():
    """docs/fedpg.md: a support's KKT solution is kept only if it is ≥ 0 (it is not clipped into one)."""
    v = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # optimum (½, ½, 0); on all three: (1, 1, −1)
    lam = np.array([0.45, 0.45, 0.1])
    np.testing.assert_array_equal(minnorm._polish_simplex(v @ v.T, lam), lam)
    mu = np.array([0.9, 0.1])  # optimum (1, 0) of ½‖μ‖² − (1, −1)·μ; on both: (1, −1)
    np.testing.assert_array_equal(minnorm._polish_orthant(np.eye(2), np.array([1.0, -1.0]), mu), mu)


@pytest.mark.parametrize(
    ("r", "kept"),
    [
        ((1.0, 0.0), True),  # exact zero: ≥ 0
        ((1.0, -1e-12), True),  # −1e-12 · max: at the tolerance, still taken (and clipped to 0)
        ((1.0, -1.5e-12), False),  # beyond it: negative, the input is kept
        ((1e6, -1e-9), True),  # the tolerance is relative to the largest entry: −1e-9 > −1e-12 · 1e6
    ],
)
def test_polish_tolerates_negatives_down_to_1e_12_of_the_largest_entry(r, kept):
    rn = np.array(r)  # G = I: the solution on the full support is r itself
    mu = np.array([0.9, 0.1]) * r[0]
    expected = np.maximum(rn, 0.0) if kept else mu
    np.testing.assert_array_equal(minnorm._polish_orthant(np.eye(2), rn, mu), expected)


def test_polish_tries_the_larger_supports_after_a_rejected_one():
    v = np.array([[0.0, -0.5, -1.0], [3.0, 0.0, -2.0], [-0.5, 0.5, -0.5]])
    g = v @ v.T  # on {0, 1} the KKT solution is (1.07, −0.07): rejected; on {0, 1, 2} the optimum, > 0
    lam = np.array([0.6, 0.4 - 1e-4, 1e-4])  # supports [[0, 1], [0, 1, 2]]
    polished = minnorm._polish_simplex(g, lam)
    assert polished.min() > 0.02 and minnorm._simplex_gap(g, polished) < 1e-12
    gram = np.array([[1.0, -0.5], [-0.5, 1.0]])  # orthant: on {0}: −0.1, rejected; on {0, 1}: (0.53, 1.27)
    rhs = np.array([-0.1, 1.0])
    polished = minnorm._polish_orthant(gram, rhs, np.array([1.0, 1e-4]))
    np.testing.assert_allclose(polished, np.linalg.solve(gram, rhs), rtol=1e-12)


# -- polishing: exact zeros are feasible, and a polished answer wins a tie ------------------------------
def test_polish_accepts_a_kkt_solution_with_an_exact_zero_weight():
    # min λᵀGλ over the simplex is at the vertex (1, 0); the full support's KKT system gives it exactly
    gn = np.array([[1.0, 1.0], [1.0, 2.0]])
    np.testing.assert_allclose(minnorm._polish_simplex(gn, np.array([0.5, 0.5])), [1.0, 0.0], atol=1e-15)


def test_polish_prefers_the_polished_answer_when_the_gaps_tie():
    gn = np.ones((2, 2))  # identical rows: every point of the simplex is optimal (gap 0)
    np.testing.assert_allclose(minnorm._polish_simplex(gn, np.array([0.3, 0.7])), [0.5, 0.5], atol=1e-15)
    # NNLS with G = 11ᵀ and r = 3·1: every μ ≥ 0 with μ_0 + μ_1 = 3 has residual 0; the polished one is kept
    gn, rn = np.ones((2, 2)), np.full(2, 3.0)
    np.testing.assert_allclose(minnorm._polish_orthant(gn, rn, np.array([0.75, 2.25])), [1.5, 1.5], atol=1e-15)
