from __future__ import annotations

from typing import Any

from torch import Tensor

from pfl.engine.terms import Term
from pfl.errors import require
from pfl.methods.base import ClientContext, ClientOptimizerMethod, ServerContext, State, Upload, weighted_mean_of
from pfl.methods.registry import register


@register
class FedAvg(ClientOptimizerMethod):
    """FedAvg: clients train the global model locally; the server takes the sample-weighted mean
    (a server optimizer, ``server.optimizer``, turns this into FedAvgM / FedAdam / FedYogi / FedAdagrad).

    FedAvg+FT: with ``finetune_epochs`` > 0 a client's P-model is the global model fine-tuned that
    many epochs on its train split; with 0 it is the global model itself.

    Buffers (BatchNorm running statistics) are averaged with the parameters by default. With
    ``share_buffers: false`` they stay on each client (FedBN, Li et al. 2021, for the statistics):
    a client trains from the global parameters with its own statistics, uploads only the
    parameters, and is evaluated with its own statistics.

    Args:
        finetune_epochs: epochs of fine-tuning the global model to get each P-model (0: none).
        share_buffers: average the float buffers with the parameters (false: FedBN-style local statistics).
    """

    name = "fedavg"
    description = "sample-weighted average of locally trained models (+FT: finetune_epochs > 0)"
    has_personal_model = False
    averages_uploads = True  # the sample-weighted mean of the uploads

    def __init__(
        self,
        finetune_epochs: int = 0,
        share_buffers: bool = True,
        **kwargs: Any,
    ):
        require(finetune_epochs >= 0, "method.finetune_epochs", f"must be >= 0 (got {finetune_epochs})")
        self.finetune_epochs, self.share_buffers = finetune_epochs, share_buffers
        super().__init__(**kwargs)

    def start(self, client: ClientContext, global_state: Tensor) -> Tensor:
        """The model a client starts from: the global one, with the client's own buffers when they are local."""
        own = client.state.get("buffers")
        if self.share_buffers or own is None:
            return global_state
        out = global_state.clone()
        out[client.layout.num_params :] = own
        return out

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        trained = client.fit(self.start(client, payload["global"]), terms=self.local_terms(client, payload))
        if self.share_buffers:
            return Upload(trained, client.num_samples)
        p = client.layout.num_params
        if client.layout.num_buffers:
            client.state["buffers"] = trained[p:].clone()
        return Upload(trained[:p], client.num_samples)

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        if self.share_buffers:
            server["global"] = weighted_mean_of(uploads)
            return
        out = server["global"].clone()  # the buffers stay where they are: each client keeps its own
        out[: server.layout.num_params] = weighted_mean_of(uploads)
        server["global"] = out

    def upload_reference(self, server: ServerContext) -> Tensor:
        return server["global"] if self.share_buffers else server["global"][: server.layout.num_params]

    def local_terms(self, client: ClientContext, payload: State) -> list[Term]:
        """Extra terms of the local objective (none for FedAvg)."""
        return []

    def personal_state(self, server: ServerContext, client: ClientContext):
        start = self.start(client, server["global"])
        if self.finetune_epochs == 0:
            return start
        return client.fit(start, epochs=self.finetune_epochs, purpose="finetune")


class PersonalFedAvg(FedAvg):
    """FedAvg's global model plus a personal model the method trains itself (APFL, Ditto, FedRoD): the
    personal model replaces fine-tuning, and the buffers are shared; both are fixed, not options."""

    has_personal_model = True
    fixed_options = ("finetune_epochs", "share_buffers")  # passed to FedAvg fixed: not options of a subclass

    def __init__(self, **kwargs: Any):
        super().__init__(finetune_epochs=0, share_buffers=True, **kwargs)
