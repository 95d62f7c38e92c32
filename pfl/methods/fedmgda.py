"""FedMGDA+ (Hu, Shaloudegi, Zhang & Yu, "Federated learning meets multi-objective optimization",
IEEE TNSE 2022): MGDA on the clients' normalised updates with the weights kept near FedAvg's."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload, weighted_mean
from pfl.methods.registry import register
from pfl.optim.capped_simplex import box_around, min_norm_capped
from pfl.optim.minnorm import gram_matrix

Center = Literal["samples", "uniform"]  # FedMGDA+'s λ⁰: FedAvg's sample weights (paper) or 1/m
Solver = Literal["auto", "cvxopt", "pgd"]  # pfl.optim.capped_simplex.SOLVERS


@register
class FedMGDAPlus(Method):
    """FedMGDA+: each sampled client trains from w and uploads w_i; the server forms the
    pseudo-gradients g_i = w − w_i, normalises them (ĝ_i = g_i/‖g_i‖, ``normalize``), solves

        λ = argmin ‖Σ_i λ_i ĝ_i‖²  s.t.  λ ∈ Δ_m,  ‖λ − λ⁰‖∞ ≤ ε

    (a QP in the m×m Gram space, cvxopt; pfl.optim.capped_simplex) and steps w ← w − η_t Σ_i λ_i ĝ_i,
    η_t = ``server_lr`` · ``lr_decay``^t. Float buffers are the sample-weighted mean of the uploads.
    ε ≥ 1 is MGDA's min-norm point (a common descent direction); ε = 0 is FedAvg on normalised
    updates. λ⁰ (``center``) is FedAvg's weights, the sampled clients' shares of their samples
    n_i / Σ_j n_j (the paper's definition), or uniform 1/m (an option; with equal sizes they agree).

    FedPG's appendix notes that ε = 0.1, FedMGDA+'s usual value, often fails to give a common descent
    direction: ``fedmgda_plus.conflicts`` counts the sampled clients with g_i·Δ > 0 for the applied
    step Δ in the last round and ``fedmgda_plus.conflict_rounds`` the share of rounds so far with at
    least one (``conflict.fraction``, reported for every method, is the per-client share).

    Args:
        epsilon: ε, the half-width of the box around λ⁰.
        center: λ⁰: samples (n_i / Σ n_j, the paper) | uniform (1/m).
        server_lr: η, the global step along the combined normalised update.
        lr_decay: η_t = η · lr_decay^t.
        normalize: normalise each update to unit norm before the solve (the paper); False: raw updates.
        solver: auto | cvxopt | pgd (projected gradient on the capped simplex).
    """

    name = "fedmgda_plus"
    description = "MGDA on normalised client updates, weights within epsilon of FedAvg's (cvxopt QP)"
    has_personal_model = False
    uploads_gradients = True  # attacks in "auto" space perturb the pseudo-gradient w − w_i
    averages_uploads = False  # a min-norm combination of normalised updates

    def __init__(
        self,
        epsilon: float = 0.1,
        server_lr: float = 1.0,
        lr_decay: float = 1.0,
        normalize: bool = True,
        solver: Solver = "auto",
        center: Center = "samples",
    ):
        require(epsilon >= 0, "method.epsilon", f"must be >= 0 (got {epsilon})")
        require(0 < server_lr < math.inf, "method.server_lr", f"must be a finite number > 0 (got {server_lr})")
        require(0 < lr_decay <= 1, "method.lr_decay", f"must be in (0, 1] (got {lr_decay})")
        self.epsilon, self.server_lr, self.lr_decay = epsilon, server_lr, lr_decay
        self.normalize, self.solver, self.center = normalize, solver, center

    def init_server(self, server: ServerContext) -> State:
        return {"global": server.init_state.clone(), "stats": {}, "rounds": 0, "conflict_rounds": 0}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        return Upload(client.fit(payload["global"]), client.num_samples)

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        w = server["global"]
        p = server.layout.num_params
        cids = sorted(uploads)
        grads = torch.stack([w[:p] - uploads[c].state[:p] for c in cids])
        rows = grads
        if self.normalize:
            norms = grads.to(torch.float64).norm(dim=1)
            rows = grads / torch.where(norms > 0, norms, torch.ones_like(norms)).to(grads.dtype)[:, None]
        m = len(cids)
        if self.center == "samples":
            sizes = np.array([uploads[c].weight for c in cids], dtype=np.float64)
            center = sizes / sizes.sum()
        else:
            center = np.full(m, 1.0 / m)
        lower, upper = box_around(center, self.epsilon)
        result = min_norm_capped(gram_matrix(rows), lower, upper, solver=self.solver)
        lam = result.weights
        step = -(self.server_lr * self.lr_decay**server.round) * (lam.to(rows.device, rows.dtype) @ rows)
        new = w.clone()
        new[:p] += step
        if server.layout.num_buffers:
            new[p:] = weighted_mean([uploads[c].state[p:] for c in cids], [uploads[c].weight for c in cids])
        server["global"] = new
        server["lambda"] = lam
        dots = grads.to(torch.float64) @ step.to(torch.float64)
        conflicts = int((dots > 0).sum()) if bool(step.any()) else 0
        server["rounds"] += 1
        server["conflict_rounds"] += int(conflicts > 0)
        server["stats"] = {
            "conflicts": conflicts,
            "conflict_rounds": server["conflict_rounds"] / server["rounds"],
            "lambda_max": float(lam.max()),
            "step_norm": float(step.to(torch.float64).norm()),
            "solver_gap": result.gap,
        }

    def metrics(self, server: ServerContext) -> dict[str, float]:
        return {f"{self.name}.{k}": float(v) for k, v in server.get("stats", {}).items()}
