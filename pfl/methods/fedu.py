"""FedU (Dinh et al., 2021): federated multi-task learning with Laplacian regularisation over a client
graph; after local training the server moves each sampled client's model towards its neighbours'."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload
from pfl.methods.registry import register
from pfl.seeding import torch_generator

Graph = Literal["full", "random"]


@register
class FedU(Method):
    """FedU: each sampled client trains its model w_i for E epochs on f_i; the server then takes one
    gradient step of the Laplacian regulariser (λ/2) tr(WᵀLW) = (λ/2) Σ_{i<j} a_ij‖w_i − w_j‖² (each pair
    once; (λ/4) Σ_{i,j} over ordered pairs for a symmetric A) over the sampled clients S,
    w_i ← w_i − ηλ Σ_{j∈S} a_ij (w_i − w_j), i.e. W_S ← (I − ηλ L_S) W_S with L_S = diag(A_S 1) − A_S,
    all rows from the uploads at once; the server keeps the models (a (K, S) store) and sends client i
    its w_i. η is the local learning rate, as in the paper's Algorithm 1 and the authors' code: the
    round's client.lr (``server.client_lr``, what every client trained with), unless ``eta`` sets it.
    ``graph``: ``full`` (a_ij = 1, i ≠ j) or ``random`` (symmetric a_ij ~ U[0, 1), keyed by the seed,
    the "random similarity" FedORA's Table 4 attributes to FedU). λ = 0 is Local. The authors' code
    differs in its step's scale, its order and its graph (docs/paper_vs_code.md, FedU).

    Args:
        lam: λ, the Laplacian coupling.
        eta: η, the step size of the server's Laplacian step (null: client.lr, the paper's).
        graph: full | random.
    """

    name = "fedu"
    description = "local training + a Laplacian-regularisation step pulling each model towards its neighbours"
    has_global_model = False
    averages_uploads = False  # one model per client, pulled towards its neighbours

    def __init__(self, lam: float = 0.1, eta: float | None = None, graph: Graph = "full"):
        require(lam >= 0, "method.lam", f"must be >= 0 (got {lam})")
        require(eta is None or eta > 0, "method.eta", f"must be > 0, or null for client.lr (got {eta})")
        self.lam, self.eta, self.graph = lam, eta, graph

    def _eta(self, server: ServerContext) -> float:
        return server.client_lr if self.eta is None else self.eta

    def init_server(self, server: ServerContext) -> State:
        k = server.num_clients
        if self.graph == "full":
            a = torch.ones(k, k, dtype=torch.float64)
        else:
            r = torch.rand(k, k, generator=torch_generator(server.seed, "fedu", "graph"), dtype=torch.float64)
            a = (r + r.T) / 2
        a.fill_diagonal_(0.0)
        return {"models": server.init_state.unsqueeze(0).repeat(k, 1), "A": a}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {"model": server["models"][cid]}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        return Upload(client.fit(payload["model"]), client.num_samples)

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        cids = sorted(uploads)
        idx = torch.tensor(cids)
        a = server["A"].cpu()[idx[:, None], idx[None, :]]
        step = torch.eye(len(cids), dtype=torch.float64) - self._eta(server) * self.lam * (torch.diag(a.sum(dim=1)) - a)
        stacked = torch.stack([uploads[c].state for c in cids])
        server["models"][idx.to(stacked.device)] = step.to(stacked.dtype).to(stacked.device) @ stacked

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return server["models"][client.cid]
