from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pfl.engine.stacked_loss import ParamsAt, StackedLoss
from pfl.engine.terms import ExtraParamSGD
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.fedavg import PersonalFedAvg
from pfl.methods.heads import split_head
from pfl.methods.registry import register


def balanced_softmax_loss(logits: Tensor, y: Tensor, class_counts: Tensor, reduction: str = "mean") -> Tensor:
    """Balanced softmax (Ren et al. 2020): cross-entropy of logits + log n_c, the client's class
    counts (absent classes get a tiny prior rather than −inf, to stay finite)."""
    return F.cross_entropy(logits + class_counts.clamp_min(1e-8).log(), y, reduction=reduction)


def two_head_loss(
    net: nn.Module, head: Tensor, x: Tensor, y: Tensor, counts: Tensor, reduction: str = "mean"
) -> Tensor:
    """FedRoD's local loss: the generic model's balanced softmax, plus the cross-entropy of generic +
    personal logits, the personal head (the flat ``head``) on detached features."""
    body, linear = split_head(net)
    z = body(x)
    out_g = linear(z)
    w = head[: linear.weight.numel()].view_as(linear.weight)
    b = head[linear.weight.numel() :]
    out_p = F.linear(z.detach(), w, b if linear.bias is not None else None)
    return balanced_softmax_loss(out_g, y, counts, reduction) + F.cross_entropy(
        out_g.detach() + out_p, y, reduction=reduction
    )


@dataclass(frozen=True)
class TwoHeadLoss:
    """``two_head_loss`` per sample, as trained stacked (``pfl.engine.stacked_loss``): the head and the
    class counts are each client's."""

    def __call__(self, at: ParamsAt, p: Tensor, head: Tensor, x: Tensor, y: Tensor, counts: Tensor) -> Tensor:
        return at.run(p, two_head_loss, at.net, head, x, y, counts, "none")


HeadInit = Literal["zero", "init"]


@register
class FedRoD(PersonalFedAvg):
    """FedRoD (Chen & Chao 2022): the generic model (body + generic head) is trained with the
    balanced-softmax risk and averaged; each client adds a personal linear head trained with
    cross-entropy on generic logits + personal logits, on detached features.

    Because both heads are linear on the same features, the personalized prediction
    W_g z + b_g + W_p z + b_p is the network with head (W_g + W_p, b_g + b_p): the P-model is the
    global model with the personal head added to its classifier.

    ``head_init``: ``zero`` (default) starts every personal head at zero, so a P-model starts as the
    generic model (the paper does not fix the initialisation; zero adds nothing before the head has
    learnt); ``init`` starts it as a copy of the initial (random) classifier, as the authors' code
    of PGFed does. Both heads are trained with the run's optimizer settings (lr — or ``head_lr`` for
    the personal head —, momentum with one buffer per head, weight decay).

    Args:
        head_lr: learning rate of the personal head (null: client.lr).
        head_init: zero or init (a copy of the initial classifier, the authors' code).
    """

    name = "fedrod"
    description = "generic model with balanced softmax + personal linear head on detached features"

    def __init__(
        self,
        head_lr: float | None = None,
        head_init: HeadInit = "zero",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        require(head_lr is None or head_lr > 0, "method.head_lr", "must be > 0, or null for client.lr")
        self.head_lr, self.head_init = head_lr, head_init

    def initial_head(self, client: ClientContext) -> Tensor:
        head = client.layout.head
        if self.head_init == "init":
            return client.init_state[head].clone()
        return torch.zeros(head.stop - head.start, device=client.init_state.device, dtype=client.init_state.dtype)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        ph = client.state["head"].clone() if "head" in client.state else self.initial_head(client)
        ph.requires_grad_(True)
        counts = client.class_counts()

        def loss_fn(net: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            return two_head_loss(net, ph, x, y, counts)

        head_step = ExtraParamSGD(ph, self.head_lr, momentum=client.momentum, weight_decay=client.weight_decay)
        if client.keep_momentum and "head_momentum" in client.state:
            head_step.buf = client.state["head_momentum"].clone()
        stacked = StackedLoss(TwoHeadLoss(), head_step, (counts,))  # the same loss, for trainer.vectorize
        state = client.fit(payload["global"], loss_fn=loss_fn, terms=[head_step], stacked_loss=stacked)
        if client.keep_momentum and head_step.buf is not None:
            client.state["head_momentum"] = head_step.buf.clone()
        client.state["head"] = ph.detach()
        return Upload(state, client.num_samples)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        out = server["global"].clone()
        out[client.layout.head] += client.state["head"] if "head" in client.state else self.initial_head(client)
        return out
