"""FedPG and S-FedPG ("Preserving Global Performance in Personalized FL", appendix A,
Algorithm 1). The math is in pfl.optim.descent / pfl.optim.minnorm and docs/fedpg.md; this module is
the federated method: what clients send, what the server solves, where P-models live.

The authors have published no complete implementation. The ``*_official`` configs follow their
partial code where it goes beyond the text (Q's auxiliary rows rescaled to the mean client-gradient
norm; absent clients' gradients kept as history rows); every other choice the text leaves open is
documented in docs/fedpg.md ("The federated method").
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload, weighted_mean
from pfl.methods.costs import SCALAR_BYTES
from pfl.methods.registry import register
from pfl.optim.descent import (
    CommonDirectionInfo,
    armijo_line_search,
    common_direction,
    fairness_gradient,
    personal_directions,
)

# A slope g·d counts as a conflict only above this share of ‖g‖‖d‖ (the solver's round-off is ~1e-12).
CONFLICT_REL_TOL = 1e-7
Solver = Literal["auto", "cvxopt", "frank_wolfe", "pgd"]  # pfl.optim.minnorm.SOLVERS
Rescale = Literal["none", "mean", "median"]  # pfl.optim.descent.RESCALES


class Solved(NamedTuple):
    """A round's solve, what choosing the step along the common direction ``d`` looks at."""

    uploads: dict[int, Upload]
    cids: list[int]  # the clients whose uploads are finite, sorted
    losses: Tensor  # their uploaded L_i(w), float64
    d: Tensor
    info: CommonDirectionInfo


@register
class FedPG(Method):
    """FedPG: the G-model moves along a common descent direction of the sampled clients' losses, the
    fairness objective F = −cos(L, 1) and (``history``) the stored gradients of absent clients; each
    client's P-model moves from the same G-model along a personalized direction that conflicts with
    no other client.

    Round t, sampled clients S (sorted by id), global model w:

    1. Client i ∈ S receives w, computes L_i = its mean train loss at w (eval mode, one forward pass
       over its train split, before training: F's gradient needs the losses at the point the
       gradients are taken), trains ``client.epochs`` from w to w_i and uploads (w_i, L_i). The
       server forms g_i = w − w_i (parameters only): uploading w_i instead of g_i costs the same
       bytes and lets the generic conflict metric and ``eval.pm_source: local_update`` see w_i.
    2. ∇F = Σ_i h_i g_i (``fairness``; h from the losses, docs/fedpg.md). Rows
       Q = [g_i (i ∈ S), ∇F, stored g_j of absent clients (``history``, at most ``history_max_age``
       rounds old)], ``rescale``d: ∇F and the history rows to the median client-gradient norm (pfl's
       default), the mean (authors' partial code) or not at all (``none``: Q as printed, which stalls:
       at nearly equal losses ∇F ≈ 0 and the min-norm d ≈ 0; docs/fedpg.md).
    3. λ = argmin_{λ∈Δ} ‖Qᵀλ‖² (cvxopt), d = −Qᵀλ: q·d ≤ −‖d‖² ≤ 0 for every row (Lemma 1).
    4. w ← w + η_t d on the parameters, η_t = ``server_lr`` · ``lr_decay``^t (S-FedPG: η_t from the
       line search). Float buffers (BatchNorm statistics) are the sample-weighted mean of the uploads.
    5. History: the stored gradient of every i ∈ S becomes g_i (absent clients keep theirs).
    6. P-models (``gamma`` > 0): d_i = (1 − γ)d + γ·Π_{C_i}(−g_i) for i ∈ S, C_i = {x : q·x ≤ 0 for
       every other client row q of Q (sampled and history)}, and P-model_i = w + η_p d_i with
       η_p = ``personal_lr`` (None: η_t, so γ = 0 gives P-model = G-model). It is stored on the server
       (``state["personal"][i]``, one vector per client that has taken part) and refreshed whenever i
       takes part; the server sends d_i to client i (counted: P numbers down per sampled client). With
       ``gamma`` = 0 the P-model is the current G-model itself (the paper's FedPG rows).

    Step size: the paper's η ∈ {0.01, 0.05, 0.1} with decay 0.999 is the learning rate of every
    method; with pseudo-gradients it is the clients' (``client.lr``, ``client.lr_decay``), and g_i
    already carries it, so the server applies d with ``server_lr`` = 1 (with one client FedPG is then
    FedAvg: w ← w_1). ``lr_decay`` < 1 decays the server step on top (e.g. for true-gradient clients
    with ``client.epochs`` small); setting both decays twice.

    Args:
        server_lr: η, the server step along d.
        lr_decay: η_t = η · lr_decay^t.
        fairness: include ∇F (False: the clients' losses only; ablation).
        history: include the stored gradients of clients absent this round (False: ablation).
        history_max_age: drop a stored gradient more than this many rounds old (None: keep it
            forever, as the paper and the authors' code do).
        rescale: the norm ∇F and the history rows are rescaled to: median | mean | none
            (pfl.optim.descent.RESCALES).
        gamma: personalization γ ∈ [0, 1] of the P-models (0: P-model = G-model).
        personal_lr: η_p of the P-models (None: the G-model's step η_t).
        solver: min-norm solver (auto | cvxopt | frank_wolfe | pgd; pfl.optim.minnorm).
    """

    name = "fedpg"
    description = "common descent direction of all clients + fairness (min-norm, cvxopt); non-conflicting P-models"
    has_personal_model = True
    uploads_gradients = True  # attacks in "auto" space perturb the pseudo-gradient w − w_i
    averages_uploads = False  # a common descent direction of pseudo-gradients

    def __init__(
        self,
        server_lr: float = 1.0,
        lr_decay: float = 1.0,
        fairness: bool = True,
        history: bool = True,
        rescale: Rescale = "median",
        gamma: float = 0.0,
        personal_lr: float | None = None,
        solver: Solver = "auto",
        history_max_age: int | None = None,
    ):
        require(0 < server_lr < math.inf, "method.server_lr", f"must be a finite number > 0 (got {server_lr})")
        require(0 < lr_decay <= 1, "method.lr_decay", f"must be in (0, 1] (got {lr_decay})")
        require(0 <= gamma <= 1, "method.gamma", f"must be in [0, 1] (got {gamma})", "γ > 1 leaves the cone")
        require(personal_lr is None or personal_lr > 0, "method.personal_lr", "must be > 0, or null for the G-step")
        require(
            history_max_age is None or (isinstance(history_max_age, int) and history_max_age >= 1),
            "method.history_max_age",
            f"must be an integer >= 1, or null to keep every stored gradient (got {history_max_age!r})",
        )
        self.history_max_age = history_max_age
        self.server_lr, self.lr_decay = server_lr, lr_decay
        self.fairness, self.history, self.rescale = fairness, history, rescale
        self.gamma, self.personal_lr, self.solver = gamma, personal_lr, solver

    # -- server ---------------------------------------------------------------------------------
    def init_server(self, server: ServerContext) -> State:
        state: State = {"global": server.init_state.clone(), "history": {}, "stats": {}}
        state["history_round"] = {}  # the round each stored gradient was uploaded in
        if self.gamma > 0:
            state["personal"] = {}
        return state

    def step_size(self, server: ServerContext) -> float:
        """η_t = server_lr · lr_decay^t."""
        return self.server_lr * self.lr_decay**server.round

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        cids = [c for c in sorted(uploads) if bool(torch.isfinite(uploads[c].state).all())]
        dropped = len(uploads) - len(cids)  # a diverged client (NaN/inf upload) is treated as absent
        if not cids:
            server["stats"] = {"dropped_nonfinite": dropped}
            return
        w = server["global"]
        p = server.layout.num_params
        with server.timed("solve"):
            grads = torch.stack([w[:p] - uploads[c].state[:p] for c in cids])
            losses = torch.cat([uploads[c]["loss"].reshape(-1) for c in cids]).to(torch.float64)
            fairness_row = None
            if self.fairness and bool(torch.isfinite(losses).all()) and float(losses.norm()) > 0:
                fairness_row = fairness_gradient(losses, grads)
            if self.history_max_age is not None:
                self.forget_stale(server)
            absent = [c for c in sorted(server["history"]) if c not in uploads] if self.history else []
            history = torch.stack([server["history"][c].to(grads) for c in absent]) if absent else None
            d, lam, info = common_direction(grads, fairness_row, history, self.rescale, solver=self.solver)
            conflicts = count_conflicts(info.slopes, [grads, fairness_row, history], info.norm_sq)
        eta, search = self.choose_step(server, Solved(uploads, cids, losses, d, info))
        with server.timed("solve"):
            new = w.clone()
            new[:p] += eta * d
            if server.layout.num_buffers:
                new[p:] = weighted_mean([uploads[c].state[p:] for c in cids], [uploads[c].weight for c in cids])
            if self.gamma > 0:
                rows = grads if history is None else torch.cat([grads, history])
                directions = personal_directions(
                    rows, self.gamma, common=d, solver=self.solver, clients=list(range(len(cids)))
                )
                eta_p = self.personal_lr if self.personal_lr is not None else eta
                for i, cid in enumerate(cids):
                    pm = new.clone()  # the G-model's buffers
                    pm[:p] = w[:p] + eta_p * directions[i]
                    server["personal"][cid] = pm
                server.count_bytes(down=len(cids) * p * w.element_size())  # d_i to each sampled client
            if self.history:
                for i, cid in enumerate(cids):
                    server["history"][cid] = grads[i].clone()
                    server["history_round"][cid] = server.round
            server["global"] = new
            server["lambda"] = lam  # over [client rows (sorted ids), ∇F, history rows (sorted ids)]
        server["stats"] = self.round_stats(lam, info, eta, conflicts, dropped, fairness_row is not None, search)

    def forget_stale(self, server: ServerContext) -> None:
        """Drop the stored gradients uploaded more than ``history_max_age`` rounds ago."""
        stale = [c for c, r in server["history_round"].items() if server.round - r > self.history_max_age]
        for c in stale:
            del server["history"][c], server["history_round"][c]

    def choose_step(self, server: ServerContext, solved: Solved) -> tuple[float, dict[str, Any]]:
        """The step along d and what the search did (FedPG: the decayed ``server_lr``, no search)."""
        return self.step_size(server), {}

    def round_stats(
        self,
        lam: Tensor,
        info: CommonDirectionInfo,
        eta: float,
        conflicts: int,
        dropped: int,
        with_fairness: bool,
        search: dict[str, Any],
    ) -> dict[str, Any]:
        """Deterministic per-round quantities (kept in the server state, so a resumed run reports them)."""
        m = info.num_clients
        stats: dict[str, Any] = {
            "step": float(eta),
            "d_norm": math.sqrt(max(info.norm_sq, 0.0)),
            "lambda_clients": float(lam[:m].sum()),
            "lambda_fairness": float(lam[m]) if with_fairness else 0.0,
            "lambda_history": float(lam[m + int(with_fairness) :].sum()),
            "history_rows": info.num_history,
            "conflicts": conflicts,
            "solver_gap": float(info.gap),
            "dropped_nonfinite": dropped,
        }
        stats.update(search)
        return stats

    def metrics(self, server: ServerContext) -> dict[str, float]:
        """The round's statistics, and the seconds per round of the solve, the clients' local updates
        and (S-FedPG) the line search."""
        out = {f"{self.name}.{k}": float(v) for k, v in server.get("stats", {}).items()}
        return out | super().metrics(server)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        if self.gamma > 0 and client.cid in server["personal"]:
            return server["personal"][client.cid]
        return server["global"]

    # -- client ---------------------------------------------------------------------------------
    def local_update(self, client: ClientContext, payload: State) -> Upload:
        w = payload["global"]
        with self.timed("client"):
            loss = client.evaluate(w, "train").loss  # L_i(w): the loss F and the line search compare against
            trained = client.fit(w)
        return Upload(trained, client.num_samples, {"loss": torch.tensor([loss], device=w.device)})


def count_conflicts(slopes: Tensor, parts: list[Tensor | None], norm_sq: float) -> int:
    """Rows q of Q (client rows, ∇F, history, in that order; None parts skipped) with q·d > tol·‖q‖‖d‖:
    0 for a correct solve (Lemma 1), reported as a check. ``slopes`` = q·d from the solve."""
    norms = torch.cat([t.reshape(-1, t.shape[-1]).to(torch.float64).norm(dim=1) for t in parts if t is not None])
    bound = CONFLICT_REL_TOL * norms.to(slopes.device) * math.sqrt(max(norm_sq, 0.0))
    return int((slopes > bound).sum())


@register
class SFedPG(FedPG):
    """S-FedPG: FedPG whose step η_t comes from Algorithm 1's line search (docs/fedpg.md) instead of the
    decayed learning rate.

    The oracle L_i(w + ηd): the server sends d once to every sampled client (P numbers each), then per
    trial the candidate η (one number); client i answers its mean train loss at w + ηd (one number),
    evaluated exactly like the L_i(w) it uploaded (eval mode, whole train split). Every trial's bytes
    go into the communication metrics. In the simulation the server asks through
    ``ServerContext.ask_loss(cid, state)``, which evaluates that client on its train split and counts
    the exchange's bytes.

    Inputs of the search: η = ``server_lr`` · ``lr_decay``^t (the step it searches around; the accepted
    η_t is not carried to the next round), s, β, σ (σ = ‖d_r‖/‖d‖ is defined in the main paper, which
    is not available: a constant here), S^{t−1} ⊆ S^t from the previous round's sampled ids, the
    uploaded losses and the slopes g_i·d, ∇F·d from the solve (the F condition only when ∇F is a row).

    Args (besides FedPG's):
        s: search window exponent: η_ub = 2^s η, η_lb = η / (2^s σ) (the paper suggests s = 1).
        beta: Armijo constant β ∈ (0, 1).
        sigma: σ > 0.
    """

    name = "sfedpg"
    description = "FedPG with Algorithm 1's Armijo step-size line search (losses at trial steps counted in comm)"

    def __init__(self, s: int = 1, beta: float = 1e-4, sigma: float = 1.0, **kwargs: Any):
        super().__init__(**kwargs)  # FedPG's options
        require(isinstance(s, int) and s >= 0, "method.s", f"must be an integer >= 0 (got {s})")
        require(0 < beta < 1, "method.beta", f"must be in (0, 1) (got {beta})")
        require(0 < sigma < math.inf, "method.sigma", f"must be a finite number > 0 (got {sigma})")
        self.s, self.beta, self.sigma = s, beta, sigma

    def init_server(self, server: ServerContext) -> State:
        state = super().init_server(server)
        state["trials_total"] = 0
        state["armijo_rounds"] = 0
        return state

    def choose_step(self, server: ServerContext, solved: Solved) -> tuple[float, dict[str, Any]]:
        with server.timed("search"):  # mostly the sampled clients evaluating their loss at each trial
            return self.line_search(server, solved)

    def line_search(self, server: ServerContext, solved: Solved) -> tuple[float, dict[str, Any]]:
        """Algorithm 1's search along d; each trial asks every sampled client for its loss."""
        uploads, cids, losses, d, info = solved
        w = server["global"]
        p = server.layout.num_params
        candidate = w.clone()
        if server.layout.num_buffers:
            candidate[p:] = weighted_mean([uploads[c].state[p:] for c in cids], [uploads[c].weight for c in cids])
        server.count_bytes(down=len(cids) * p * w.element_size())  # d once to each sampled client

        def losses_at(eta: float) -> Tensor:  # η down and one loss up per client
            candidate[:p] = w[:p] + eta * d
            answers = [server.ask_loss(cid, candidate, sent=SCALAR_BYTES) for cid in cids]
            return torch.tensor(answers, dtype=torch.float64, device=losses.device)  # beside the uploaded ones

        previous = server.get("previous_ids")
        prev_all_present = previous is None or set(previous.tolist()) <= set(cids)
        m = len(cids)
        fairness_slope = float(info.slopes[m]) if info.has_fairness else None
        result = armijo_line_search(
            losses_at,
            eta=self.step_size(server),
            s=self.s,
            beta=self.beta,
            sigma=self.sigma,
            prev_all_present=prev_all_present,
            losses=losses,
            slopes=info.slopes[:m],
            fairness_slope=fairness_slope,
        )
        server["previous_ids"] = torch.tensor(cids, dtype=torch.long)
        server["trials_total"] += result.trials
        server["armijo_rounds"] += int(result.rule == "armijo")
        rule = {"armijo": 0, "mean_loss": 1, "best_seen": 2}[result.rule]
        return result.eta, {
            "trials": result.trials,
            "rule": rule,
            "trials_total": server["trials_total"],
            "armijo_rounds": server["armijo_rounds"],
        }
