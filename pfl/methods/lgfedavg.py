from __future__ import annotations

from typing import Any

from torch import Tensor

from pfl.engine.flat import ModelLayout
from pfl.engine.trainer import ClientModule
from pfl.errors import require
from pfl.methods.base import ClientContext, ClientOptimizerMethod
from pfl.methods.layer_sharing import LayerSharing
from pfl.methods.registry import register


class AlternatingSteps(ClientModule):
    """Two optimizer steps per batch, on the same batch: first the representation (the global
    layers' gradient zeroed), then the global layers (the representation's gradient zeroed), with
    one optimizer over the whole model. A zeroed gradient still lets momentum move its part, as
    PyTorch 1.4's ``zero_grad`` did in the code this reproduces. ``fit_context["global"]``: the
    global layers' parameter slice."""

    automatic_optimization = False

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int = 0) -> Tensor:
        opt = self.optimizers()
        grads = opt.worker.flat.grads
        shared = self.fit_context["global"]
        x, y = batch
        for frozen in (shared, slice(0, shared.start)):
            opt.zero_grad()
            loss = self.loss(self(x), y)
            self.manual_backward(loss)
            grads[frozen].zero_()
            opt.step()
        return loss


@register
class LGFedAvg(LayerSharing, ClientOptimizerMethod):
    """LG-FedAvg (Liang et al. 2020): local representation, the last ``global_layers`` layers shared;
    clients train every layer jointly (the paper). ``alternate``: two steps per batch, the
    representation then the global layers, as the authors' code of PGFed trains it.

    Args:
        global_layers: layers at the end of the model that are averaged (1: the classifier).
        alternate: per batch, a step on the representation then one on the global layers (authors' code).
        share_buffers: with every layer global, average the float buffers too (false: keep them
            local, FedBN-style); with a local representation they are local either way.
    """

    name = "lgfedavg"
    description = "local representation layers; only the last global_layers layers are averaged"

    def vectorize_problems(self) -> list[str]:
        if self.alternate:
            return self.runs_one_at_a_time("alternate steps are a custom objective (AlternatingSteps)")
        return super().vectorize_problems()

    def __init__(
        self,
        global_layers: int = 1,
        alternate: bool = False,
        share_buffers: bool = True,
        **kwargs: Any,
    ):
        require(global_layers >= 0, "method.global_layers", f"must be >= 0 (got {global_layers})")
        self.global_layers, self.alternate, self.share_buffers = global_layers, alternate, share_buffers
        super().__init__(**kwargs)

    def shared_mask(self, layout: ModelLayout) -> Tensor:
        self.check_layers("global_layers", self.global_layers, layout)
        mask = layout.state_mask(layout.tail(self.global_layers))
        if self.global_layers == layout.num_layers:
            mask[layout.num_params :] = True  # the whole model is global: buffers too
        return mask

    def train(self, client: ClientContext, start: Tensor) -> Tensor:
        if not self.alternate:
            return client.fit(start)
        context = {"global": client.layout.tail(self.global_layers)}
        return client.fit(start, objective=AlternatingSteps, context=context)
