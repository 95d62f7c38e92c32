from __future__ import annotations

from typing import Any

from pfl.engine.terms import Proximal, Term
from pfl.errors import require
from pfl.methods.base import ClientContext, State
from pfl.methods.fedavg import FedAvg
from pfl.methods.registry import register


@register
class FedProx(FedAvg):
    """FedProx: FedAvg whose local objective adds μ/2·‖θ − w‖² to stay near the global model w.

    Args:
        mu: proximal coefficient μ (0 is FedAvg); the other options are FedAvg's.
    """

    name = "fedprox"
    description = "FedAvg with a proximal term mu/2*||theta - w||^2 in the local objective"

    def __init__(
        self,
        mu: float = 0.01,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        require(mu >= 0, "method.mu", f"the proximal coefficient must be >= 0 (got {mu})")
        self.mu = mu

    def local_terms(self, client: ClientContext, payload: State) -> list[Term]:
        return [Proximal(client.params(payload["global"]), self.mu)]
