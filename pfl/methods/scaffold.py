from __future__ import annotations

from typing import Literal, TypeAlias

import torch

from pfl.engine.terms import LinearTerm
from pfl.methods.base import (
    ClientContext,
    Method,
    ServerContext,
    State,
    Upload,
    Weighting,
    upload_weight,
    weighted_mean_of,
)
from pfl.methods.registry import register

# The paper's two control-variate updates (its Algorithm 1, line 12).
ControlOption: TypeAlias = Literal["II", "I"]


@register
class Scaffold(Method):
    """SCAFFOLD (Karimireddy et al. 2020). Client i takes K local steps y ← y − η(∇f_i(y) − c_i + c) from
    the global model x, then sets its control variate c_i⁺ and uploads y and Δc_i = c_i⁺ − c_i. Option II
    (the default, the paper's cheaper choice): c_i⁺ = c_i − c + (x − y)/(Kη). Option I: c_i⁺ = ∇f_i(x),
    the client's gradient at the server model, here the mean batch gradient of one extra pass over its
    train split. Server: x ← x + η_g · mean(y − x) (η_g = ``server.lr``, the server optimizer's step),
    c ← c + (1/N) Σ_{i∈S} Δc_i. The mean is uniform over the sampled clients as in the paper
    (``weighting: samples`` weighs by training-set size as FedAvg does).

    Args:
        weighting: the server's mean of the clients' models: uniform (the paper) or samples.
        option: the control-variate update: II (from the local path, no extra pass) or I (the gradient
            at the server model, one extra pass over the client's data).
    """

    name = "scaffold"
    description = "control variates c, c_i correct client drift; server step size = server.lr"
    averages_uploads = True  # the model is the mean; c takes the Δc of the uploads given
    has_personal_model = False

    def __init__(self, weighting: Weighting = "uniform", option: ControlOption = "II"):
        self.weighting, self.option = weighting, option

    def init_server(self, server: ServerContext) -> State:
        return {"global": server.init_state.clone(), "c": server.init_state.new_zeros(server.layout.num_params)}

    def payload(self, server: ServerContext, cid: int) -> State:
        return {"global": server["global"], "c": server["c"]}

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        x, c = client.params(payload["global"]), payload["c"]
        c_i = client.state.get("c", torch.zeros_like(c))
        y = client.fit(payload["global"], terms=[LinearTerm(c - c_i)])
        if self.option == "I":
            c_new = client.mean_gradient(payload["global"])[0]
        else:
            c_new = c_i - c + (x - client.params(y)) / (client.fits[-1].steps * client.lr)
        client.state["c"] = c_new
        return Upload(y, upload_weight(self.weighting, client), {"dc": c_new - c_i})

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        server["global"] = weighted_mean_of(uploads)
        server["c"] = server["c"] + torch.stack([uploads[i]["dc"] for i in sorted(uploads)]).sum(0) / server.num_clients
