"""FedORA's reusable math: client subspaces, client similarity, parameter propagation, selective λ.

Wu et al., "Personalized Federated Learning with Parameter Propagation" (KDD'23): Eqs. (4)-(8),
Lemmas 4.1-4.2, Algorithm 2. Pure tensor functions; the paper's formulas are the defaults and the
authors' code (junwu6/FEDORA, ``main_fedora.py``) is reachable through options. docs/fedora.md has
the derivations, the paper-vs-code list and the measured cost at K = 1000, P = 10^6.

Conventions: a client's basis is a (D, p) tensor with orthonormal columns spanning the top-p
directions of its samples in feature space R^D; K bases are stacked as (K, D, p). Similarities are
(K, K) float64 with w[k, k'] the similarity of client k to client k' (row k = client k's view).
The stacked client parameters Θ are a (K, P) tensor, one flat parameter vector per row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pfl.errors import require

PAPER_ALPHA = 1.0  # α of Eq. (1) used in all of the paper's experiments (κ = 1/2)
OFFICIAL_KAPPA = 0.8  # the authors' code's "pa": κ = 0.8 directly, i.e. α = κ/(1−κ) = 4
PAPER_EPS = 1e-8  # ε of Eq. (8)
SIMILARITY_KINDS = ("subspace", "random", "parameter", "gradient", "identity", "uniform")
LAMBDA_RULES = ("paper", "official")

_F64 = torch.float64
_GRAM_CHUNK = 1 << 16  # columns per float64 block when forming K x K Gram matrices of (K, P) inputs


# ---------------------------------------------------------------------------------------------
# Client subspaces and the principal-angle similarity (Eqs. 4-5)
# ---------------------------------------------------------------------------------------------


def subspace_basis(
    x: Tensor,
    y: Tensor | None,
    num_classes: int,
    p: int = 1,
    *,
    center: bool = False,
    label_scale: float = 1.0,
) -> Tensor:
    """Top-p orthonormal basis (D, p) of the span of a client's samples in feature space.

    The data matrix A (n, D) has one row per sample: the flattened features, then the one-hot label
    times ``label_scale`` when ``y`` is given ([x, onehot(y)], D = D_x + num_classes, the paper's
    X_k ∘ Y_k), else the features alone (D = D_x: unlabeled clients, and the covariate-shift
    similarity of Section 4.3 that every client must then use so the bases are comparable).
    With A = U Σ Vᵀ the basis is V[:, :p], the paper's U_k (it writes the D x n matrix, whose left
    singular vectors these are; the authors' code takes ``svd_lowrank(A.T, q=1)``'s U, the same up
    to the randomised solver's error: here the SVD is exact, in float64).

    Not centred by default, as in the paper (truncated SVD of X_k ∘ Y_k) and its code: the top
    direction then carries the client's mean sample, and in the label block its class frequencies,
    which is what distinguishes Pat-k label skew; centring would remove exactly that.
    ``center=True`` gives the PCA subspace instead.
    Each column's sign is fixed (largest-magnitude entry positive) so the output is reproducible;
    the similarity does not depend on it.
    """
    require(
        x.ndim >= 2 and x.shape[0] >= 1, "fedora.subspace.x", f"needs shape (n, d...) with n >= 1, got {tuple(x.shape)}"
    )
    require(x.is_floating_point(), "fedora.subspace.x", f"must be a floating tensor, got {x.dtype}")
    n = x.shape[0]
    a = x.reshape(n, -1).to(_F64)
    if y is not None:
        require(y.shape == (n,), "fedora.subspace.y", f"needs shape ({n},) to match x, got {tuple(y.shape)}")
        require(num_classes >= 1, "fedora.subspace.num_classes", f"must be >= 1 (got {num_classes})")
        require(
            bool(((y >= 0) & (y < num_classes)).all()),
            "fedora.subspace.y",
            f"labels must lie in [0, {num_classes})",
            "pass the dataset's num_classes",
        )
        onehot = F.one_hot(y.long(), num_classes).to(_F64) * label_scale
        a = torch.cat([a, onehot], dim=1)
    require(
        1 <= p <= min(a.shape),
        "fedora.subspace.p",
        f"must be in [1, min(n, D)] = [1, {min(a.shape)}] (got {p})",
        "use fewer directions or more samples",
    )
    if center:
        a = a - a.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(a, full_matrices=False)
    rank_tol = s[0] * max(a.shape) * torch.finfo(x.dtype).eps  # numpy's matrix_rank rule, in x's precision
    require(
        bool(s[0] > 0) and bool(s[p - 1] > rank_tol),
        "fedora.subspace.p",
        f"the data matrix has rank < p = {p}: its top-p subspace is not defined",
        "use a smaller p (or center=False)",
    )
    basis = vh[:p].T.contiguous()
    cols = torch.arange(p)
    signs = torch.sign(basis[basis.abs().argmax(dim=0), cols])
    return basis * torch.where(signs == 0, 1.0, signs)


def _check_bases(u: Tensor, field: str) -> Tensor:
    require(u.ndim == 3, field, f"needs shape (K, D, p), got {tuple(u.shape)}", "stack subspace_basis outputs")
    u = u.to(_F64)
    gram = u.transpose(1, 2) @ u
    eye = torch.eye(u.shape[2], dtype=_F64)
    require(
        bool(torch.isfinite(u).all()) and bool(((gram - eye).abs() <= 1e-4).all()),
        field,
        "every basis needs orthonormal columns",
        "use subspace_basis",
    )
    return u


def principal_angle_similarity(bases: Tensor, others: Tensor | None = None, *, row_chunk: int = 256) -> Tensor:
    """Eq. (4): w[k, k'] = Σ_i cos ζ_i = sum of the singular values of U_kᵀ U_k' (Eq. 5).

    ``bases`` (K, D, p); ``others`` (K', D, q), default ``bases``: returns (K, K') float64, symmetric
    when ``others`` is None. In [0, min(p, q)]: min(p, q) for nested/identical subspaces (so the
    diagonal is p, the paper's self-similarity; the authors' code never forms it, see
    ``official_similarity``), 0 for orthogonal ones. Depends only on the spans, not on the bases
    chosen for them. ``others`` serves new clients (their bases against the trained clients').
    """
    u = _check_bases(bases, "fedora.similarity.bases")
    v = u if others is None else _check_bases(others, "fedora.similarity.others")
    require(
        u.shape[1] == v.shape[1],
        "fedora.similarity.others",
        f"feature dimension {v.shape[1]} differs from the bases' {u.shape[1]}",
        "compute every basis with the same features and the same use of labels",
    )
    if u.shape[2] == 1 and v.shape[2] == 1:  # p = 1 (the paper's setting): |cos| of the two directions
        return (u[:, :, 0] @ v[:, :, 0].T).abs().clamp_(max=1.0)
    out = torch.empty(u.shape[0], v.shape[0], dtype=_F64)
    for s in range(0, u.shape[0], row_chunk):
        block = torch.einsum("adp,bdq->abpq", u[s : s + row_chunk], v)  # U_kᵀ U_k' for a block of rows
        out[s : s + row_chunk] = torch.linalg.svdvals(block).clamp_(max=1.0).sum(dim=-1)
    return out


def official_similarity(
    similarity_or_bases: Tensor, *, top_k: int = 2, temperature: float = 10.0, cross: bool = False
) -> Tensor:
    """The authors' code's graph: exp(10·‖cos‖₁), the top-2 neighbours of each row, row-normalised.

    Input: bases (K, D, p) or a principal-angle similarity (K, K) (‖cos‖₁ = Σ cos ζ_i = w of Eq. 4,
    as the cosines are singular values, hence non-negative). Returns a row-stochastic (K, K) float64.
    Self-edges: the code fills only k ≠ k' and leaves the diagonal 0, so a client is never its own
    neighbour; the top-k are the k most similar *other* clients (if K−1 < k, all others). Each kept
    edge gets exp(t·w) / Σ_kept exp(t·w) (computed as a softmax over the kept entries, which avoids
    overflow; equal to the code's exp-then-normalise). The result is not symmetric (k may be among
    k''s top-2 and not the reverse), as in the code. Ties: torch.topk's choice (deterministic on CPU).
    ``cross=True``: the input is (m, K) similarities of m new clients to K trained clients; nothing is
    masked (a new client is not among the trained ones).
    Use with ``propagation_matrix(W, kappa=OFFICIAL_KAPPA)``.
    """
    w = similarity_or_bases
    if w.ndim == 3:
        require(not cross, "fedora.official.cross", "cross=True needs a (m, K) similarity, not bases")
        w = principal_angle_similarity(w)
    require(w.ndim == 2, "fedora.official", f"needs bases (K, D, p) or a similarity (K, K), got {tuple(w.shape)}")
    w = w.to(_F64)
    require(bool(torch.isfinite(w).all()), "fedora.official", "similarity has non-finite entries")
    require(top_k >= 1, "fedora.official.top_k", f"must be >= 1 (got {top_k})")
    logits = temperature * w
    candidates = w.shape[1]
    if not cross:
        require(w.shape[0] == w.shape[1], "fedora.official", f"needs a square similarity, got {tuple(w.shape)}")
        require(w.shape[0] >= 2, "fedora.official", "needs at least 2 clients (a client is never its own neighbour)")
        logits = logits.clone()
        logits.fill_diagonal_(-math.inf)
        candidates -= 1
    kept = logits.topk(min(top_k, candidates), dim=1)
    out = torch.zeros_like(w)
    out.scatter_(1, kept.indices, torch.softmax(kept.values, dim=1))
    return out


# ---------------------------------------------------------------------------------------------
# Similarities for the ablation (Table 4)
# ---------------------------------------------------------------------------------------------


def _clipped_cosine(v: Tensor, field: str) -> Tensor:
    """max(0, cos) of the rows of v (K, P), diagonal 1; the Gram matrix in float64 column blocks so a
    float32 (K, P) store is never copied whole. A zero row has cosine 0 with every other row."""
    require(v.ndim == 2 and v.shape[0] >= 1, field, f"needs shape (K, P), got {tuple(v.shape)}")
    require(v.is_floating_point() and bool(torch.isfinite(v).all()), field, "must be a finite floating tensor")
    k, n = v.shape
    gram = torch.zeros(k, k, dtype=_F64, device=v.device)
    for s in range(0, n, _GRAM_CHUNK):
        block = v[:, s : s + _GRAM_CHUNK].to(_F64)
        gram += block @ block.T
    norms = gram.diagonal().sqrt()
    inv = torch.where(norms > 0, 1.0 / norms, torch.zeros_like(norms))
    cos = (gram * inv[:, None] * inv[None, :]).clamp_(0.0, 1.0)
    cos.fill_diagonal_(1.0)
    return cos.cpu()


def similarity(
    kind: str,
    *,
    bases: Tensor | None = None,
    params: Tensor | None = None,
    grads: Tensor | None = None,
    generator: torch.Generator | None = None,
    num_clients: int | None = None,
    sizes: Tensor | None = None,
) -> Tensor:
    """Client similarity W (K, K) float64, non-negative, by ``kind``:

    - ``subspace`` (the paper, Eq. 4): ``principal_angle_similarity(bases)``; diagonal p.
    - ``random`` (Table 4, after FedU): symmetric, entries (R + Rᵀ)/2 with R ~ U[0, 1) from
      ``generator`` (required: same generator state, same W); diagonal 1, the top of the range, so
      every kind treats a client as most similar to itself, as the subspace similarity does.
    - ``parameter`` (Table 4, after FedAMP): max(0, cos(θ_k, θ_k')) of the flattened client
      parameters ``params`` (K, P); diagonal 1. Clients trained from one initialisation have raw
      cosines near 1 (the shared init dominates), so this kind is close to uniform early on; pass
      θ_k − θ_init in ``params`` for the update direction instead.
    - ``gradient`` (Table 4): max(0, cos) of the client gradients or updates ``grads`` (K, P).
    - ``identity``: I (Lemma 4.1, case 1: propagation returns Θ, i.e. LOCAL).
    - ``uniform``: w[k, k'] = n_k' for ``sizes`` (K,) (all ones without): Lemma 4.1, case 2 (α → ∞
      gives the n-weighted average for every client).
    K is taken from the given input; ``num_clients`` supplies it for ``random``/``identity``/``uniform``.
    """
    require(kind in SIMILARITY_KINDS, "fedora.similarity", f"unknown kind {kind!r}", f"use one of {SIMILARITY_KINDS}")
    if kind == "subspace":
        require(bases is not None, "fedora.similarity.bases", "kind 'subspace' needs bases (K, D, p)")
        return principal_angle_similarity(bases)
    if kind == "parameter":
        require(params is not None, "fedora.similarity.params", "kind 'parameter' needs params (K, P)")
        return _clipped_cosine(params, "fedora.similarity.params")
    if kind == "gradient":
        require(grads is not None, "fedora.similarity.grads", "kind 'gradient' needs grads (K, P)")
        return _clipped_cosine(grads, "fedora.similarity.grads")
    k = num_clients
    for given in (bases, params, grads, sizes):
        if k is None and given is not None:
            k = given.shape[0]
    require(k is not None and k >= 1, "fedora.similarity.num_clients", f"kind {kind!r} needs num_clients >= 1")
    if kind == "identity":
        return torch.eye(k, dtype=_F64)
    if kind == "uniform":
        if sizes is None:
            return torch.ones(k, k, dtype=_F64)
        require(
            sizes.shape == (k,) and bool((sizes > 0).all()),
            "fedora.similarity.sizes",
            f"needs ({k},) positive sample counts",
        )
        return sizes.to(_F64)[None, :].expand(k, k).clone()
    require(generator is not None, "fedora.similarity.generator", "kind 'random' needs a torch.Generator")
    r = torch.rand(k, k, generator=generator, dtype=_F64)
    w = (r + r.T) / 2
    w.fill_diagonal_(1.0)
    return w


# ---------------------------------------------------------------------------------------------
# Parameter propagation (Lemma 4.2, Eqs. 6-7)
# ---------------------------------------------------------------------------------------------


def kappa_of(alpha: float | None = None, kappa: float | None = None) -> float:
    """κ = α/(1+α) (the paper's parametrisation, α = 1 when neither is given), or κ itself (the
    authors' code's "propagation factor", 0.8 = ``OFFICIAL_KAPPA``, i.e. α = 4)."""
    if kappa is not None:
        require(alpha is None, "fedora.alpha", "give alpha or kappa, not both")
        require(0.0 <= kappa < 1.0, "fedora.kappa", f"must be in [0, 1) (got {kappa})")
        return float(kappa)
    alpha = PAPER_ALPHA if alpha is None else alpha
    require(
        math.isfinite(alpha) and alpha >= 0,
        "fedora.alpha",
        f"must be finite and >= 0 (got {alpha})",
        "alpha → ∞ is the shared average: use a large finite alpha",
    )
    return alpha / (1.0 + alpha)


def transition_matrix(w: Tensor) -> Tensor:
    """P = D⁻¹W (float64), D = diag(row sums of W): row k is client k's averaging weights."""
    require(w.ndim == 2 and w.shape[0] == w.shape[1], "fedora.W", f"needs a square (K, K) matrix, got {tuple(w.shape)}")
    w = w.to(_F64)
    require(bool(torch.isfinite(w).all()) and bool((w >= 0).all()), "fedora.W", "entries must be finite and >= 0")
    rows = w.sum(dim=1, keepdim=True)
    require(
        bool((rows > 0).all()),
        "fedora.W",
        f"clients {torch.nonzero(rows[:, 0] <= 0).flatten().tolist()} have no similar client (row sum 0)",
        "keep the self-similarity on the diagonal",
    )
    return w / rows


def propagation_matrix(w: Tensor, alpha: float | None = None, *, kappa: float | None = None) -> Tensor:
    """M = (1−κ)(I − κD⁻¹W)⁻¹ (K, K) float64, so that Θ̂ = MΘ (Eq. 6); κ = α/(1+α), α = 1 by default.

    Solved once (torch.linalg.solve, float64), then applied by ``propagate``. Rows of M sum to 1 and
    its entries are >= 0 (M = (1−κ) Σ_m (κP)^m with P row-stochastic): θ̂_k is a convex combination of
    all clients' θ. Special cases: W = I or κ = 0 gives M = I (LOCAL); κ → 1 on a connected graph gives
    every row the stationary distribution of P (n-weighted average for w[k, k'] = n_k', Lemma 4.1).
    Eq. (6) is the fixed point of the iteration Eq. (7) for any W; it minimises Eq. (3) exactly when
    D⁻¹W is symmetric (the paper's derivation drops the transposed term of the gradient otherwise).
    The authors' code: ``propagation_matrix(official_similarity(...), kappa=OFFICIAL_KAPPA)``.
    """
    k = kappa_of(alpha, kappa)
    p = transition_matrix(w)
    eye = torch.eye(p.shape[0], dtype=_F64)
    return torch.linalg.solve(eye - k * p, (1.0 - k) * eye)


def _auto_chunk(k: int, itemsize: int) -> int:
    return max(1, (64 << 20) // (k * itemsize))  # a 64 MiB (K, chunk) buffer


def propagate(m: Tensor, theta: Tensor, out: Tensor | None = None, *, chunk: int | None = None) -> Tensor:
    """Θ̂ = MΘ for a (K, P) parameter store, in column blocks: out[:, j] depends only on theta[:, j].

    Each block is computed into one (K, chunk) buffer and copied out, so the extra memory is that
    buffer (64 MiB by default), and ``out=theta`` overwrites the store in place (no second (K, P)
    tensor). M is cast to theta's dtype (float32 store: rows of M still sum to 1 within 1e-7).
    Cost: 2K²P flops; see docs/fedora.md for K = 1000, P = 10^6.
    """
    require(m.ndim == 2 and m.shape[0] == m.shape[1], "fedora.M", f"needs a square (K, K) matrix, got {tuple(m.shape)}")
    require(
        theta.ndim == 2 and theta.shape[0] == m.shape[0],
        "fedora.theta",
        f"needs shape ({m.shape[0]}, P) to match M, got {tuple(theta.shape)}",
    )
    require(theta.is_floating_point(), "fedora.theta", f"must be a floating tensor, got {theta.dtype}")
    k, n = theta.shape
    if out is None:
        out = torch.empty_like(theta)
    require(
        out.shape == theta.shape and out.dtype == theta.dtype and out.device == theta.device,
        "fedora.out",
        "must match theta's shape, dtype and device",
    )
    chunk = _auto_chunk(k, theta.element_size()) if chunk is None else chunk
    require(chunk >= 1, "fedora.chunk", f"must be >= 1 (got {chunk})")
    mc = m.to(dtype=theta.dtype, device=theta.device)
    buf = torch.empty(k, min(chunk, n), dtype=theta.dtype, device=theta.device)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        b = buf if e - s == buf.shape[1] else torch.empty(k, e - s, dtype=theta.dtype, device=theta.device)
        torch.matmul(mc, theta[:, s:e], out=b)
        out[:, s:e].copy_(b)
    return out


def propagate_iterative(
    w: Tensor,
    theta: Tensor,
    alpha: float | None = None,
    *,
    kappa: float | None = None,
    iters: int | None = None,
    tol: float | None = None,
) -> Tensor:
    """Eq. (7): Θ̂ ← κD⁻¹WΘ̂ + (1−κ)Θ from Θ̂ = Θ, for ``iters`` steps or until max|ΔΘ̂| <= ``tol``.

    With P row-stochastic the step is a κ-contraction in the max norm, so after m steps
    max|Θ̂ − Θ̂*| <= κ^m · max|Θ − Θ̂*| and, on stopping, <= κ/(1−κ) · tol. With ``tol`` alone the
    number of steps is capped where that bound already guarantees tol. Computes in theta's dtype.
    """
    require(iters is not None or tol is not None, "fedora.iters", "give iters and/or tol")
    require(iters is None or iters >= 0, "fedora.iters", f"must be >= 0 (got {iters})")
    require(tol is None or tol > 0, "fedora.tol", f"must be > 0 (got {tol})")
    k = kappa_of(alpha, kappa)
    p = transition_matrix(w)
    require(
        theta.ndim == 2 and theta.shape[0] == p.shape[0] and theta.is_floating_point(),
        "fedora.theta",
        f"needs a floating ({p.shape[0]}, P) tensor, got {tuple(theta.shape)} {theta.dtype}",
    )
    p = p.to(dtype=theta.dtype, device=theta.device)
    cap = iters
    if cap is None:
        scale = 2.0 * float(theta.abs().max()) + 1.0
        cap = 1 if k == 0 else math.ceil(math.log(tol / scale) / math.log(k)) + 2
    base = (1.0 - k) * theta
    hat = theta.clone()
    for _ in range(cap):
        new = torch.addmm(base, p, hat, alpha=k)
        step = float((new - hat).abs().max()) if hat.numel() else 0.0
        hat = new
        if tol is not None and step <= tol:
            break
    return hat


def new_client_row(
    similarity_to_trained: Tensor,
    alpha: float | None = None,
    *,
    kappa: float | None = None,
    self_similarity: float | None = None,
) -> Tensor:
    """Propagation weights for unseen clients, given their similarity (K,) or (m, K) to the K trained clients.

    The trained clients' θ̂ stay as they are (no retraining); the new client's row of Eq. (7) is
    θ̂_new = κ(Σ_k w_k θ̂_k + w_s θ̂_new)/(S + w_s) + (1−κ) θ_new, S = Σ_k w_k, w_s = self-similarity.

    - No ``alpha``/``kappa``: the client has no parameters of its own (unlabeled: Eq. (2) without a
      data term is optimal at θ_new = θ̂_new; labeled: θ_new is only created by fine-tuning from
      θ̂_new, Algorithm 2). Substituting θ_new = θ̂_new, the fixed point is θ̂_new = Σ_k (w_k/S) θ̂_k:
      returns w / S (rows sum to 1), to apply to the trained clients' θ̂. α and w_s cancel; this is
      also the minimiser of the new client's smoothness term Σ_k w_k ‖θ̂_new − θ̂_k‖².
    - With ``alpha`` or ``kappa`` (and ``self_similarity``: p for the subspace similarity, 0 for the
      official graph): the client has its own θ_new; solving the row for θ̂_new gives weights
      κw_k/(S + w_s − κw_s) on θ̂_k and (1−κ)(S + w_s)/(S + w_s − κw_s) on θ_new: returns
      (..., K + 1), the last column for θ_new. For a client that was part of the propagation, its
      row of the full solution Θ̂ = MΘ satisfies the same equation, so this reproduces θ̂_k exactly.
    """
    w = similarity_to_trained.to(_F64)
    require(w.ndim in (1, 2) and w.shape[-1] >= 1, "fedora.new_client", f"needs (K,) or (m, K), got {tuple(w.shape)}")
    require(
        bool(torch.isfinite(w).all()) and bool((w >= 0).all()), "fedora.new_client", "entries must be finite and >= 0"
    )
    total = w.sum(dim=-1, keepdim=True)
    require(
        bool((total > 0).all()),
        "fedora.new_client",
        "a new client has zero similarity to every trained client",
        "its θ̂ is undefined: use more directions p or the global average",
    )
    if alpha is None and kappa is None:
        return w / total
    k = kappa_of(alpha, kappa)
    require(
        self_similarity is not None and self_similarity >= 0,
        "fedora.new_client.self_similarity",
        "needed (>= 0) when the new client has its own parameters",
        "p for the subspace similarity, 0 for official_similarity",
    )
    degree = total + self_similarity
    denom = degree - k * self_similarity
    return torch.cat([k * w / denom, (1.0 - k) * degree / denom], dim=-1)


# ---------------------------------------------------------------------------------------------
# Selective regularization (Eq. 8)
# ---------------------------------------------------------------------------------------------


def selective_lambda(loss_own: float, loss_prop: float, eps: float = PAPER_EPS, rule: str = "paper") -> float:
    """λ_k from the validation losses of θ_k (``loss_own``) and θ̂_k (``loss_prop``); Δ = loss_own − loss_prop,
    positive when the propagated model validates better.

    - ``paper`` (Eq. 8): λ = max(ε, Δ); ε = 1e−8 in the paper.
    - ``official`` (authors' code): λ = exp(Δ/2) if Δ >= 0 else 0 (so 1 at Δ = 0, e.g. round 0 where
      θ = θ̂; ``eps`` unused). Their Δ has the same sign (``local_loss − global_loss``) but sums the
      per-batch mean losses over the validation batches (one batch of 64 in their setting).
    """
    require(rule in LAMBDA_RULES, "fedora.lambda_rule", f"unknown rule {rule!r}", f"use one of {LAMBDA_RULES}")
    require(eps > 0, "fedora.eps", f"must be > 0 (got {eps})")
    own, prop = float(loss_own), float(loss_prop)
    if not (math.isfinite(own) and math.isfinite(prop)):
        raise ValueError(f"selective_lambda: validation losses must be finite (own {own}, propagated {prop})")
    delta = own - prop
    if rule == "paper":
        return max(eps, delta)
    return math.exp(delta / 2.0) if delta >= 0 else 0.0
