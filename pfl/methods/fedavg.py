from __future__ import annotations

from typing import Any

from pfl.errors import require
from pfl.methods.base import ClientContext, Method, State


class FedAvg(Method):
    """FedAvg: clients train the global model locally; the server takes the sample-weighted mean.

    FedAvg+FT: with ``finetune_epochs`` > 0 a client's P-model is the global model fine-tuned that
    many epochs on its train split; with 0 it is the global model itself.

    Args:
        finetune_epochs: epochs of fine-tuning the global model to get each P-model (0: none).
    """

    name = "fedavg"
    description = "sample-weighted average of locally trained models (+FT: finetune_epochs > 0)"

    def __init__(self, finetune_epochs: int = 0):
        require(finetune_epochs >= 0, "method.finetune_epochs", f"must be >= 0 (got {finetune_epochs})")
        self.finetune_epochs = finetune_epochs

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        return {
            "state": client.fit(payload["global"], terms=self.local_terms(client, payload)),
            "weight": client.num_samples,
        }

    def local_terms(self, client: ClientContext, payload: State) -> list:
        """Extra terms of the local objective (none for FedAvg)."""
        return []

    def personal_state(self, server: State, client: ClientContext):
        if self.finetune_epochs == 0:
            return server["global"]
        return client.fit(server["global"], epochs=self.finetune_epochs, purpose="finetune")
