from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pfl.client import Worker
from pfl.errors import require
from pfl.methods.base import ClientContext, State, weighted_mean
from pfl.methods.fedavg import FedAvg
from pfl.optim.terms import LinearTerm, Proximal


class FedDyn(FedAvg):
    """FedDyn (Acar et al. 2021). Client i minimises f_i(θ) − ⟨g_i, θ⟩ + α/2‖θ − w‖² and then sets
    g_i ← g_i − α(θ_i − w). Server: h ← h − (α/N) Σ_{i∈S}(θ_i − w), w ← mean_{i∈S}(θ_i) − h/α.
    The mean is sample-weighted as in FedAvg (the paper's is uniform). α = 0 is FedAvg (no dynamic
    regulariser; the server correction h/α, which does not shrink with α, is switched off)."""

    name = "feddyn"
    description = "dynamic regulariser -<g_i, theta> + alpha/2*||theta - w||^2 with server correction h"

    def __init__(self, alpha: float = 0.1, finetune_epochs: int = 0):
        super().__init__(finetune_epochs)
        require(alpha >= 0, "method.alpha", f"must be >= 0 (got {alpha})")
        self.alpha = alpha
        self._num_clients = 1

    def setup(self, worker: Worker, clients_per_round: int) -> None:
        self._num_clients = worker.data.num_clients

    def init_server(self, init_state: Tensor) -> State:
        return {"global": init_state.clone(), "h": torch.zeros_like(init_state)}

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        w = client.params(payload["global"])
        g = client.state.get("g", torch.zeros_like(w))
        theta = client.fit(payload["global"], terms=[LinearTerm(-g), Proximal(w, self.alpha)])
        if self.alpha > 0:
            client.state["g"] = g - self.alpha * (client.params(theta) - w)
        return {"state": theta, "weight": client.num_samples}

    def aggregate(self, server: State, results: dict[int, dict[str, Any]]) -> None:
        ordered = [results[cid] for cid in sorted(results)]
        w = server["global"]
        mean = weighted_mean([r["state"] for r in ordered], [r["weight"] for r in ordered])
        if self.alpha > 0:
            delta = torch.stack([r["state"] - w for r in ordered]).sum(0)
            server["h"] = server["h"] - (self.alpha / self._num_clients) * delta
            mean = mean - server["h"] / self.alpha
        server["global"] = mean
