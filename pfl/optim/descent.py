"""FedPG's descent pieces: the fairness objective, the common (G-model) direction, the personalized
(P-model) direction, the conflict metric and S-FedPG's step-size line search (docs/fedpg.md).

Sign conventions (the same for every method):
- a client's gradient g_i is its (pseudo-)gradient and points *uphill*: the true gradient ∇L_i(w),
  or the pseudo-gradient g_i = w − w_i^trained of local training started from w;
- a direction d (and the applied update Δ = w_new − w) points where the model moves;
- d conflicts with client i when g_i · d > 0 (first-order increase of L_i along d).
FedPG moves along d = −Qλ with Q = [g_1 … g_m, ∇F, history] and λ the min-norm weights, so
g_i · d ≤ −‖d‖² ≤ 0 for every row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from pfl.errors import require
from pfl.optim.minnorm import gram_matrix, min_norm, nnls_gram

# An auxiliary row (∇F or a history row) with norm ≤ ZERO_ROW_TOL · (largest client-gradient norm) is
# dropped: its constraint row·d ≤ 0 holds for every d, and keeping a (near-)zero row in the hull
# would force d ≈ 0 (with one client ∇F ≡ 0 because F ≡ −1; see docs/fedpg.md).
ZERO_ROW_TOL = 1e-12

# The norm the auxiliary rows (∇F, history) are rescaled to before the solve (docs/fedpg.md):
# none = Q as printed; mean = the mean client-gradient norm (authors' code; one upload with a ×100 norm
# inflates it and switches the auxiliary rows off); median = the median client-gradient norm (pfl's
# default: robust to a minority of outlying uploads).
RESCALES = ("none", "mean", "median")


def rescale_target(client_norms: Tensor, rescale: str) -> Tensor:
    """The common norm μ of the rescaled rows (``rescale`` = mean or median): the mean or the median
    (for an even count the mean of the two middle values) of the client-gradient norms."""
    return client_norms.quantile(0.5) if rescale == "median" else client_norms.mean()


# ---------------------------------------------------------------------------------------------
# Fairness objective F(w) = −cos(L(w), 1)
# ---------------------------------------------------------------------------------------------


def _checked_losses(losses: Tensor, field: str) -> Tensor:
    require(
        losses.dim() == 1 and losses.numel() >= 1, field, f"a (m,) vector of client losses, got {tuple(losses.shape)}"
    )
    lv = losses.detach().to(torch.float64)
    require(bool(torch.isfinite(lv).all()), field, "contains NaN or inf")
    require(float(lv.norm()) > 0, field, "all losses are 0: the cosine with 1 is undefined")
    return lv


def fairness_value(losses: Tensor) -> float:
    """F = −cos(L, 1) = −(Lᵀ1) / (‖L‖ ‖1‖) ∈ [−1, 1]; −1 when all losses are equal (and positive)."""
    lv = _checked_losses(losses, "fairness.losses")
    return -float(lv.sum() / (lv.norm() * math.sqrt(lv.numel())))


def fairness_coefficients(losses: Tensor) -> Tensor:
    """h = ∂F/∂L = (1/‖L‖)(((Lᵀ1)L)/(‖1‖‖L‖²) − 1/‖1‖), float64 (m,), so that ∇_w F = Σ_i h_i g_i.

    Computed as (cos·L̂ − 1̂)/‖L‖ with L̂ = L/‖L‖, 1̂ = 1/√m, cos = L̂·1̂: the same formula, exactly 0
    for one client. hᵀL = 0 (h is ∝ the part of 1 orthogonal to L, negated).
    """
    lv = _checked_losses(losses, "fairness.losses")
    norm = lv.norm()
    unit = lv / norm
    ones = torch.full_like(lv, 1.0 / math.sqrt(lv.numel()))
    return ((unit @ ones) * unit - ones) / norm


def fairness_gradient(losses: Tensor, grads: Tensor) -> Tensor:
    """∇F = Σ_i h_i g_i (P,) in ``grads``' dtype, for F(w) = −cos(L(w), 1) and g_i = ∇L_i(w)."""
    require(grads.dim() == 2, "fairness.grads", f"an (m, P) matrix of client gradients, got {tuple(grads.shape)}")
    require(grads.shape[0] == losses.numel(), "fairness.grads", "one gradient row per client loss")
    return fairness_coefficients(losses).to(grads.dtype) @ grads


# ---------------------------------------------------------------------------------------------
# Common (G-model) direction
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommonDirectionInfo:
    """Everything about d besides d and λ. Rows are ordered: the m client rows, then ∇F (if given),
    then the history rows.

    coefficients: c = scales ⊙ λ, so d = −Σ_k c_k row_k over the rows as given (unscaled).
    scales: the factor each row had in Q (1 for client rows; μ/‖row‖ for rescaled rows; 0 for a
        dropped zero row).
    slopes: row_k · d for every row as given: the directional derivatives the line search needs
        (g_i · d per client, ∇F · d), taken from the Gram matrix, no extra pass over P.
    dropped: indices of auxiliary rows dropped as zero (see ZERO_ROW_TOL).
    norm_sq: ‖d‖². gap: the min-norm solver's optimality certificate.
    """

    coefficients: Tensor
    scales: Tensor
    slopes: Tensor
    dropped: tuple[int, ...]
    num_clients: int
    has_fairness: bool
    num_history: int
    norm_sq: float
    solver_used: str
    iterations: int
    gap: float


def common_direction(
    grads: Tensor,
    fairness_row: Tensor | None = None,
    history: Tensor | None = None,
    rescale: str = "none",
    *,
    solver: str = "auto",
) -> tuple[Tensor, Tensor, CommonDirectionInfo]:
    """FedPG's G-model direction d = −Qλ, λ = argmin_{λ∈Δ} ‖Qλ‖², Q = [g_1 … g_m, ∇F, history rows].

    grads (m, P): the clients' (pseudo-)gradients this round. fairness_row (P,): ∇F from
    :func:`fairness_gradient`, or None to leave F out (ablation). history (h, P): stored gradients of
    clients absent this round, so that d does not conflict with them either (authors' partial code),
    or None. rescale (:data:`RESCALES`): ``none`` = Q as printed; ``mean`` (authors' code) or
    ``median``: the fairness row and the history rows are rescaled to μ = the mean or median of the
    ‖g_i‖ (:func:`rescale_target`) before the solve (each row's sign constraint row·d ≤ 0 is
    unchanged by a positive scale; only λ's balance between rows changes).

    Returns d (P,) in grads' dtype, λ (K,) float64 over the rows of Q (0 for a dropped row) and a
    :class:`CommonDirectionInfo`. Lemma (FedPG Lemma 1): row·d ≤ −‖d‖² for every kept row, and d = 0
    iff 0 is in the convex hull of the rows (Pareto stationary). With one client and no history,
    d = −g_1 (∇F ≡ 0), so FedPG is gradient descent.
    """
    require(grads.dim() == 2 and grads.shape[0] >= 1, "common_direction.grads", "an (m, P) matrix with m ≥ 1")
    require(
        rescale in RESCALES, "common_direction.rescale", f"unknown value {rescale!r}", f"choose {', '.join(RESCALES)}"
    )
    m, p = grads.shape
    rows = list(grads)
    if fairness_row is not None:
        require(
            fairness_row.shape == (p,),
            "common_direction.fairness_row",
            f"a ({p},) vector, got {tuple(fairness_row.shape)}",
        )
        rows.append(fairness_row.to(grads.dtype))
    num_history = 0
    if history is not None:
        require(history.dim() == 2 and history.shape[1] == p, "common_direction.history", f"an (h, {p}) matrix")
        num_history = history.shape[0]
        rows.extend(history.to(grads.dtype))
    for field, t in (("grads", grads), ("fairness_row", fairness_row), ("history", history)):
        require(t is None or bool(torch.isfinite(t).all()), f"common_direction.{field}", "contains NaN or inf")

    gram = gram_matrix(rows)
    norms = gram.diagonal().clamp_min(0).sqrt()
    scales = torch.ones(len(rows), dtype=torch.float64, device=gram.device)
    client_norms = norms[:m]
    zero = ZERO_ROW_TOL * float(client_norms.max())
    dropped = tuple(k for k in range(m, len(rows)) if float(norms[k]) <= zero)
    if rescale != "none":
        target = rescale_target(client_norms, rescale)
        aux = torch.arange(m, len(rows), device=gram.device)
        scales[aux] = target / norms[aux].clamp_min(torch.finfo(torch.float64).tiny)
    for k in dropped:
        scales[k] = 0.0
    kept = [k for k in range(len(rows)) if k not in dropped]
    scaled = gram * scales[:, None] * scales[None, :]
    result = min_norm(gram=scaled[kept][:, kept], solver=solver)
    lam = torch.zeros(len(rows), dtype=torch.float64, device=gram.device)
    lam[kept] = result.weights.to(gram.device)
    coefficients = scales * lam
    direction = -_combine(coefficients, grads, fairness_row, history)
    info = CommonDirectionInfo(
        coefficients=coefficients,
        scales=scales,
        slopes=-(gram @ coefficients),
        dropped=dropped,
        num_clients=m,
        has_fairness=fairness_row is not None,
        num_history=num_history,
        norm_sq=float(direction.to(torch.float64) @ direction.to(torch.float64)),
        solver_used=result.solver_used,
        iterations=result.iterations,
        gap=result.gap,
    )
    return direction, lam, info


def _combine(coefficients: Tensor, grads: Tensor, fairness_row: Tensor | None, history: Tensor | None) -> Tensor:
    """Σ_k c_k row_k without stacking the rows into one matrix."""
    m = grads.shape[0]
    c = coefficients.to(grads.device, grads.dtype)
    out = c[:m] @ grads
    k = m
    if fairness_row is not None:
        out = out + c[k] * fairness_row.to(grads.dtype)
        k += 1
    if history is not None and history.shape[0]:
        out = out + c[k:] @ history.to(grads.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Conflict metric
# ---------------------------------------------------------------------------------------------


def conflict_fraction(grads: Tensor, update: Tensor, rel_tol: float = 0.0) -> float:
    """Share of clients whose (pseudo-)gradient conflicts with the applied update: g_i · Δ > 0.

    grads (m, P): uphill (pseudo-)gradients g_i = ∇L_i(w) or w − w_i^trained; update (P,): the applied
    Δ = w_new − w (for FedAvg Δ = −mean_i g_i; for FedPG Δ = η d). A row counts only when
    g_i · Δ > rel_tol · ‖g_i‖ ‖Δ‖ (rel_tol = 0: any positive inner product). Dots in float64.
    """
    require(grads.dim() == 2 and grads.shape[0] >= 1, "conflict.grads", "an (m, P) matrix with m ≥ 1")
    require(update.shape == (grads.shape[1],), "conflict.update", f"a ({grads.shape[1]},) vector")
    g = grads.to(torch.float64)
    u = update.to(torch.float64)
    dots = g @ u
    bound = rel_tol * g.norm(dim=1) * u.norm()
    return float((dots > bound).double().mean())


# ---------------------------------------------------------------------------------------------
# Personalized (P-model) direction
# ---------------------------------------------------------------------------------------------


def cone_projection_coefficients(gram: Tensor, index: int, *, solver: str = "auto") -> Tensor:
    """Coefficients c (K,) with c_index = 1 and c_j = μ_j ≥ 0 such that −Σ_k c_k g_k is the Euclidean
    projection of −g_index onto the polyhedral cone C_index = {d : g_j · d ≤ 0 ∀ j ≠ index}.

    gram: G (K, K) of the rows g_1 … g_K. μ solves the NNLS min_{μ≥0} ‖−g_i − Σ_j μ_j g_j‖², i.e.
    min_{μ≥0} ½μᵀG_oμ − rᵀμ with G_o the Gram of the other rows and r_j = −g_j · g_i.
    """
    k = gram.shape[0]
    require(0 <= index < k, "personal.index", f"must lie in [0, {k}), got {index}")
    coef = torch.zeros(k, dtype=torch.float64, device=gram.device)
    coef[index] = 1.0
    others = [j for j in range(k) if j != index]
    if others:
        g = gram.to(torch.float64)
        mu = nnls_gram(g[others][:, others], -g[others, index], solver=solver).coef
        coef[others] = mu.to(gram.device)
    return coef


def personal_direction(
    own: Tensor,
    others: Tensor,
    gamma: float,
    *,
    common: Tensor | None = None,
    solver: str = "auto",
) -> Tensor:
    """P-model direction of client i: d_i = (1 − γ)·d_c + γ·p_i (design: docs/fedpg.md).

    p_i = Π_C(−g_i), the projection of the own steepest-descent direction onto the cone
    C = {d : g_j · d ≤ 0 ∀ j ≠ i} of directions that conflict with no other client; d_c = ``common``
    (e.g. the G-model direction of :func:`common_direction`, which must satisfy g_j · d_c ≤ 0 for the
    ``others``; it does when they are among its rows) or, if None, the min-norm common direction of
    {g_i} ∪ others. Both lie in the convex cone C, so d_i does: g_j · d_i ≤ 0 for every j ≠ i.
    For client i: g_i · p_i = −‖p_i‖² ≤ 0, zero only when −g_i is in the cone spanned by the others
    (client i cannot improve without conflicting: it is stationary w.r.t. C).
    γ = 0: the common direction; γ = 1: the most personal non-conflicting direction.

    own (P,), others (m−1, P) (may have 0 rows: then p_i = −g_i), gamma ∈ [0, 1].
    """
    require(own.dim() == 1, "personal.own", f"a (P,) vector, got {tuple(own.shape)}")
    require(others.dim() == 2 and others.shape[1] == own.numel(), "personal.others", f"an (m−1, {own.numel()}) matrix")
    grads = torch.cat([own[None], others.to(own.dtype)])
    return personal_directions(grads, gamma, common=common, solver=solver, clients=[0])[0]


def personal_directions(
    grads: Tensor,
    gamma: float,
    *,
    common: Tensor | None = None,
    solver: str = "auto",
    clients: list[int] | None = None,
) -> Tensor:
    """:func:`personal_direction` for every client of a round from one Gram matrix: row i of the
    result is d_i for own = grads[i], others = the other rows. ``clients`` restricts the output to
    those row indices (in that order). The common part (``common``, or the min-norm direction of all
    rows, computed once) is shared by all clients.
    """
    require(0.0 <= gamma <= 1.0, "personal.gamma", f"must lie in [0, 1], got {gamma}", "γ > 1 leaves the cone")
    require(grads.dim() == 2 and grads.shape[0] >= 1, "personal.grads", "an (m, P) matrix with m ≥ 1")
    require(bool(torch.isfinite(grads).all()), "personal.grads", "contains NaN or inf")
    m, p = grads.shape
    clients = list(range(m)) if clients is None else clients
    require(all(0 <= i < m for i in clients), "personal.clients", f"indices must lie in [0, {m})")
    gram = gram_matrix(grads)
    if gamma < 1.0:
        if common is None:
            common = -(min_norm(gram=gram, solver=solver).weights.to(grads.device, grads.dtype) @ grads)
        require(common.shape == (p,), "personal.common", f"a ({p},) vector, got {tuple(common.shape)}")
    coefs = torch.stack([cone_projection_coefficients(gram, i, solver=solver) for i in clients])
    out = -(coefs.to(grads.device, grads.dtype) @ grads) * gamma
    if gamma < 1.0:
        out += (1.0 - gamma) * common.to(grads.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# S-FedPG step-size line search (Algorithm 1)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LineSearchResult:
    """eta: the chosen step. trials: oracle calls made (each one exchange of losses with the round's
    clients). rule: "armijo" (Eq. 6 held for every client and F), "mean_loss" (relaxed Eq. 7: the
    largest tried η that lowered the mean loss) or "best_seen" (no tried η lowered it: the one with the
    lowest mean loss). losses: the clients' losses at w + eta·d (from the oracle call that tried it).
    tried: (η, mean loss) of every call, in call order."""

    eta: float
    trials: int
    rule: str
    losses: Tensor
    tried: tuple[tuple[float, float], ...]


def line_search_candidates(eta: float, s: int, sigma: float, prev_all_present: bool) -> list[float]:
    """Algorithm 1's trial steps: η_ub = 2^s η (η_ub = η when a client of the previous round is
    absent now), halved while ≥ η_lb = (1/2)^s η / σ. If η_lb > η_ub (σ < 4^−s, or < 2^−s with an
    absent client) the loop of Algorithm 1 would not run at all; η_ub alone is tried then."""
    upper = eta * (2.0**s if prev_all_present else 1.0)
    lower = eta * 0.5**s / sigma
    out = [upper]
    while out[-1] / 2.0 >= lower * (1.0 - 1e-12):  # powers of two are exact; the slack absorbs /σ
        out.append(out[-1] / 2.0)
    return out


def armijo_line_search(
    losses_at: Callable[[float], Tensor],
    *,
    eta: float,
    s: int,
    beta: float,
    sigma: float,
    prev_all_present: bool,
    losses: Tensor,
    slopes: Tensor,
    fairness_slope: float | None = None,
) -> LineSearchResult:
    """S-FedPG's step-size search (paper, appendix A.2, Algorithm 1), over an oracle.

    losses_at(η) -> (m,) the round's clients' losses L_i(w + η d) (one exchange with the clients).
    eta: the current step η (the configured, possibly decayed, learning rate). s ≥ 0: the search
    window exponent. beta ∈ (0, 1): the Armijo constant. sigma > 0: σ = ‖d_r‖/‖d‖ of the main paper
    (scales η_lb). prev_all_present: S^{t−1} ⊆ S^t (else η_ub = η). losses: L_i(w) (m,).
    slopes: g_i · d (m,) (CommonDirectionInfo.slopes[:m]). fairness_slope: ∇F · d, or None when F is
    not among the objectives (then Eq. 6 is checked on the clients only).

    Candidates from η_ub down by halving to η_lb (:func:`line_search_candidates`); the first with
    L_i(w + ηd) ≤ L_i(w) + βη g_i·d for every i and F(w + ηd) ≤ F(w) + βη ∇F·d is taken ("armijo").
    Otherwise the largest tried η with mean_i L_i(w + ηd) < mean_i L_i(w) ("mean_loss"), otherwise the
    tried η with the lowest mean loss, even if it does not lower it ("best_seen", as the paper does).
    Non-finite losses fail every test and rank last (ties keep the smaller η).
    """
    require(eta > 0 and math.isfinite(eta), "line_search.eta", f"must be a positive number, got {eta}")
    require(isinstance(s, int) and s >= 0, "line_search.s", f"must be an integer ≥ 0, got {s}")
    require(0.0 < beta < 1.0, "line_search.beta", f"must lie in (0, 1), got {beta}")
    require(sigma > 0 and math.isfinite(sigma), "line_search.sigma", f"must be a positive number, got {sigma}")
    # The losses' device holds the search: the slopes and every oracle answer are brought to it (an
    # oracle may build its answer from numbers on the host).
    l0 = losses.detach().to(torch.float64).reshape(-1)
    sl = slopes.detach().to(l0).reshape(-1)
    require(l0.numel() >= 1 and sl.numel() == l0.numel(), "line_search.slopes", "one slope g_i·d per client loss")
    require(bool(torch.isfinite(l0).all()), "line_search.losses", "contains NaN or inf")
    f0 = fairness_value(l0) if fairness_slope is not None else 0.0
    mean0 = float(l0.mean())

    tried: list[tuple[float, float]] = []
    seen: list[tuple[float, Tensor]] = []
    for step in line_search_candidates(eta, s, sigma, prev_all_present):
        new = losses_at(step).detach().to(l0).reshape(-1)
        require(
            new.numel() == l0.numel(), "line_search.losses_at", f"must return {l0.numel()} losses, got {new.numel()}"
        )
        finite = bool(torch.isfinite(new).all())
        mean = float(new.mean()) if finite else math.inf
        tried.append((step, mean))
        seen.append((step, new))
        if finite and _armijo_holds(new, l0, sl, f0, fairness_slope, beta * step):
            return LineSearchResult(step, len(tried), "armijo", new.to(losses.dtype), tuple(tried))
    lowered = [i for i, (_, mean) in enumerate(tried) if mean < mean0]
    if lowered:
        pick, rule = max(lowered, key=lambda i: tried[i][0]), "mean_loss"
    else:
        pick, rule = min(range(len(tried)), key=lambda i: (tried[i][1], tried[i][0])), "best_seen"
    return LineSearchResult(tried[pick][0], len(tried), rule, seen[pick][1].to(losses.dtype), tuple(tried))


def _armijo_holds(
    new: Tensor, l0: Tensor, slopes: Tensor, f0: float, fairness_slope: float | None, scale: float
) -> bool:
    """Eq. (6) with scale = βη: every client, then F (skipped when F is not an objective, or when every
    loss is 0, where F is undefined and every client is at its minimum)."""
    if not bool((new <= l0 + scale * slopes).all()):
        return False
    return fairness_slope is None or not bool(new.any()) or fairness_value(new) <= f0 + scale * fairness_slope
