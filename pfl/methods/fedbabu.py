from __future__ import annotations

from typing import Any

from torch import Tensor

from pfl.engine.flat import ModelLayout
from pfl.engine.terms import Freeze
from pfl.errors import require
from pfl.methods.base import ClientContext, ClientOptimizerMethod, ServerContext, State, Upload
from pfl.methods.layer_sharing import LayerSharing
from pfl.methods.registry import register


@register
class FedBABU(LayerSharing, ClientOptimizerMethod):
    """FedBABU (Oh et al. 2022): the body is trained and averaged while the head stays at its random
    initialisation everywhere; a client's P-model is the global model fine-tuned ``finetune_epochs``
    (all layers) at ``finetune_lr`` (the authors' code: 0.001; null = client.lr). A new client is
    adapted the same way: the global model fine-tuned ``eval.new_client_epochs`` at ``finetune_lr``.
    ``client_momentum`` applies to training and fine-tuning, ``keep_momentum`` to training.

    Args:
        head_layers: layers at the end of the model kept at their initialisation during training.
        finetune_epochs: epochs of fine-tuning (all layers) that give each P-model.
        finetune_lr: learning rate of that fine-tuning (null: client.lr).
    """

    name = "fedbabu"
    description = "body-only federated training with the head frozen at init; P-model = fine-tuned global"
    has_global_model = True  # global body + the initial head

    def __init__(
        self,
        head_layers: int = 1,
        finetune_epochs: int = 1,
        finetune_lr: float | None = 0.001,
        **kwargs: Any,
    ):
        require(head_layers >= 0, "method.head_layers", f"must be >= 0 (got {head_layers})")
        require(finetune_epochs >= 0, "method.finetune_epochs", f"must be >= 0 (got {finetune_epochs})")
        require(finetune_lr is None or finetune_lr > 0, "method.finetune_lr", "must be > 0, or null for client.lr")
        self.head_layers, self.finetune_epochs, self.finetune_lr = head_layers, finetune_epochs, finetune_lr
        super().__init__(**kwargs)

    def shared_mask(self, layout: ModelLayout) -> Tensor:
        self.check_layers("head_layers", self.head_layers, layout)
        return ~layout.state_mask(layout.tail(self.head_layers))

    def own(self, client: ClientContext) -> Tensor:
        return client.init_state  # the head is the common initial one, never personal

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        start = self.compose(payload["shared"], client.init_state, client.layout)
        frozen = Freeze(client.params(start), client.layout.tail(self.head_layers))
        trained = client.fit(start, terms=[frozen])
        return Upload(trained[self.mask(client.layout)], client.num_samples)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        start = self.compose(server["global"][self.mask(server.layout)], client.init_state, server.layout)
        if self.finetune_epochs == 0:
            return start
        return client.fit(start, epochs=self.finetune_epochs, purpose="finetune", lr=self.finetune_lr)

    def adapt(self, client: ClientContext, start: Tensor, epochs: int) -> Tensor:
        return client.fit(start, epochs=epochs, purpose="new_client", lr=self.finetune_lr)
