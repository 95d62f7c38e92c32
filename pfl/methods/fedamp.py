"""FedAMP (Huang et al., AAAI'21): attentive message passing; the server builds one personalized cloud
model per client from the clients' models, weighted by how close their parameters are."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pfl.engine.terms import Proximal
from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload
from pfl.methods.model_rows import row_gram, squared_distances
from pfl.methods.registry import register
from pfl.optim.propagation import propagate


def attention_weights(sq_dist: Tensor, alpha_k: float, sigma: float, members: Tensor) -> Tensor:
    """Ξ (K, K) float64: ξ_ij = α_k·A'(‖w_i − w_j‖²) with A(x) = 1 − exp(−x/σ), i.e.
    α_k·exp(−‖w_i − w_j‖²/σ)/σ, for j ≠ i among ``members`` (clients with a model on the server);
    ξ_ii = 1 − Σ_{j≠i} ξ_ij. σ = ∞ gives Ξ = I. ξ_ii ≥ 0 (a convex combination) is guaranteed when
    α_k(K − 1) ≤ σ; larger α_k extrapolate, as the paper's formula does."""
    k = sq_dist.shape[0]
    xi = torch.zeros(k, k, dtype=torch.float64)
    if math.isfinite(sigma):
        xi = alpha_k * torch.exp(-sq_dist / sigma) / sigma
        mask = members[:, None] & members[None, :]
        xi = torch.where(mask, xi, torch.zeros_like(xi))
        xi.fill_diagonal_(0.0)
    xi += torch.diag(1.0 - xi.sum(dim=1))
    return xi


@register
class FedAMP(Method):
    """FedAMP: the server keeps every client's last uploaded model w_i (a (K, S) store) and computes
    each client's cloud model u_i = Σ_j ξ_ij w_j (``attention_weights``; one K×K matmul over the store);
    client i trains its own model on f_i(w) + λ/(2α_k)·‖w − u_i‖² for E epochs from its last model and
    uploads it. A client that has not uploaded yet takes no part in anyone's message passing. With
    σ → ∞ (off-diagonal ξ = 0) u_i = w_i: local training with a proximal pull to the previous model.

    Args:
        alpha_k: α_k, the step of the attention (weights ξ_ij scale with it).
        sigma: σ of A(x) = 1 − exp(−x/σ) on squared parameter distances (inf: no message passing).
        lam: λ of the proximal term λ/(2α_k)‖w − u_i‖².
    """

    name = "fedamp"
    description = "personalized cloud models by attention over parameter distances + proximal local term"
    has_global_model = False
    averages_uploads = False  # one cloud model per client

    def __init__(self, alpha_k: float = 1.0, sigma: float = 100.0, lam: float = 1.0):
        require(alpha_k > 0 and math.isfinite(alpha_k), "method.alpha_k", f"must be finite and > 0 (got {alpha_k})")
        require(sigma > 0, "method.sigma", f"must be > 0 (got {sigma})", "use .inf for no message passing")
        require(lam >= 0, "method.lam", f"must be >= 0 (got {lam})")
        self.alpha_k, self.sigma, self.lam = alpha_k, sigma, lam

    def init_server(self, server: ServerContext) -> State:
        k = server.num_clients
        store = server.init_state.unsqueeze(0).repeat(k, 1)
        return {"models": store, "cloud": store.clone(), "seen": torch.zeros(k, dtype=torch.bool, device=server.device)}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {"cloud": server["cloud"][cid]}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        own = client.state.get("personal", client.init_state)
        term = Proximal(client.params(payload["cloud"]), self.lam / self.alpha_k)
        client.state["personal"] = client.fit(own, terms=[term])
        return Upload(client.state["personal"], client.num_samples)

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        for cid in sorted(uploads):
            server["models"][cid] = uploads[cid].state
            server["seen"][cid] = True
        dist = squared_distances(row_gram(server["models"], cols=server.layout.num_params))
        xi = attention_weights(dist, self.alpha_k, self.sigma, server["seen"].cpu())
        propagate(xi, server["models"], out=server["cloud"])

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return client.state.get("personal", client.init_state)
