"""Sharpness-aware perturbations on flat parameter vectors: SAM, LWSAM and the general ℓ_p form.

The pieces of PLGU (Qu et al., CVPR'23) that do not depend on a training loop:

- ``layer_scores``: the layer personalization score ξ_l = ‖θ_l − w_l‖ / dim(w_l) (Eq. 6/10),
  normalised to sum 1 over the layers.
- ``layer_scale``: Λ = diag(ξ) expanded to one factor per parameter.
- ``perturbation``: ε = ρ · sign(g) · Λ |g|^{q−1} / ‖g‖_q^{q/p}, 1/p + 1/q = 1 (Eq. 5); p = 2 gives
  SAM's ε = ρ g/‖g‖ (Eq. 3) and, with Λ, LWSAM's ε = ρ Λ g/‖g‖.
- ``SharpnessStep.two_pass``: SAM's two passes — perturb, re-evaluate the gradient, restore.

"A layer" is a parametrised module: ``ModelLayout.layer_slices()`` gives one contiguous slice of the
flat parameter vector per module (weight and bias together). Derivations: docs/plgu.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def _check_layers(layers: Sequence[slice], size: int) -> None:
    if len(layers) == 0:
        raise ValueError("no layers given")
    for sl in layers:
        if sl.step not in (None, 1) or sl.start is None or sl.stop is None:
            raise ValueError(f"layer {sl} must be a plain slice(start, stop)")
        if not 0 <= sl.start < sl.stop <= size:
            raise ValueError(f"layer {sl} is empty or outside a vector of size {size}")
    ordered = sorted(layers, key=lambda sl: sl.start)
    for a, b in zip(ordered[:-1], ordered[1:], strict=True):
        if b.start < a.stop:
            raise ValueError(f"layers {a} and {b} overlap")


@torch.no_grad()
def layer_scores(theta: Tensor, w: Tensor, layers: Sequence[slice]) -> Tensor:
    """ξ_l = ‖θ_l − w_l‖₂ / dim(w_l), normalised to Σ_l ξ_l = 1 (shape (L,), dtype of ``theta``).

    The paper says dividing by dim(w_l) "can normalize the values as Σ ξ = 1"; it does not, so the
    scores are divided by their sum explicitly. When θ = w on every layer the scores are uniform
    (1/L): no layer is more personalized than another.
    """
    if theta.shape != w.shape or theta.dim() != 1:
        raise ValueError(f"theta and w must be flat vectors of one size, got {tuple(theta.shape)}, {tuple(w.shape)}")
    _check_layers(layers, theta.numel())
    raw = torch.stack([torch.linalg.vector_norm(theta[sl] - w[sl]) / (sl.stop - sl.start) for sl in layers])
    total = raw.sum()
    uniform = torch.full_like(raw, 1.0 / len(layers))
    # torch.where instead of `if total == 0` keeps this free of a host sync on GPU.
    return torch.where(total > 0, raw / total.clamp_min(torch.finfo(raw.dtype).tiny), uniform)


def top_layers(scores: Tensor, d: int) -> list[int]:
    """Indices of the ``d`` layers with the largest scores (PLGU-LF's personalized set L^Per),
    largest first; ties go to the earlier layer so the choice is deterministic."""
    if not 0 <= d <= scores.numel():
        raise ValueError(f"cannot pick {d} of {scores.numel()} layers")
    order = torch.sort(-scores.detach().cpu(), stable=True).indices
    return order[:d].tolist()


def layer_scale(scores: Tensor, layers: Sequence[slice], size: int) -> Tensor:
    """The diagonal of Λ per parameter: entry j is ξ_l for the layer l that holds j, and 0 for a
    parameter outside every listed layer (it is not perturbed)."""
    _check_layers(layers, size)
    if scores.shape != (len(layers),):
        raise ValueError(f"expected {len(layers)} scores, got shape {tuple(scores.shape)}")
    scale = torch.zeros(size, dtype=scores.dtype, device=scores.device)
    for sl, xi in zip(layers, scores, strict=True):
        scale[sl] = xi
    return scale


def _dual_exponent(p: float) -> float:
    if not (p >= 1.0):  # also rejects NaN
        raise ValueError(f"p must be >= 1 (ℓ_p with p < 1 is not a norm and has no dual-norm maximiser), got {p}")
    if p == 1.0:
        return math.inf
    if math.isinf(p):
        return 1.0
    return p / (p - 1.0)


def _perturb_(g: Tensor, rho: float, p: float, scale: Tensor | None) -> Tensor:
    """Turn gradient ``g`` into ε in place (see ``perturbation``) and return it."""
    q = _dual_exponent(p)
    tiny = torch.finfo(g.dtype).tiny
    if p == 2.0:
        # ε = ρ g / ‖g‖₂; g = 0 gives 0 / tiny = 0.
        g.mul_(rho / torch.linalg.vector_norm(g).clamp_min(tiny))
    elif math.isinf(p):
        # q = 1: |g|^0 / ‖g‖_1^0 = 1, so ε = ρ sign(g) (sign(0) = 0).
        g.sign_().mul_(rho)
    elif math.isinf(q):
        # p = 1 is the limit q → ∞ of ρ sign(g) (|g|/‖g‖_q)^{q−1}: all mass on the largest |g_j|,
        # split evenly between ties, so ‖ε‖₁ = ρ. g = 0 gives 0.
        a = g.abs()
        top = a.max()
        hit = (a == top) & (top > 0)
        g.copy_(torch.where(hit, g.sign(), torch.zeros_like(g)))
        g.mul_(rho / hit.sum().to(g.dtype).clamp_min(1))
    else:
        # ‖g‖_q^{q/p} = ‖g‖_q^{q−1}, so ε = ρ sign(g) (|g| / ‖g‖_q)^{q−1}: every base is ≤ 1, so the
        # power neither overflows nor underflows the way |g|^{q−1} and ‖g‖_q^q would for large q.
        # The norm is taken of g/max|g| for the same reason.
        a = g.abs()
        top = a.max().clamp_min(tiny)
        norm = torch.linalg.vector_norm(a / top, ord=q) * top
        g.copy_(torch.copysign(a.div_(norm.clamp_min(tiny)).pow_(q - 1.0), g)).mul_(rho)
    if scale is not None:
        g.mul_(scale)
    return g


def perturbation(grad: Tensor, rho: float, p: float = 2.0, scale: Tensor | None = None) -> Tensor:
    """ε = ρ · sign(g) · Λ |g|^{q−1} / ‖g‖_q^{q/p}, 1/p + 1/q = 1 (PLGU Eq. 5; a new tensor).

    - Λ = I (``scale=None``): ε is the exact maximiser of gᵀε over the ball ‖ε‖_p ≤ ρ (Hölder), so
      ‖ε‖_p = ρ and gᵀε = ρ‖g‖_q. p = 2 is SAM: ε = ρ g/‖g‖₂.
    - ``scale`` = diag(Λ) per parameter (``layer_scale``): Λ multiplies the *normalised* direction,
      as in Eq. 5 — the norm in the denominator is of the unscaled g. For p = 2 this is LWSAM's
      ε = ρ Λ g/‖g‖ (PLGU's Eq. 5 at p = 2): each layer gets SAM's step times ξ_l, and ‖ε‖ ≤ ρ max_l ξ_l.
    - Edge cases: g = 0 gives ε = 0; p = ∞ gives ρ sign(g); p = 1 gives the limit of the formula,
      ρ sign(g_j)/k on the k coordinates of largest |g_j| and 0 elsewhere; p < 1 raises ValueError.
    - The paper prints the denominator as (‖g‖_q^q)^{p−1}; that does not reduce to its own Eq. 3 at
      p = 2, while SAM's (‖g‖_q^q)^{1/p} does, so the exponent is 1/p (docs/plgu.md).
    """
    if scale is not None and scale.shape != grad.shape:
        raise ValueError(f"scale has shape {tuple(scale.shape)}, the gradient {tuple(grad.shape)}")
    return _perturb_(grad.detach().clone(), rho, p, scale)


class SharpnessStep:
    """SAM's two passes on flat vectors, with no module in sight.

    Holds one reusable buffer the size of the parameters it is given (allocated on first use), so a
    client's many steps do not allocate.
    """

    def __init__(self) -> None:
        self._backup: Tensor | None = None

    def _backup_of(self, params: Tensor) -> Tensor:
        buf = self._backup
        if buf is None or buf.shape != params.shape or buf.dtype != params.dtype or buf.device != params.device:
            buf = self._backup = torch.empty_like(params)
        return buf.copy_(params)

    def two_pass(
        self,
        params: Tensor,
        grads: Tensor,
        grad_fn: Callable[[], None],
        rho: float,
        p: float = 2.0,
        scale: Tensor | None = None,
        ascent_grad: Tensor | None = None,
    ) -> None:
        """Leave in ``grads`` the gradient at params + ε, with ``params`` unchanged afterwards.

        On entry ``grads`` holds the gradient at ``params`` (unless ``ascent_grad`` is given).

        1. ε = ``perturbation(ascent_grad or grads, rho, p, scale)``;
        2. params += ε; ``grad_fn()`` (must overwrite ``grads`` with the gradient at the current
           params, e.g. zero_grad + forward + backward);
        3. params restored.

        ``params``/``grads`` may be views of a region of a model's flat vectors (e.g. PLGU-GRep's
        body): ε, its norm and the restore then cover that region only. ``ascent_grad`` is the
        gradient ε is built from when it is not the one in ``grads`` (PLGU-LF builds ε from the
        personalized model's gradient and applies it to the global copy); it is left untouched.
        Without it ε is formed in place in ``grads``, which step 2 overwrites anyway.

        Restoring is by copy, not by subtracting ε: in floating point (θ + ε) − ε ≠ θ whenever
        |ε_j| > |θ_j| loses θ_j's low bits (e.g. near-zero biases), and the copy costs the same one
        P-sized buffer that keeping ε would. So params come back bit for bit, in any dtype.
        ρ = 0: without ``ascent_grad`` nothing happens (``grads`` already is the gradient at
        params, so the step reduces to SGD bit for bit); with it, only ``grad_fn()`` runs.
        """
        if params.shape != grads.shape:
            raise ValueError(f"params {tuple(params.shape)} and grads {tuple(grads.shape)} differ in shape")
        if rho < 0:
            raise ValueError(f"rho must be >= 0, got {rho}")
        if rho == 0:
            # ε = 0: the gradient at params + ε is the one at params. Without ascent_grad that is
            # already in grads, so nothing runs — no second forward, no BatchNorm-statistics update,
            # no dropout draw — and SAM with ρ = 0 is SGD exactly, even on such models.
            if ascent_grad is not None:
                grad_fn()
            return
        if scale is not None and scale.shape != params.shape:
            raise ValueError(f"scale has shape {tuple(scale.shape)}, params {tuple(params.shape)}")
        with torch.no_grad():
            eps = _perturb_(grads, rho, p, scale) if ascent_grad is None else perturbation(ascent_grad, rho, p, scale)
            backup = self._backup_of(params)
            params.add_(eps)
            del eps
        grad_fn()
        with torch.no_grad():
            params.copy_(backup)
