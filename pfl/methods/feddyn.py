from __future__ import annotations

from typing import Any

import torch

from pfl.engine.terms import LinearTerm, Proximal
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload, Weighting, upload_weight, weighted_mean_of
from pfl.methods.fedavg import FedAvg
from pfl.methods.registry import register


@register
class FedDyn(FedAvg):
    """FedDyn (Acar et al. 2021). Client i minimises f_i(θ) − ⟨g_i, θ⟩ + α/2‖θ − w‖² and then sets
    g_i ← g_i − α(θ_i − w). Server: h ← h − (α/N) Σ_{i∈S}(θ_i − w), w ← mean_{i∈S}(θ_i) − h/α.
    The mean is uniform over the sampled clients, as in the paper (Algorithm 1) and the authors' code
    of PGFed; ``weighting: samples`` weighs by training-set size as FedAvg does. α = 0 is FedAvg with
    that mean (no dynamic regulariser; the server correction h/α, which does not shrink with α, is
    switched off).

    Args:
        alpha: α, the dynamic regulariser's coefficient.
        finetune_epochs: epochs of fine-tuning the global model to get each P-model (0: none).
        weighting: uniform (the paper) or samples (FedAvg's sample-weighted mean).
    """

    name = "feddyn"
    description = "dynamic regulariser -<g_i, theta> + alpha/2*||theta - w||^2 with server correction h"
    averages_uploads = True  # the mean and h's correction both come from the uploads given

    fixed_options = ("share_buffers",)  # passed to the parent fixed: not options of feddyn

    def __init__(
        self,
        alpha: float = 0.1,
        finetune_epochs: int = 0,
        weighting: Weighting = "uniform",
        **kwargs: Any,
    ):
        super().__init__(finetune_epochs=finetune_epochs, share_buffers=True, **kwargs)
        require(alpha >= 0, "method.alpha", f"must be >= 0 (got {alpha})")
        self.alpha, self.weighting = alpha, weighting

    def init_server(self, server: ServerContext) -> State:
        return {"global": server.init_state.clone(), "h": torch.zeros_like(server.init_state)}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        w = client.params(payload["global"])
        g = client.state.get("g", torch.zeros_like(w))
        theta = client.fit(payload["global"], terms=[LinearTerm(-g), Proximal(w, self.alpha)])
        if self.alpha > 0:
            client.state["g"] = g - self.alpha * (client.params(theta) - w)
        return Upload(theta, upload_weight(self.weighting, client))

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        w = server["global"]
        mean = weighted_mean_of(uploads)  # the weights are upload_weight's: uniform or by samples
        if self.alpha > 0:
            delta = torch.stack([uploads[c].state - w for c in sorted(uploads)]).sum(0)
            server["h"] = server["h"] - (self.alpha / server.num_clients) * delta
            mean = mean - server["h"] / self.alpha
        server["global"] = mean
