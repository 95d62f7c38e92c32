from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn
from torch.func import functional_call

from pfl.engine.stacked_loss import ParamsAt, StackedLoss
from pfl.engine.terms import ExtraParamSGD
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.fedavg import PersonalFedAvg
from pfl.methods.registry import register

EvalMix = Literal["global", "local"]


def mixed(mix: float, v: Tensor, w: Tensor) -> Tensor:
    """The mixture α·v + (1 − α)·w that v is trained through, with no gradient into w."""
    return mix * v + (1 - mix) * w.detach()


@dataclass(frozen=True)
class MixtureLoss:
    """APFL's loss per sample, as trained stacked (``pfl.engine.stacked_loss``): w's own loss plus the
    mixture's. The batch mean of it is ``local_update``'s ``loss_fn``."""

    mix: float

    def __call__(self, at: ParamsAt, w: Tensor, v: Tensor, x: Tensor, y: Tensor) -> Tensor:
        out, own = at(mixed(self.mix, v, w), x), at(w, x)
        return at.loss(own, y) + at.loss(out, y)


@register
class APFL(PersonalFedAvg):
    """APFL (Deng et al. 2020): each client trains its copy w of the global model (FedAvg) and, in
    the same steps, a personal model v on the loss of the mixture v̄ = α·v + (1 − α)·w, with w the
    pre-step model and no gradient into w (w's step uses only its own loss). α is fixed (``mix``).

    Both w and v are trained with the run's optimizer settings (client.lr, the run's momentum — one
    momentum buffer per model, carried through the whole local update — and weight decay); with
    ``keep_momentum`` both buffers are kept per client across rounds.

    The evaluated model (``eval_mix``): ``global`` (default) is v̄ = α·v + (1 − α)·w̄ with w̄ the
    latest global model, for every client — the paper's personalized output, and what the authors'
    code evaluates (it re-mixes each client's v with the broadcast global model before testing); a
    client that never trained mixes the initial v. ``local`` mixes v with the w the client itself
    trained last (the model at the end of its last local update).

    Args:
        mix: α, the weight of the personal model in the mixture.
        eval_mix: global (α·v + (1 − α)·latest global model) or local (α·v + (1 − α)·own last w).
    """

    name = "apfl"
    description = "FedAvg model w + personal v trained through the mixture mix*v + (1-mix)*w"

    def __init__(
        self,
        mix: float = 0.5,
        eval_mix: EvalMix = "global",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        require(0 <= mix <= 1, "method.mix", f"the mixing weight must be in [0, 1] (got {mix})")
        self.mix, self.eval_mix = mix, eval_mix

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        flat = client.flat
        v = client.state.get("v", client.params(client.init_state)).clone().requires_grad_(True)
        a = self.mix
        loss, squeeze = client.loss, client.task == "regression"  # MSE on (B,) outputs

        def loss_fn(net: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            # w's own step uses only its own loss
            out, own = functional_call(net, flat.param_dict(mixed(a, v, flat.params)), (x,)), net(x)
            if squeeze:
                out, own = out.squeeze(-1), own.squeeze(-1)
            return loss(own, y) + loss(out, y)

        v_step = ExtraParamSGD(v, momentum=client.momentum, weight_decay=client.weight_decay)
        if client.keep_momentum and "v_momentum" in client.state:
            v_step.buf = client.state["v_momentum"].clone()
        stacked = StackedLoss(MixtureLoss(a), v_step)  # the same loss, for trainer.vectorize
        w = client.fit(payload["global"], loss_fn=loss_fn, terms=[v_step], stacked_loss=stacked)
        if client.keep_momentum and v_step.buf is not None:
            client.state["v_momentum"] = v_step.buf.clone()
        v = v.detach()
        client.state["v"] = v
        client.state["personal"] = self.mixture(v, w, client.params)
        return Upload(w, client.num_samples)

    def mixture(self, v: Tensor, w: Tensor, params) -> Tensor:
        """The state w with its parameters replaced by α·v + (1 − α)·w (buffers: w's)."""
        out = w.clone()
        params(out).copy_(self.mix * v + (1 - self.mix) * params(w))
        return out

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        if self.eval_mix == "local":
            return client.state.get("personal", client.init_state)
        v = client.state.get("v", client.params(client.init_state))
        return self.mixture(v, server["global"], client.params)
