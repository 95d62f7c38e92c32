from __future__ import annotations

from pfl.engine.terms import Proximal, Term
from pfl.errors import require
from pfl.methods.base import ClientContext, State
from pfl.methods.fedavg import FedAvg
from pfl.methods.registry import register


@register
class FedProx(FedAvg):
    """FedProx: FedAvg whose local objective adds μ/2·‖θ − w‖² to stay near the global model w.

    Args:
        mu: proximal coefficient μ (0 is FedAvg).
        finetune_epochs: epochs of fine-tuning the global model to get each P-model (0: none).
        share_buffers: average the float buffers with the parameters (false: FedBN-style local statistics).
        client_momentum: SGD momentum of this method's local fits (null: client.momentum).
        keep_momentum: keep each client's SGD momentum across its rounds (null: client.keep_momentum).
    """

    name = "fedprox"
    vectorizable = True  # the update passes the trained state on without reading it
    description = "FedAvg with a proximal term mu/2*||theta - w||^2 in the local objective"

    def __init__(
        self,
        mu: float = 0.01,
        finetune_epochs: int = 0,
        share_buffers: bool = True,
        client_momentum: float | None = None,
        keep_momentum: bool | None = None,
    ):
        super().__init__(finetune_epochs, share_buffers, client_momentum, keep_momentum)
        require(mu >= 0, "method.mu", f"the proximal coefficient must be >= 0 (got {mu})")
        self.mu = mu

    def local_terms(self, client: ClientContext, payload: State) -> list[Term]:
        return [Proximal(client.params(payload["global"]), self.mu)]
