"""FedORA math: Lemma 4.1/4.2 identities, principal angles, official-code variants, selective λ, new clients."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from pfl.errors import ConfigError
from pfl.optim.propagation import (
    OFFICIAL_KAPPA,
    kappa_of,
    new_client_row,
    official_similarity,
    principal_angle_similarity,
    propagate,
    propagate_iterative,
    propagation_matrix,
    selective_lambda,
    similarity,
    subspace_basis,
    transition_matrix,
)

F64 = torch.float64


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_bases(k: int, d: int, p: int, seed: int = 0) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(k, d, p, generator=gen(seed), dtype=F64))
    return q


def random_w(k: int, seed: int = 0) -> torch.Tensor:
    """A symmetric principal-angle similarity of random 2-D subspaces of R^6 (diagonal 2)."""
    return principal_angle_similarity(random_bases(k, 6, 2, seed))


# --- subspace_basis ---------------------------------------------------------------------------


def test_basis_is_orthonormal_top_right_singular_space_of_x_concat_onehot():
    g = gen(1)
    x = torch.rand(30, 2, 3, generator=g)
    y = torch.randint(0, 4, (30,), generator=g)
    u = subspace_basis(x, y, num_classes=4, p=3)
    assert u.shape == (6 + 4, 3)
    assert torch.allclose(u.T @ u, torch.eye(3, dtype=F64), atol=1e-10)
    a = torch.cat([x.reshape(30, -1).to(F64), torch.nn.functional.one_hot(y, 4).to(F64)], 1)
    # the top-3 eigenvectors of AᵀA span the same space: projector equality
    evecs = torch.linalg.eigh(a.T @ a).eigenvectors[:, -3:]
    assert torch.allclose(u @ u.T, evecs @ evecs.T, atol=1e-8)


def test_basis_spans_rank_p_data_and_feature_only_without_labels():
    g = gen(2)
    span = torch.linalg.qr(torch.randn(8, 2, generator=g, dtype=F64)).Q  # data lies in a 2-D subspace of R^8
    x = (torch.randn(20, 2, generator=g, dtype=F64) @ span.T).float()
    u = subspace_basis(x, None, num_classes=3, p=2)
    assert u.shape == (8, 2)
    a = x.to(F64)
    assert torch.allclose(a @ u @ u.T, a, atol=1e-5)  # every sample lies in span(U)
    with pytest.raises(ConfigError, match="rank < p"):
        subspace_basis(x, None, num_classes=3, p=3)


def test_basis_uncentered_by_default_center_option_removes_the_mean():
    g = gen(3)
    x = torch.randn(50, 5, generator=g) * torch.tensor([0.1, 0.1, 0.1, 0.1, 1.0]) + torch.tensor([3.0, 0, 0, 0, 0])
    top = subspace_basis(x, None, 0, p=1)[:, 0]
    pca = subspace_basis(x, None, 0, p=1, center=True)[:, 0]
    assert top[0].abs() > 0.99  # the mean direction (e_0) dominates the uncentred second moment
    assert pca[4].abs() > 0.99  # the largest-variance direction (e_4) after centring


def test_basis_label_block_separates_label_skew_and_sign_is_canonical():
    g = gen(4)
    x = torch.rand(40, 6, generator=g)
    y_a, y_b = torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long)
    kw = {"num_classes": 2, "p": 1, "label_scale": 3.0}
    ua, ua2, ub = subspace_basis(x, y_a, **kw), subspace_basis(x, y_a, **kw), subspace_basis(x, y_b, **kw)
    w = principal_angle_similarity(torch.stack([ua, ub]))
    assert w[0, 1] < 0.8  # same features, disjoint labels: far apart
    assert torch.equal(ua, ua2) and ua[ua.abs().argmax()] > 0
    with pytest.raises(ConfigError, match="labels must lie"):
        subspace_basis(x, y_b, num_classes=1)


# --- principal angles ---------------------------------------------------------------------------


def test_principal_angle_self_is_p_orthogonal_is_zero():
    e = torch.eye(6, dtype=F64)
    u = torch.stack([e[:, :2], e[:, 2:4], e[:, [0, 1]] @ torch.tensor([[0.6, -0.8], [0.8, 0.6]], dtype=F64)])
    w = principal_angle_similarity(u)
    assert torch.allclose(w.diagonal(), torch.full((3,), 2.0, dtype=F64), atol=1e-12)
    assert w[0, 1] == pytest.approx(0.0, abs=1e-12)  # orthogonal subspaces
    assert w[0, 2] == pytest.approx(2.0, abs=1e-12)  # same span, rotated basis: basis-independent
    assert torch.equal(w, w.T)


def test_principal_angle_sum_of_cosines_of_known_angles():
    e = torch.eye(4, dtype=F64)
    a, b = 0.3, 1.1
    u = e[:, :2]
    v = torch.stack([math.cos(a) * e[:, 0] + math.sin(a) * e[:, 2], math.cos(b) * e[:, 1] + math.sin(b) * e[:, 3]], 1)
    w = principal_angle_similarity(torch.stack([u, v]))
    assert w[0, 1] == pytest.approx(math.cos(a) + math.cos(b), abs=1e-12)
    w1 = principal_angle_similarity(torch.stack([u[:, :1], v[:, :1]]))  # p = 1 fast path
    assert w1[0, 1] == pytest.approx(math.cos(a), abs=1e-12)


def test_principal_angle_cross_matches_full_and_rejects_non_orthonormal():
    u = random_bases(5, 7, 2, seed=5)
    full = principal_angle_similarity(u)
    cross = principal_angle_similarity(u[3:], u[:3], row_chunk=1)
    assert torch.allclose(cross, full[3:, :3], atol=1e-12)
    with pytest.raises(ConfigError, match="orthonormal"):
        principal_angle_similarity(2 * u)


# --- official similarity ----------------------------------------------------------------------


def test_official_similarity_top2_others_softmax_of_10w_row_stochastic():
    w = random_w(6, seed=6)
    s = official_similarity(w)
    assert torch.all(s.diagonal() == 0)  # never its own neighbour
    assert torch.all((s > 0).sum(1) == 2)
    assert torch.allclose(s.sum(1), torch.ones(6, dtype=F64), atol=1e-12)
    for k in range(6):
        others = w[k].clone()
        others[k] = -1
        top = others.topk(2).indices
        assert set(torch.nonzero(s[k]).flatten().tolist()) == set(top.tolist())
        e = torch.exp(10 * w[k, top])
        assert torch.allclose(s[k, top], e / e.sum(), atol=1e-12)
    assert torch.allclose(official_similarity(random_bases(6, 6, 2, seed=6)), s)  # bases in, same graph


def test_official_similarity_two_clients_and_cross_rows():
    s = official_similarity(torch.tensor([[1.0, 0.3], [0.3, 1.0]]))
    assert torch.equal(s, torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64))
    c = official_similarity(torch.tensor([[0.9, 0.1, 0.5]]), cross=True)
    assert c[0, 1] == 0 and c[0, 0] > c[0, 2] > 0 and c.sum() == pytest.approx(1.0)


# --- ablation similarities --------------------------------------------------------------------


def test_random_similarity_seeded_symmetric_nonnegative():
    a = similarity("random", num_clients=5, generator=gen(7))
    b = similarity("random", num_clients=5, generator=gen(7))
    c = similarity("random", num_clients=5, generator=gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a, a.T) and bool((a >= 0).all()) and torch.all(a.diagonal() == 1)
    with pytest.raises(ConfigError, match="Generator"):
        similarity("random", num_clients=5)


def test_parameter_and_gradient_similarity_are_clipped_cosines():
    v = torch.tensor([[1.0, 0.0, 0.0], [2.0, 2.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    for kind, key in (("parameter", "params"), ("gradient", "grads")):
        w = similarity(kind, **{key: v})
        assert w[0, 1] == pytest.approx(1 / math.sqrt(2))  # scale-invariant cosine
        assert w[0, 2] == 0  # opposite directions clipped at 0
        assert w[3, 0] == 0 and w[3, 3] == 1  # a zero vector is similar only to itself
        assert torch.equal(w, w.T)


def test_parameter_similarity_blockwise_gram_matches_direct():
    v = torch.randn(4, 70_000, generator=gen(9))  # > one 65 536-column block
    direct = torch.nn.functional.cosine_similarity(v.double()[:, None], v.double()[None, :], dim=-1).clamp(min=0)
    assert torch.allclose(similarity("parameter", params=v), direct, atol=1e-12)


def test_similarity_identity_uniform_subspace_and_bad_kind():
    assert torch.equal(similarity("identity", num_clients=3), torch.eye(3, dtype=F64))
    u = similarity("uniform", sizes=torch.tensor([1.0, 3.0]))
    assert torch.equal(u, torch.tensor([[1.0, 3.0], [1.0, 3.0]], dtype=F64))
    b = random_bases(3, 5, 1)
    assert torch.equal(similarity("subspace", bases=b), principal_angle_similarity(b))
    with pytest.raises(ConfigError, match="unknown kind"):
        similarity("cosine", params=torch.ones(2, 2))


# --- propagation (Lemmas 4.1, 4.2) ------------------------------------------------------------


def test_closed_form_equals_iteration_limit():
    w = random_w(7, seed=10)
    theta = torch.randn(7, 9, generator=gen(10), dtype=F64)
    for alpha in (0.1, 1.0, 9.0):
        closed = propagate(propagation_matrix(w, alpha), theta)
        iterated = propagate_iterative(w, theta, alpha, tol=1e-9)
        assert torch.allclose(closed, iterated, atol=1e-5)
    # fixed number of steps: error <= κ^m · max|Θ − Θ̂*|
    m, k = 5, kappa_of(1.0)
    closed = propagate(propagation_matrix(w), theta)
    err = (propagate_iterative(w, theta, iters=m) - closed).abs().max()
    assert err <= k**m * (theta - closed).abs().max() + 1e-12
    assert err > 1e-6  # and 5 steps are not yet the limit
    assert torch.equal(propagate_iterative(w, theta, iters=0), theta)


def test_rows_of_m_sum_to_one_and_are_nonnegative():
    w = random_w(8, seed=11)
    w[0, 5] = w[5, 0] = 0.0  # some zero edges
    m = propagation_matrix(w, 2.0)
    assert torch.allclose(m.sum(1), torch.ones(8, dtype=F64), atol=1e-12)
    assert bool((m >= -1e-15).all())
    theta = torch.full((8, 3), 4.0, dtype=F64)
    assert torch.allclose(propagate(m, theta), theta)  # an average of equal models is that model


def test_identity_w_gives_local():
    theta = torch.randn(5, 4, generator=gen(12), dtype=F64)
    for alpha in (1.0, 1e6):
        m = propagation_matrix(similarity("identity", num_clients=5), alpha)
        assert torch.allclose(propagate(m, theta), theta, atol=1e-9)
    assert torch.allclose(propagation_matrix(random_w(5), 0.0), torch.eye(5, dtype=F64))  # α = 0 too


def test_uniform_w_alpha_to_infinity_gives_sample_weighted_average():
    n = torch.tensor([10.0, 30.0, 60.0, 100.0], dtype=F64)
    theta = torch.randn(4, 6, generator=gen(13), dtype=F64)
    shared = (n / n.sum()) @ theta
    w = similarity("uniform", sizes=n)  # w_kk' = n_k' (Lemma 4.1 case 2)
    for alpha in (1.0, 10.0):  # exact for any α: M = (1−κ)I + κ·1πᵀ, π = n/N (Sherman-Morrison)
        k = kappa_of(alpha)
        expected = (1 - k) * torch.eye(4, dtype=F64) + k * (n / n.sum()).expand(4, 4)
        assert torch.allclose(propagation_matrix(w, alpha), expected, atol=1e-12)
    hat = propagate(propagation_matrix(w, 1e7), theta)
    assert torch.allclose(hat, shared.expand(4, 6), atol=1e-5)  # every row the n-weighted average
    plain = propagate(propagation_matrix(similarity("uniform", num_clients=4), 1e7), theta)
    assert torch.allclose(plain, theta.mean(0).expand(4, 6), atol=1e-5)


def test_alpha_to_infinity_on_symmetric_w_gives_degree_weighted_average():
    w = random_w(6, seed=14)
    theta = torch.randn(6, 3, generator=gen(14), dtype=F64)
    pi = w.sum(1) / w.sum()  # stationary distribution of D⁻¹W for symmetric W
    hat = propagate(propagation_matrix(w, 1e7), theta)
    assert torch.allclose(hat, (pi @ theta).expand(6, 3), atol=1e-5)


def test_closed_form_minimises_eq3_when_transition_is_symmetric():
    a = random_w(5, seed=15)
    w = a + torch.diag(a.sum(1).max() + 1.0 - a.sum(1))  # symmetric, equal row sums: D⁻¹W symmetric
    assert torch.allclose(transition_matrix(w), transition_matrix(w).T)
    theta = torch.randn(5, 4, generator=gen(15), dtype=F64)
    alpha = 1.7
    hat = propagate(propagation_matrix(w, alpha), theta).requires_grad_(True)
    p = transition_matrix(w)
    diff = hat[:, None, :] - hat[None, :, :]
    objective = ((theta - hat) ** 2).sum() + alpha / 2 * (p[:, :, None] * diff**2).sum()
    (grad,) = torch.autograd.grad(objective, hat)
    assert grad.abs().max() < 1e-10


def test_official_kappa_is_alpha_four_and_option_checks():
    w = random_w(4, seed=16)
    assert torch.allclose(propagation_matrix(w, kappa=OFFICIAL_KAPPA), propagation_matrix(w, 4.0), atol=1e-12)
    assert kappa_of() == 0.5  # paper default α = 1
    with pytest.raises(ConfigError, match="not both"):
        propagation_matrix(w, 1.0, kappa=0.5)
    with pytest.raises(ConfigError, match="row sum 0"):
        propagation_matrix(torch.zeros(2, 2))
    with pytest.raises(ConfigError, match=">= 0"):
        propagation_matrix(-w)
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        propagation_matrix(w, kappa=1.0)


def test_official_pipeline_matches_the_codes_inverse():
    w = random_w(6, seed=17)
    adj = official_similarity(w)
    m = propagation_matrix(adj, kappa=OFFICIAL_KAPPA)
    reference = 0.2 * torch.linalg.inv(torch.eye(6, dtype=F64) - 0.8 * adj)  # (1−pa)·inv(I − pa·A), A row-normalised
    assert torch.allclose(m, reference, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 7, 100, None])
def test_chunked_propagation_equals_one_matmul_also_in_place(chunk):
    m = propagation_matrix(random_w(5, seed=18))
    theta = torch.randn(5, 23, generator=gen(18))
    expected = (m @ theta.double()).float()
    assert torch.allclose(propagate(m, theta, chunk=chunk), expected, atol=1e-6)
    store = theta.clone()
    assert propagate(m, store, out=store, chunk=chunk) is store
    assert torch.allclose(store, expected, atol=1e-6)
    with pytest.raises(ConfigError, match="match theta"):
        propagate(m, theta, out=torch.empty(5, 23, dtype=F64))


# --- new clients ------------------------------------------------------------------------------


def test_new_client_row_reproduces_a_trained_clients_propagated_row():
    w = random_w(6, seed=19)
    theta = torch.randn(6, 5, generator=gen(19), dtype=F64)
    for alpha in (0.5, 1.0, 4.0):
        hat = propagate(propagation_matrix(w, alpha), theta)
        k, others = 2, [0, 1, 3, 4, 5]
        row = new_client_row(w[k, others], alpha, self_similarity=float(w[k, k]))
        assert row.shape == (6,) and row.sum() == pytest.approx(1.0)
        rebuilt = row[:-1] @ hat[others] + row[-1] * theta[k]
        assert torch.allclose(rebuilt, hat[k], atol=1e-10)


def test_new_client_row_without_own_parameters_is_normalised_similarity():
    s = torch.tensor([[0.2, 0.6, 0.2], [1.0, 0.0, 3.0]])
    row = new_client_row(s)
    assert torch.allclose(row, s.double() / s.double().sum(1, keepdim=True))
    # the α → ∞ limit of the own-parameter row, and α = 0 keeps only the own parameters
    far = new_client_row(s, 1e9, self_similarity=1.0)
    assert torch.allclose(far[:, :-1], row, atol=1e-8) and far[:, -1].abs().max() < 1e-8
    assert torch.allclose(new_client_row(s, 0.0, self_similarity=1.0)[:, -1], torch.ones(2, dtype=F64))
    with pytest.raises(ConfigError, match="self_similarity"):
        new_client_row(s, 1.0)
    with pytest.raises(ConfigError, match="zero similarity"):
        new_client_row(torch.zeros(3))


# --- selective λ (Eq. 8) ----------------------------------------------------------------------


def test_selective_lambda_paper_rule():
    assert selective_lambda(0.5, 0.7) == 1e-8  # propagated model validates worse: ε
    assert selective_lambda(0.7, 0.5) == pytest.approx(0.2)  # better: the gain
    assert selective_lambda(0.5, 0.5, eps=1e-3) == 1e-3


def test_selective_lambda_official_rule():
    assert selective_lambda(0.5, 0.7, rule="official") == 0.0
    assert selective_lambda(0.5, 0.5, rule="official") == 1.0
    assert selective_lambda(0.9, 0.5, rule="official") == pytest.approx(math.exp(0.2))
    with pytest.raises(ConfigError, match="unknown rule"):
        selective_lambda(0.5, 0.5, rule="ditto")
    with pytest.raises(ValueError, match="finite"):
        selective_lambda(float("nan"), 0.5)


# --- edges of every check, and the rounding guards (mutation run) -------------------------------


def test_basis_defaults_to_the_papers_one_direction_and_takes_a_single_sample():
    x, y = torch.randn(5, 3, generator=gen(20)), torch.tensor([0, 1, 1, 0, 1])
    assert subspace_basis(x, y, 2).shape == (5, 1)
    one = subspace_basis(x[:1], y[:1], 2)  # one sample: its own direction
    row = torch.cat([x[0].double(), torch.tensor([1.0, 0.0], dtype=F64)])
    row = row / row.norm()
    torch.testing.assert_close(one[:, 0], row * row[row.abs().argmax()].sign())  # largest entry made positive
    small = subspace_basis(1e-3 * x, None, 2, p=3)  # tiny features are still full rank; p = min(n, D) allowed
    assert small.shape == (3, 3)


@pytest.mark.parametrize("x", [torch.zeros(0, 3), torch.zeros(5)])
def test_basis_needs_samples_as_rows(x):
    with pytest.raises(ConfigError, match="fedora.subspace.x"):
        subspace_basis(x, None, 2)


def test_basis_refuses_p_beyond_the_numerical_rank():
    u = torch.randn(6, 1, generator=gen(21), dtype=F64)
    x = u @ torch.randn(1, 4, generator=gen(22), dtype=F64)  # rank 1, up to rounding
    x = x + 1e-18 * torch.randn(6, 4, generator=gen(23), dtype=F64)
    with pytest.raises(ConfigError, match="rank < p = 2"):
        subspace_basis(x, None, 2, p=2)
    assert subspace_basis(x, None, 2, p=1).shape == (4, 1)


def test_bases_must_be_orthonormal_to_1e_4():
    u = random_bases(3, 6, 2, seed=24)
    with pytest.raises(ConfigError, match="orthonormal"):
        principal_angle_similarity(1.2 * u)
    principal_angle_similarity(u * (1 + 2e-5))  # round-off far beyond float64's is still accepted


def test_similarities_never_exceed_their_range_through_round_off():
    u1, u3 = random_bases(200, 7, 1, seed=25), random_bases(100, 7, 3, seed=26)
    assert principal_angle_similarity(u1).max() <= 1.0  # |cos| of a unit vector with itself rounds above 1
    assert principal_angle_similarity(u3).max() <= 3.0
    v = torch.randn(1, 50, generator=gen(27)) * (torch.rand(40, 1, generator=gen(28)) * 10 + 0.1)  # parallel rows
    w = similarity("parameter", params=v)
    assert w.max() <= 1.0 and w.min() >= 0.99


def test_cross_similarity_of_bases_with_different_p_is_the_sum_of_cosines():
    u2, v1 = random_bases(4, 6, 2, seed=29), random_bases(3, 6, 1, seed=30)
    brute = torch.tensor([[float(torch.linalg.svdvals(a.T @ b).sum()) for b in v1] for a in u2], dtype=F64)
    torch.testing.assert_close(principal_angle_similarity(u2, v1), brute)
    torch.testing.assert_close(principal_angle_similarity(v1, u2), brute.T)
    with pytest.raises(ConfigError, match="feature dimension 5 differs from the bases' 6"):
        principal_angle_similarity(u2, random_bases(3, 5, 1, seed=31))


def test_row_blocks_cover_more_clients_than_features():
    u = random_bases(10, 3, 2, seed=32)  # K = 10 > D = 3
    brute = torch.tensor([[float(torch.linalg.svdvals(a.T @ b).sum()) for b in u] for a in u], dtype=F64)
    torch.testing.assert_close(principal_angle_similarity(u, row_chunk=2), brute)


def test_official_graph_with_one_neighbour_or_more_than_there_are():
    w = random_w(4, seed=33)
    one = official_similarity(w, top_k=1)
    assert torch.equal((one > 0).sum(1), torch.ones(4, dtype=torch.long)) and torch.all(one.sum(1) == 1)
    every = official_similarity(w, top_k=5)  # all 3 others
    assert torch.equal((every > 0).sum(1), torch.full((4,), 3)) and torch.all(every.diagonal() == 0)
    with pytest.raises(ConfigError, match="top_k"):
        official_similarity(w, top_k=0)
    with pytest.raises(ConfigError, match="square"):
        official_similarity(torch.ones(3, 4))


@pytest.mark.parametrize(
    "params", [torch.zeros(0, 3), torch.ones(3), torch.ones(2, 3, dtype=torch.long), torch.tensor([[1.0, math.inf]])]
)
def test_parameter_similarity_refuses_what_is_not_a_finite_k_by_p_store(params):
    with pytest.raises(ConfigError, match="fedora.similarity.params"):
        similarity("parameter", params=params)


def test_one_client_is_a_federation_for_every_kind():
    assert similarity("parameter", params=torch.ones(1, 3)).tolist() == [[1.0]]
    assert similarity("identity", num_clients=1).tolist() == [[1.0]]
    with pytest.raises(ConfigError, match="num_clients"):
        similarity("identity")


def test_uniform_sizes_must_be_positive_and_one_per_client():
    for sizes in (torch.tensor([3.0, 0.0]), torch.tensor([1.0, 2.0, 3.0])):
        with pytest.raises(ConfigError, match="fedora.similarity.sizes"):
            similarity("uniform", num_clients=2, sizes=sizes)


def test_random_similarity_is_the_symmetrised_uniform_draw():
    w = similarity("random", num_clients=6, generator=gen(34))
    r = torch.rand(6, 6, generator=gen(34), dtype=F64)
    expected = (r + r.T) / 2
    expected.fill_diagonal_(1.0)
    assert torch.equal(w, expected) and w.max() <= 1.0


def test_kappa_and_alpha_edges():
    assert kappa_of(kappa=0.0) == 0.0
    for alpha in (math.inf, -1.0, math.nan):
        with pytest.raises(ConfigError, match="fedora.alpha"):
            kappa_of(alpha)


def test_square_matrices_and_matching_stores_are_required():
    w = random_w(3, seed=35)
    with pytest.raises(ConfigError, match="fedora.W"):
        transition_matrix(torch.ones(3, 4))
    m = propagation_matrix(w)
    with pytest.raises(ConfigError, match="fedora.M"):
        propagate(torch.ones(3, 4, dtype=F64), torch.ones(3, 2, dtype=F64))
    for theta in (torch.ones(4, 2, dtype=F64), torch.ones(3, dtype=F64)):
        with pytest.raises(ConfigError, match="fedora.theta"):
            propagate(m, theta)
        with pytest.raises(ConfigError, match="fedora.theta"):
            propagate_iterative(w, theta, iters=2)


def test_the_error_names_exactly_the_clients_without_a_similar_client():
    w = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.2, 0.7]], dtype=F64)
    with pytest.raises(ConfigError, match=r"clients \[1\] have no similar client"):
        transition_matrix(w)


def test_chunked_propagation_writes_every_block_at_its_own_size():
    m = propagation_matrix(random_w(3, seed=36))
    theta = torch.randn(3, 10, generator=gen(36), dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a matmul into a buffer of the wrong size (resized with a warning)
        out = propagate(m, theta, chunk=4)
    torch.testing.assert_close(out, m @ theta)


def test_tolerance_stops_the_iteration_at_the_first_small_enough_step():
    """Two clients that see only each other: every step halves (κ = 0.5) and starts near the cap's own
    scale, so a cap set too low or a missing stop would change the result."""
    w = torch.tensor([[1e-9, 1.0], [1.0, 1e-9]], dtype=F64)
    theta = torch.tensor([[1000.0, -3.0], [-1000.0, 5.0]], dtype=F64)
    tol = 1e-6
    prev, steps = theta, 0
    while True:
        steps += 1
        cur = propagate_iterative(w, theta, kappa=0.5, iters=steps)
        if float((cur - prev).abs().max()) <= tol:
            break
        prev = cur
    assert steps > 20
    assert torch.equal(propagate_iterative(w, theta, kappa=0.5, tol=tol), cur)
    assert torch.equal(propagate_iterative(w, 1e-3 * theta, kappa=0.0, tol=tol), 1e-3 * theta)  # κ = 0: one step
    with pytest.raises(ConfigError, match="fedora.tol"):
        propagate_iterative(w, theta, kappa=0.5, tol=0.0)


def test_new_client_row_checks_and_a_zero_or_fractional_self_similarity():
    w = torch.tensor([0.2, 0.6], dtype=F64)
    for bad in (torch.ones(1, 2, 2, dtype=F64), torch.tensor([0.2, -0.1], dtype=F64), torch.tensor([math.inf, 1.0])):
        with pytest.raises(ConfigError, match="fedora.new_client"):
            new_client_row(bad)
    row0 = new_client_row(w, kappa=0.5, self_similarity=0.0)  # the official graph: no self-edge
    torch.testing.assert_close(row0, torch.tensor([0.5 * 0.2 / 0.8, 0.5 * 0.6 / 0.8, 0.5], dtype=F64))
    half = new_client_row(w, kappa=0.5, self_similarity=0.5)
    torch.testing.assert_close(half.sum(), torch.tensor(1.0, dtype=F64))


def test_selective_lambda_needs_a_positive_floor():
    with pytest.raises(ConfigError, match="fedora.eps"):
        selective_lambda(1.0, 0.5, eps=0.0)
