from __future__ import annotations

from typing import Any

from torch import Tensor

from pfl.engine.flat import ModelLayout
from pfl.errors import require
from pfl.methods.base import ClientOptimizerMethod
from pfl.methods.layer_sharing import LayerSharing
from pfl.methods.registry import register


@register
class FedPer(LayerSharing, ClientOptimizerMethod):
    """FedPer (Arivazhagan et al. 2019): shared body, the last ``personal_layers`` layers stay local.

    Args:
        personal_layers: layers at the end of the model that stay on the client (1: the classifier).
        share_buffers: share the float buffers with the body (false: FedBN-style local statistics).
    """

    name = "fedper"
    description = "shared body averaged by the server; the last personal_layers layers stay on the client"

    def __init__(
        self,
        personal_layers: int = 1,
        share_buffers: bool = True,
        **kwargs: Any,
    ):
        require(personal_layers >= 0, "method.personal_layers", f"must be >= 0 (got {personal_layers})")
        self.personal_layers, self.share_buffers = personal_layers, share_buffers
        super().__init__(**kwargs)

    def shared_mask(self, layout: ModelLayout) -> Tensor:
        self.check_layers("personal_layers", self.personal_layers, layout)
        return ~layout.state_mask(layout.tail(self.personal_layers))
