"""PGFed, PGFedMo and PGFed-CE (Luo & Wu, ICCV 2023): personalized global objectives.

Client i minimises f_i(θ_i) + μ Σ_j α_ij [f_j(θ_j) + ∇f_j(θ_j)ᵀ(θ_i − θ_j)] over the clients j of the
previous round. Its θ-gradient adds the constant auxiliary gradient g̃_i = μ Σ_j α_ij ∇f_j(θ_j) to every
batch gradient; its α-gradient is c_j + ∇f_jᵀθ_i·μ, with the scalar c_j = μ(f_j(θ_j) − ∇f_j(θ_j)ᵀθ_j)
uploaded by j and μ∇f_jᵀθ_i approximated by ḡᵀθ_i, ḡ = (μ/M) Σ_j ∇f_j(θ_j).

The α_ij are mixing weights of risks and the paper requires α_ij ≥ 0; the authors' code clips them at 0
after every step, which is the default here (``clip_alpha``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from pfl.engine.terms import Term
from pfl.errors import require
from pfl.methods.base import ClientContext, ClientOptimizerMethod, ServerContext, State, Upload, weighted_mean_of
from pfl.methods.registry import register


class AuxiliaryRisk(Term):
    """Per batch, before the optimizer step: add g̃ to the gradient and take one α step
    α_j ← α_j − η₂(c_j + ḡᵀθ) (the authors' order: θ is the pre-step model), then clip at 0 when
    ``clip``. With ``dot`` given (PGFed-CE) the server's constants replace ḡᵀθ for the whole round:
    one scalar for every j (ḡᵀθ_glob) or one per j (μ∇f_jᵀθ_glob)."""

    def __init__(
        self,
        aux: Tensor,
        c: Tensor,
        alpha: Tensor,
        eta2: float,
        *,
        gbar: Tensor | None = None,
        dot: Tensor | None = None,
        clip: bool = False,
    ):
        if (gbar is None) == (dot is None):
            raise ValueError("give exactly one of gbar (PGFed) and dot (PGFed-CE)")
        self.aux, self.c, self.alpha, self.eta2 = aux, c, alpha, eta2
        self.gbar, self.dot, self.clip = gbar, dot, clip

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads.add_(self.aux)
        s = self.dot if self.dot is not None else torch.dot(self.gbar, params)
        self.alpha.sub_(self.eta2 * (self.c + s))
        if self.clip:
            self.alpha.clamp_(min=0.0)

    def stack_key(self) -> tuple:
        dot = None if self.dot is None else tuple(self.dot.shape)
        return (AuxiliaryRisk, self.clip, dot, tuple(self.alpha.shape))

    @classmethod
    def stack(cls, terms: Sequence[AuxiliaryRisk]) -> Term:
        return _AuxiliaryRiskRows(terms)


class _AuxiliaryRiskRows(Term):
    """``AuxiliaryRisk`` for a stack of clients (``pfl.engine.stacked``): one row of g̃, c, α (and ḡ or
    the server's constants) per client; α moves only on the rows of clients with a batch at the step
    (``active``) and is written back into each client's own α at the end (``finish``)."""

    active: Tensor | None = None

    def __init__(self, terms: Sequence[AuxiliaryRisk]):
        self.terms = terms
        first = terms[0]
        self.aux = torch.stack([t.aux for t in terms])
        self.c = torch.stack([t.c for t in terms])
        self.alpha = torch.stack([t.alpha for t in terms])
        self.eta2 = torch.tensor([[float(t.eta2)] for t in terms], dtype=self.alpha.dtype, device=self.alpha.device)
        self.clip = first.clip
        self.dot = None if first.dot is None else torch.stack([t.dot for t in terms])
        self.gbar = None if first.gbar is None else torch.stack([t.gbar for t in terms])

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads.add_(self.aux)
        s = self.dot if self.dot is not None else (self.gbar * params).sum(1, keepdim=True)  # type: ignore[operator]
        alpha = self.alpha - self.eta2 * (self.c + s)
        if self.clip:
            alpha.clamp_(min=0.0)
        self.alpha = alpha if self.active is None else torch.where(self.active, alpha, self.alpha)

    def finish(self) -> None:
        for t, row in zip(self.terms, self.alpha, strict=True):
            t.alpha.copy_(row)


@register
class PGFed(ClientOptimizerMethod):
    """PGFed.

    Args:
        mu: μ, weight of the auxiliary risk.
        eta2: η₂, step size of the α updates.
        beta: PGFedMo's momentum on the auxiliary gradient (0: PGFed).
        alpha_init: initial α_ij (null: 1/M, Algorithm 1).
        clip_alpha: clip α at 0 after every step (the paper's α ≥ 0, as the authors' code enforces it).
    """

    name = "pgfed"
    description = "personalized global objective: auxiliary gradient of other clients' first-order risks"
    averages_uploads = True  # the global model is the mean; the extras of the uploads given are used

    def __init__(
        self,
        mu: float = 0.1,
        eta2: float = 0.01,
        beta: float = 0.0,
        alpha_init: float | None = None,
        clip_alpha: bool = True,
        **kwargs: Any,
    ):
        require(mu >= 0, "method.mu", f"the auxiliary-risk coefficient must be >= 0 (got {mu})")
        require(eta2 >= 0, "method.eta2", f"the α learning rate must be >= 0 (got {eta2})")
        require(0 <= beta < 1, "method.beta", f"the auxiliary-gradient momentum must be in [0, 1) (got {beta})")
        require(alpha_init is None or alpha_init >= 0, "method.alpha_init", "must be >= 0, or null for 1/M")
        self.mu, self.eta2, self.beta = mu, eta2, beta
        self.alpha_init, self.clip_alpha = alpha_init, clip_alpha
        super().__init__(**kwargs)

    # -- server ---------------------------------------------------------------------------------
    def init_server(self, server: ServerContext) -> State:
        n = server.num_clients
        a0 = 1.0 / server.clients_per_round if self.alpha_init is None else self.alpha_init
        return {"global": server.init_state.clone(), "alpha": torch.full((n, n), a0, device=server.device)}

    def payload(self, server: ServerContext, cid: int) -> State:
        out = {"global": server["global"]}
        if "grads" not in server:  # round 0: nobody uploaded a gradient yet, train as FedAvg
            return out
        alpha = server["alpha"][cid, server["prev_ids"]]
        out["aux"] = self.mu * (alpha @ server["grads"])  # g̃_i, computed by the server
        out["c"] = server["c"]
        out["alpha"] = alpha.clone()
        out.update(self.alpha_gradient_part(server))
        return out

    def alpha_gradient_part(self, server: ServerContext) -> State:
        """What the client needs for the α-gradient's second part μ∇f_jᵀθ_i: ḡ (it computes ḡᵀθ_i)."""
        return {"gbar": server["gbar"]}

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        cids = sorted(uploads)
        ordered = [uploads[c] for c in cids]
        server["global"] = weighted_mean_of(uploads)
        if "prev_ids" in server:  # α rows come back for last round's clients, in that order
            for cid, r in zip(cids, ordered, strict=True):
                if "alpha" in r:
                    server["alpha"][cid, server["prev_ids"]] = r["alpha"]
        grads = torch.stack([r["grad"] for r in ordered])
        server["grads"] = grads
        server["prev_ids"] = torch.tensor(cids, dtype=torch.long, device=grads.device)
        server["c"] = torch.cat([r["c"] for r in ordered])
        server["gbar"] = grads.sum(0).mul_(self.mu / len(cids))

    # -- client ---------------------------------------------------------------------------------
    def local_update(self, client: ClientContext, payload: State) -> Upload:
        terms: list[Term] = []
        alpha = None
        if "aux" in payload:
            aux = payload["aux"]
            if self.beta > 0:  # PGFedMo: momentum on g̃, kept by the client across participations
                prev = client.state.get("aux")
                if prev is not None:
                    aux = (1 - self.beta) * aux + self.beta * prev
                client.state["aux"] = aux.clone()
            alpha = payload["alpha"].clone()
            terms.append(
                AuxiliaryRisk(
                    aux,
                    payload["c"],
                    alpha,
                    self.eta2,
                    gbar=payload.get("gbar"),
                    dot=payload.get("dot"),
                    clip=self.clip_alpha,
                )
            )
        theta = client.fit(payload["global"], terms=terms)  # momentum kept across rounds if the run says so
        client.state["personal"] = theta
        grad, loss = client.mean_gradient(theta)
        c = self.mu * (loss - float(torch.dot(grad, client.params(theta))))
        extras: dict[str, Any] = {"grad": grad, "c": torch.tensor([c], device=theta.device)}
        if alpha is not None:
            extras["alpha"] = alpha
        return Upload(theta, client.num_samples, extras)


@register
class PGFedMo(PGFed):
    """PGFedMo: PGFed whose auxiliary gradient is a momentum average over the client's participations.
    Its options are PGFed's; only the default of ``beta`` differs.

    Args:
        beta: momentum on the auxiliary gradient (the authors' script: 0.5; 0 is PGFed).
    """

    name = "pgfedmo"
    description = "PGFed with momentum beta on the auxiliary gradient, kept per client across participations"

    def __init__(self, beta: float = 0.5, **kwargs: Any):
        super().__init__(beta=beta, **kwargs)


CEScalar = Literal["per_client", "mean"]


@register
class PGFedCE(PGFed):
    """PGFed-CE (appendix D): the server computes the α-gradient's second part g_α^(2) itself, at the
    global model, and sends constants instead of ḡ (one gradient less: 2× FedAvg's traffic, not 2.5×).

    ``ce_scalar``: ``per_client`` (default) sends, for each client j of the last round, the scalar
    μ∇f_j(θ_j)ᵀθ_glob — appendix D's Eq. (16) with θ_i replaced by θ_glob, literally one scalar per j
    (M floats: still negligible, and no averaging is needed once the server computes the products);
    ``mean`` sends one scalar ḡᵀθ_glob for every j — the main text's approximation of
    μ∇f_jᵀθ_i by ḡᵀθ_i (Eq. 12) evaluated at θ_glob. The mean of the per-client scalars is that one.

    Args:
        ce_scalar: per_client (μ∇f_jᵀθ_glob for each j) or mean (ḡᵀθ_glob for every j).
    """

    name = "pgfed_ce"
    description = "communication-efficient PGFed: the server sends grad_j^T theta_glob scalars instead of gbar"

    def __init__(self, ce_scalar: CEScalar = "per_client", **kwargs: Any):
        super().__init__(**kwargs)
        self.ce_scalar = ce_scalar

    def alpha_gradient_part(self, server: ServerContext) -> State:
        theta = server["global"][: server["gbar"].numel()]
        if self.ce_scalar == "per_client":  # μ∇f_jᵀθ_glob, one per client j of the last round
            return {"dot": self.mu * (server["grads"] @ theta)}
        return {"dot": torch.dot(server["gbar"], theta).reshape(1)}  # ḡᵀθ_glob, the mean of those
