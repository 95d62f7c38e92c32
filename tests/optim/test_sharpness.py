"""SAM / LWSAM / ℓ_p perturbations and the two-pass step on flat vectors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pfl.engine.flat import FlatModule
from pfl.optim.sharpness import SharpnessStep, layer_scale, layer_scores, perturbation, top_layers


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _layers(sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for n in sizes:
        out.append(slice(start, start + n))
        start += n
    return out


# -- layer scores -------------------------------------------------------------------------------
def test_layer_scores_are_distance_per_parameter_normalised_to_one():
    layers = _layers([4, 10, 2])
    w = torch.randn(16, generator=_gen())
    theta = w.clone()
    theta[0:4] += 1.0  # ‖Δ‖ = 2, dim 4 -> 0.5
    theta[4:14] += torch.tensor([3.0, 4.0] + [0.0] * 8)  # ‖Δ‖ = 5, dim 10 -> 0.5
    theta[14:16] += torch.tensor([0.0, 2.0])  # ‖Δ‖ = 2, dim 2 -> 1.0
    xi = layer_scores(theta, w, layers)
    torch.testing.assert_close(xi, torch.tensor([0.25, 0.25, 0.5]))
    assert math.isclose(float(xi.sum()), 1.0, rel_tol=1e-6)


def test_layer_scores_are_uniform_when_nothing_moved():
    w = torch.randn(16, generator=_gen())
    xi = layer_scores(w, w.clone(), _layers([4, 10, 2]))
    torch.testing.assert_close(xi, torch.full((3,), 1 / 3))


def test_layer_scores_follow_the_flat_module_layers():
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    flat = FlatModule(net)
    layers = list(flat.layout.layer_slices().values())
    assert [sl.stop - sl.start for sl in layers] == [3 * 5 + 5, 5 * 2 + 2]  # weight and bias together
    theta = flat.params.clone()
    theta[layers[1]] += 1.0  # only the classifier moved
    torch.testing.assert_close(layer_scores(theta, flat.params, layers), torch.tensor([0.0, 1.0]))


def test_top_layers_breaks_ties_towards_the_earlier_layer():
    assert top_layers(torch.tensor([0.1, 0.4, 0.1, 0.4]), 3) == [1, 3, 0]
    assert top_layers(torch.tensor([0.1, 0.4]), 0) == []
    with pytest.raises(ValueError):
        top_layers(torch.tensor([0.1, 0.4]), 3)


def test_layer_scale_expands_scores_and_leaves_unlisted_parameters_at_zero():
    scale = layer_scale(torch.tensor([0.2, 0.8]), [slice(0, 2), slice(3, 5)], 6)
    assert scale.tolist() == pytest.approx([0.2, 0.2, 0.0, 0.8, 0.8, 0.0])
    with pytest.raises(ValueError):
        layer_scale(torch.tensor([1.0]), [slice(0, 7)], 6)
    with pytest.raises(ValueError, match="overlap"):
        layer_scale(torch.tensor([0.5, 0.5]), [slice(0, 3), slice(2, 5)], 6)


# -- perturbation -------------------------------------------------------------------------------
def test_sam_perturbation_has_norm_rho_along_the_gradient():
    g = torch.randn(1000, generator=_gen())
    eps = perturbation(g, rho=0.05)
    assert math.isclose(float(eps.norm()), 0.05, rel_tol=1e-5)
    torch.testing.assert_close(eps, 0.05 * g / g.norm())


@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, 3.0, 7.0, math.inf])
def test_lp_perturbation_attains_the_dual_norm_on_the_lp_ball(p):
    """Hölder: max over ‖ε‖_p ≤ ρ of gᵀε is ρ‖g‖_q, attained exactly by the formula's ε."""
    g = torch.randn(200, generator=_gen(1), dtype=torch.float64)
    rho = 0.3
    q = math.inf if p == 1 else (1.0 if math.isinf(p) else p / (p - 1))
    eps = perturbation(g, rho, p=p)
    assert math.isclose(float(torch.linalg.vector_norm(eps, ord=p)), rho, rel_tol=1e-9)
    assert math.isclose(float(g @ eps), rho * float(torch.linalg.vector_norm(g, ord=q)), rel_tol=1e-9)
    # and no random point of the ball does better
    for seed in range(5):
        u = torch.randn(200, generator=_gen(100 + seed), dtype=torch.float64)
        u = rho * u / torch.linalg.vector_norm(u, ord=p)
        assert float(g @ u) <= float(g @ eps)


def test_lp_form_at_p2_is_sam_and_approaches_its_limits():
    g = torch.randn(50, generator=_gen(2), dtype=torch.float64)
    torch.testing.assert_close(perturbation(g, 0.1, p=2.0), 0.1 * g / g.norm())
    torch.testing.assert_close(perturbation(g, 0.1, p=2.0 + 1e-9), perturbation(g, 0.1, p=2.0), rtol=1e-6, atol=0)
    torch.testing.assert_close(perturbation(g, 0.1, p=1e4), perturbation(g, 0.1, p=math.inf), rtol=0, atol=1e-4)
    torch.testing.assert_close(perturbation(g, 0.1, p=1.0 + 1e-3), perturbation(g, 0.1, p=1.0), rtol=0, atol=1e-3)


def test_p1_splits_the_radius_between_tied_largest_coordinates():
    g = torch.tensor([1.0, -3.0, 3.0, 0.5])
    torch.testing.assert_close(perturbation(g, 0.2, p=1.0), torch.tensor([0.0, -0.1, 0.1, 0.0]))


@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, math.inf])
def test_zero_gradient_gives_zero_perturbation(p):
    eps = perturbation(torch.zeros(10), 0.05, p=p)
    assert torch.equal(eps, torch.zeros(10))


def test_large_q_does_not_overflow():
    g = torch.tensor([1e3, -2e3, 5e-3], dtype=torch.float32)
    eps = perturbation(g, 0.1, p=1.01)  # q = 101: |g|^{q−1} overflows float32
    assert torch.isfinite(eps).all()
    assert math.isclose(float(torch.linalg.vector_norm(eps, ord=1.01)), 0.1, rel_tol=1e-4)


def test_p_below_one_is_refused():
    with pytest.raises(ValueError, match="p must be >= 1"):
        perturbation(torch.ones(3), 0.1, p=0.5)


def test_lwsam_layer_norms_follow_the_scores():
    """With Λ = diag(ξ) the normalisation uses the unscaled g (Eq. 5), so layer l's share is
    ‖ε_l‖ = ρ ξ_l ‖g_l‖ / ‖g‖ and ratios of layer norms are ξ-weighted ratios of gradient norms."""
    layers = _layers([30, 70, 20])
    g = torch.randn(120, generator=_gen(3), dtype=torch.float64)
    xi = torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64)
    rho = 0.05
    eps = perturbation(g, rho, scale=layer_scale(xi, layers, 120))
    for sl, x in zip(layers, xi, strict=True):
        assert math.isclose(float(eps[sl].norm()), rho * float(x) * float(g[sl].norm() / g.norm()), rel_tol=1e-9)
    r01 = float(eps[layers[0]].norm() / eps[layers[1]].norm())
    assert math.isclose(r01, float(xi[0] * g[layers[0]].norm() / (xi[1] * g[layers[1]].norm())), rel_tol=1e-9)
    # Λ = I is SAM
    torch.testing.assert_close(perturbation(g, rho, scale=torch.ones(120, dtype=torch.float64)), perturbation(g, rho))


def test_perturbation_does_not_touch_its_input():
    g = torch.randn(20, generator=_gen(4))
    before = g.clone()
    perturbation(g, 0.1, p=3.0, scale=torch.rand(20, generator=_gen(5)))
    assert torch.equal(g, before)


def _small_net():
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    flat = FlatModule(net)
    flat.params.copy_(0.5 * torch.randn(flat.num_params, generator=_gen(21)))
    return net, flat


# -- two-pass step ------------------------------------------------------------------------------
def _quadratic(n: int = 12, seed: int = 0):
    """F(x) = ½ xᵀAx − bᵀx with a hand-written gradient A x − b."""
    gen = _gen(seed)
    m = torch.randn(n, n, generator=gen, dtype=torch.float64)
    a, b = m @ m.T / n + torch.eye(n, dtype=torch.float64), torch.randn(n, generator=gen, dtype=torch.float64)
    return a, b


def test_two_pass_leaves_the_gradient_at_the_perturbed_point_and_restores_params():
    a, b = _quadratic()
    params = torch.randn(12, generator=_gen(7), dtype=torch.float64)
    grads = a @ params - b
    g0, start = grads.clone(), params.clone()
    seen = []

    def grad_fn():
        seen.append(params.clone())
        grads.copy_(a @ params - b)

    xi = torch.tensor([0.7, 0.3], dtype=torch.float64)
    scale = layer_scale(xi, _layers([5, 7]), 12)
    SharpnessStep().two_pass(params, grads, grad_fn, rho=0.1, scale=scale)
    eps = 0.1 * scale * g0 / g0.norm()
    torch.testing.assert_close(seen[0], start + eps)
    torch.testing.assert_close(grads, a @ (start + eps) - b)
    assert torch.equal(params, start)


def test_two_pass_with_rho_zero_is_sgd_bit_for_bit():
    """SAM with ρ = 0 equals SGD: same parameters after several optimizer steps, and no second
    forward (which would move BatchNorm statistics or draw dropout masks)."""
    net_sgd, flat_sgd = _small_net()
    net_sam, flat_sam = _small_net()
    x, y = torch.randn(16, 6, generator=_gen(8)), torch.randint(0, 3, (16,), generator=_gen(9))
    calls = []

    def grad_fn(net, flat):
        calls.append(net)
        flat.zero_grad()
        F.cross_entropy(net(x), y).backward()

    opt_sgd = torch.optim.SGD([flat_sgd.flat_param], lr=0.1, momentum=0.9)
    opt_sam = torch.optim.SGD([flat_sam.flat_param], lr=0.1, momentum=0.9)
    step = SharpnessStep()
    for _ in range(3):
        grad_fn(net_sgd, flat_sgd)
        opt_sgd.step()
        grad_fn(net_sam, flat_sam)
        step.two_pass(flat_sam.params, flat_sam.grads, lambda: grad_fn(net_sam, flat_sam), rho=0.0)
        opt_sam.step()
    assert torch.equal(flat_sam.params, flat_sgd.params)
    assert calls.count(net_sam) == 3  # only the caller's own pass


def test_two_pass_with_rho_zero_and_an_ascent_gradient_evaluates_at_params():
    a, b = _quadratic(6, seed=3)
    params = torch.randn(6, generator=_gen(14), dtype=torch.float64)
    grads = torch.full((6,), 7.0, dtype=torch.float64)  # not the gradient at params
    start = params.clone()
    SharpnessStep().two_pass(params, grads, lambda: grads.copy_(a @ params - b), rho=0.0, ascent_grad=torch.ones(6))
    torch.testing.assert_close(grads, a @ start - b)
    assert torch.equal(params, start)


def test_two_pass_on_a_module_matches_a_hand_perturbed_copy():
    net, flat = _small_net()
    x, y = torch.randn(16, 6, generator=_gen(8)), torch.randint(0, 3, (16,), generator=_gen(9))

    def grad_fn():
        flat.zero_grad()
        F.cross_entropy(net(x), y).backward()

    grad_fn()
    g0, start = flat.grads.clone(), flat.params.clone()
    layers = list(flat.layout.layer_slices().values())
    scale = layer_scale(torch.tensor([0.25, 0.75]), layers, flat.num_params)
    SharpnessStep().two_pass(flat.params, flat.grads, grad_fn, rho=0.5, scale=scale)

    ref = torch.func.functional_call
    perturbed = (start + 0.5 * scale * g0 / g0.norm()).requires_grad_()
    loss = F.cross_entropy(ref(net, flat.param_dict(perturbed), (x,)), y)
    (expected,) = torch.autograd.grad(loss, perturbed)
    torch.testing.assert_close(flat.grads, expected)
    assert torch.equal(flat.params, start)


def test_two_pass_restores_params_bit_for_bit_where_add_then_subtract_would_not():
    """Tiny parameters under a large ε: (θ + ε) − ε rounds θ's low bits away in float32."""
    params = torch.tensor([1e-8, -3e-9, 0.3, 7e-10, 0.0], dtype=torch.float32)
    grads = torch.tensor([1.0, 1.0, -1.0, 2.0, 1.0])
    start = params.clone()
    eps = perturbation(grads, rho=1.0)
    assert not torch.equal((params + eps) - eps, start)  # the premise: subtraction is lossy here
    SharpnessStep().two_pass(params, grads, lambda: grads.fill_(0.5), rho=1.0)
    assert torch.equal(params, start)


def test_two_pass_on_a_region_view_perturbs_and_normalises_that_region_only():
    a, b = _quadratic(10, seed=1)
    params = torch.randn(10, generator=_gen(11), dtype=torch.float64)
    grads = a @ params - b
    g0, start = grads.clone(), params.clone()
    seen = []

    def grad_fn():
        seen.append(params.clone())
        grads.copy_(a @ params - b)

    body = slice(0, 6)
    SharpnessStep().two_pass(params[body], grads[body], grad_fn, rho=0.2)
    expected = start.clone()
    expected[body] += 0.2 * g0[body] / g0[body].norm()
    torch.testing.assert_close(seen[0], expected)
    assert torch.equal(params, start)
    torch.testing.assert_close(grads, a @ expected - b)


def test_ascent_grad_builds_eps_from_another_gradient_and_is_left_alone():
    a, b = _quadratic(8, seed=2)
    params = torch.randn(8, generator=_gen(12), dtype=torch.float64)
    grads = a @ params - b
    other = torch.randn(8, generator=_gen(13), dtype=torch.float64)
    other_before, start = other.clone(), params.clone()
    seen = []

    def grad_fn():
        seen.append(params.clone())
        grads.copy_(a @ params - b)

    SharpnessStep().two_pass(params, grads, grad_fn, rho=0.1, ascent_grad=other)
    torch.testing.assert_close(seen[0], start + 0.1 * other / other.norm())
    assert torch.equal(other, other_before) and torch.equal(params, start)


def test_repeated_steps_follow_the_closed_form_sam_iteration():
    """On F(x) = ½ xᵀAx, SAM is x ← x − η A(x + ρ Ax/‖Ax‖); the buffer reused across steps must not leak."""
    a = torch.diag(torch.tensor([10.0, 0.1], dtype=torch.float64))
    x_sam = torch.tensor([1.0, 1.0], dtype=torch.float64)
    x_ref = x_sam.clone()
    grads = torch.zeros(2, dtype=torch.float64)
    step, lr, rho = SharpnessStep(), 0.01, 0.05

    def grad_fn():
        grads.copy_(a @ x_sam)

    for _ in range(5):
        grad_fn()
        step.two_pass(x_sam, grads, grad_fn, rho=rho)
        x_sam -= lr * grads
        g = a @ x_ref
        x_ref = x_ref - lr * (a @ (x_ref + rho * g / g.norm()))
    torch.testing.assert_close(x_sam, x_ref)


# -- edges of the checks (mutation run) ---------------------------------------------------------
def test_one_layer_is_a_valid_layout_and_an_empty_one_is_not():
    w = torch.randn(5, generator=_gen())
    torch.testing.assert_close(layer_scores(w + 1.0, w, [slice(0, 5)]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="no layers"):
        layer_scores(w + 1.0, w, [])


def test_layers_must_be_plain_non_empty_slices_inside_the_vector():
    w = torch.randn(6, generator=_gen())
    torch.testing.assert_close(layer_scores(w + 1.0, w, [slice(0, 3, 1), slice(3, 6)]), torch.tensor([0.5, 0.5]))
    for bad in (slice(0, 6, 2), slice(None, 3), slice(0, None)):
        with pytest.raises(ValueError, match="plain slice"):
            layer_scores(w + 1.0, w, [bad])
    for bad in (slice(2, 2), slice(3, 7), slice(-1, 3)):
        with pytest.raises(ValueError, match="empty or outside"):
            layer_scores(w + 1.0, w, [bad])


def test_layer_scores_take_no_gradient_and_need_two_flat_vectors_of_one_size():
    w = torch.randn(6, generator=_gen())
    theta = (w + 1.0).requires_grad_()
    assert not layer_scores(theta, w, _layers([2, 4])).requires_grad  # a score, not part of any loss
    with pytest.raises(ValueError, match="flat vectors"):
        layer_scores(w.reshape(2, 3), w.reshape(2, 3), [slice(0, 2)])  # same shape, not flat
    with pytest.raises(ValueError, match="flat vectors"):
        layer_scores(w, w[:5], [slice(0, 2)])  # flat, of two sizes


def test_top_layers_may_pick_every_layer():
    assert top_layers(torch.tensor([0.1, 0.4, 0.2]), 3) == [1, 2, 0]
    with pytest.raises(ValueError, match="cannot pick -1"):
        top_layers(torch.tensor([0.1, 0.4]), -1)


def test_p1_puts_the_radius_on_the_largest_coordinates_also_when_they_are_below_one():
    eps = perturbation(torch.tensor([0.1, -0.3, 0.3, 0.2]), rho=0.5, p=1.0)
    torch.testing.assert_close(eps, torch.tensor([0.0, -0.25, 0.25, 0.0]))


def test_two_pass_reuses_its_buffer_and_reallocates_for_another_shape_or_dtype():
    step = SharpnessStep()

    def run(params: torch.Tensor) -> None:
        start, g0 = params.clone(), torch.linspace(-1.0, 1.0, params.numel(), dtype=params.dtype)
        grads = g0.clone()
        step.two_pass(params, grads, lambda: grads.copy_(params), rho=0.1)  # "gradient" = the point it is taken at
        assert torch.equal(params, start)
        torch.testing.assert_close(grads, start + 0.1 * g0 / g0.norm())

    run(torch.randn(4, generator=_gen(1)))
    first = step._backup
    run(torch.randn(4, generator=_gen(2)))
    assert step._backup is first  # a client's many steps do not allocate
    run(torch.randn(6, generator=_gen(3)))
    assert step._backup.shape == (6,)
    run(torch.randn(6, generator=_gen(4), dtype=torch.float64))
    assert step._backup.dtype == torch.float64


def test_top_layers_breaks_ties_towards_the_earlier_layer_in_a_deep_model():
    scores = torch.tensor([0.0, 1.0, 2.0] * 10)  # 30 layers: sorting small inputs would hide an unstable sort
    assert top_layers(scores, 15) == list(range(2, 30, 3)) + list(range(1, 15, 3))
