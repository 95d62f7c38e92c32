from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from pfl.engine.stacked_loss import ParamsAt, StackedLoss
from pfl.engine.terms import ExtraParamSGD, Term
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.fedavg import PersonalFedAvg
from pfl.methods.registry import register

EvalMix = Literal["global", "local"]
Mix = float | Tensor  # α: the option's float, or a client's adapted α (a 0-dim tensor, ``mix_lr`` > 0)


def mixed(mix: Mix, v: Tensor, w: Tensor) -> Tensor:
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


class MixStep(Term):
    """APFL's adaptive α, after every local step: α ← clip(α − η_α·(g + λ·α), 0, 1), where g = ∂/∂α of
    the step's mixture loss = ⟨v − w, ∇f(v̄)⟩ at the step's v̄ = α·v + (1 − α)·w (autograd fills it in the
    backward that gives v its gradient), η_α = ``mix_lr`` and λ = ``mix_decay``. Plain SGD on α: no
    momentum, no weight decay. No stacked form: the fits of a method using it run one client at a time."""

    def __init__(self, mix: Tensor, lr: float, decay: float):
        self.mix, self.lr, self.decay = mix, lr, decay

    def trained(self) -> list[Tensor]:
        return [self.mix]

    def on_step(self, params: Tensor, lr: float) -> None:
        with torch.no_grad():
            self.mix.sub_(self.lr * (self.mix.grad + self.decay * self.mix)).clamp_(0.0, 1.0)
        self.mix.grad = None


@register
class APFL(PersonalFedAvg):
    """APFL (Deng et al. 2020): each client trains its copy w of the global model (FedAvg) and, in
    the same steps, a personal model v on the loss of the mixture v̄ = α·v + (1 − α)·w, with w the
    pre-step model and no gradient into w (w's step uses only its own loss).

    α is fixed (``mix``) by default, as in the paper's fixed-α runs and the PGFed authors' code. With
    ``mix_lr`` > 0 each client adapts its own α (the paper's adaptive α): every local step also takes
    α ← clip(α − mix_lr·(⟨v − w, ∇f(v̄)⟩ + mix_decay·α), 0, 1), the gradient of the step's mixture loss
    in α at the step's v, w and batch (``MixStep``). α starts at ``mix``, is kept in the client's state
    (``state["mix"]``: across rounds, checkpointed) and is the α of that client's evaluated mixture.
    Such fits run one client at a time under ``trainer.vectorize``.

    Both w and v are trained with the run's optimizer settings (client.lr, the run's momentum — one
    momentum buffer per model, carried through the whole local update — and weight decay); with
    ``keep_momentum`` both buffers are kept per client across rounds.

    The evaluated model (``eval_mix``): ``global`` (default) is v̄ = α·v + (1 − α)·w̄ with w̄ the
    latest global model, for every client — the paper's personalized output, and what the authors'
    code evaluates (it re-mixes each client's v with the broadcast global model before testing); a
    client that never trained mixes the initial v. ``local`` mixes v with the w the client itself
    trained last (the model at the end of its last local update).

    Args:
        mix: α, the weight of the personal model in the mixture (with mix_lr > 0: every client's initial α).
        eval_mix: global (α·v + (1 − α)·latest global model) or local (α·v + (1 − α)·own last w).
        mix_lr: 0: α fixed; > 0: α adapted per client by SGD with this step size, kept in [0, 1].
        mix_decay: with mix_lr > 0, adds mix_decay·α to α's gradient (the APFL authors' code: 0.02).
    """

    name = "apfl"
    description = "FedAvg model w + personal v trained through the mixture mix*v + (1-mix)*w"

    def __init__(
        self,
        mix: float = 0.5,
        eval_mix: EvalMix = "global",
        mix_lr: float = 0.0,
        mix_decay: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        require(0 <= mix <= 1, "method.mix", f"the mixing weight must be in [0, 1] (got {mix})")
        require(mix_lr >= 0, "method.mix_lr", f"must be >= 0 (got {mix_lr})", "0 keeps the mixing weight fixed")
        require(mix_decay >= 0, "method.mix_decay", f"must be >= 0 (got {mix_decay})")
        self.mix, self.eval_mix, self.mix_lr, self.mix_decay = mix, eval_mix, mix_lr, mix_decay

    def vectorize_problems(self) -> list[str]:
        if self.mix_lr > 0:
            return self.runs_one_at_a_time("mix_lr > 0 adapts each client's α (a second trained tensor)")
        return super().vectorize_problems()

    def client_mix(self, client: ClientContext) -> Mix:
        """Client ``client``'s α: ``mix``, or with ``mix_lr`` > 0 its adapted α once it has trained."""
        return client.state.get("mix", self.mix)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        flat = client.flat
        v = client.state.get("v", client.params(client.init_state)).clone().requires_grad_(True)
        a: Mix = self.mix
        terms: list[Term] = []
        if self.mix_lr > 0:  # α trained beside v, from the gradient of the same backward
            a = torch.as_tensor(self.client_mix(client), dtype=torch.promote_types(v.dtype, torch.float32))
            a = a.to(v.device).clone().requires_grad_(True)
            terms.append(MixStep(a, self.mix_lr, self.mix_decay))
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
        # the same loss, for trainer.vectorize (a fixed α only: an adapted one is not in its form)
        stacked = StackedLoss(MixtureLoss(a), v_step) if not terms else None
        w = client.fit(payload["global"], loss_fn=loss_fn, terms=[v_step, *terms], stacked_loss=stacked)
        if client.keep_momentum and v_step.buf is not None:
            client.state["v_momentum"] = v_step.buf.clone()
        v = v.detach()
        client.state["v"] = v
        if terms:
            a = client.state["mix"] = a.detach()
        client.state["personal"] = self.mixture(a, v, w, client.params)
        return Upload(w, client.num_samples)

    def mixture(self, mix: Mix, v: Tensor, w: Tensor, params) -> Tensor:
        """The state w with its parameters replaced by α·v + (1 − α)·w (buffers: w's), α = ``mix``."""
        out = w.clone()
        params(out).copy_(mix * v + (1 - mix) * params(w))
        return out

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        if self.eval_mix == "local":
            return client.state.get("personal", client.init_state)
        v = client.state.get("v", client.params(client.init_state))
        return self.mixture(self.client_mix(client), v, server["global"], client.params)
