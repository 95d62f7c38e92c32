"""PLGU (Qu et al., *How to Prevent the Poor Performance Clients for Personalized Federated
Learning?*, CVPR'23): personalize locally, generalize universally with layer-wise SAM (LWSAM).

- ``plgu_lf`` (scheme I, Algorithms 1–2): each client keeps its D most personal layers, takes the
  others from the global model and trains a personalized model θ_i and its copy of the global model
  w_i side by side; w_i's gradient is taken at a perturbed point that only the universal layers feel.
- ``plgu_grep`` (scheme II, Algorithm 3, on FedRep): head epochs with the body frozen, then body
  steps with the LWSAM perturbation over the body layers.

No public code exists; the choices the paper leaves open are in the docstrings and docs/plgu.md.
The LWSAM math (ξ, Λ, ε) is ``pfl.optim.sharpness``; the two-pass step is ``pfl.engine.sam``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor
from torch.func import functional_call

from pfl.engine.flat import FlatModule
from pfl.engine.sam import SAMObjective, sam_context
from pfl.engine.stacked import PersonalRow
from pfl.engine.terms import Freeze
from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload
from pfl.methods.fedavg import FedAvg
from pfl.methods.fedrep import FedRep
from pfl.methods.registry import register
from pfl.optim.sharpness import layer_scale, layer_scores, top_layers

Scale = Literal["layer", "identity"]
Ascent = Literal["personal", "global"]


def buffer_slices(flat: FlatModule) -> dict[str, slice]:
    """Module name -> slice of ``flat.buffers`` holding that module's float buffers (BatchNorm
    statistics), in ``FlatModule``'s layout order (modules in ``named_modules`` order)."""
    out: dict[str, slice] = {}
    offset = 0
    for name, module in flat.module.named_modules():
        for b in module._buffers.values():
            if b is not None and b.is_floating_point():
                out[name] = slice(out[name].start if name in out else offset, offset + b.numel())
                offset += b.numel()
    return out


def buffer_views(flat: FlatModule, state: Tensor) -> dict[str, Tensor]:
    """Named views of the float buffers of a full state vector, for ``torch.func.functional_call``
    (a forward through them updates the running statistics of ``state`` in place)."""
    out: dict[str, Tensor] = {}
    offset = flat.num_params
    for name, module in flat.module.named_modules():
        for key, b in module._buffers.items():
            if b is not None and b.is_floating_point():
                out[f"{name}.{key}" if name else key] = state[offset : offset + b.numel()].view_as(b)
                offset += b.numel()
    return out


def param_views(flat: FlatModule, vector: Tensor) -> dict[str, Tensor]:
    """Named views of a flat parameter vector for ``torch.func.functional_call``, cut with
    ``torch.split``: its backward is one concatenation, where slicing would allocate a zero
    gradient the size of the whole vector once per parameter tensor (1.4x the step's cost on the
    benchmark CNN)."""
    pieces = torch.split(vector, [sl.stop - sl.start for sl in flat.param_slices.values()])
    return {name: piece.view(flat.param_shapes[name]) for name, piece in zip(flat.param_slices, pieces, strict=True)}


class PLGULFObjective(SAMObjective):
    """Algorithm 1 on one mini-batch B. The worker's model is the client's copy of the global model
    w_i (trained by the fit's optimizer and terms); the personalized model θ_i lives beside it in
    ``fit_context`` (``theta``: its state vector, updated in place; ``theta_params``: a leaf over its
    parameters; ``theta_optimizer``: SGD over that leaf).

    1. g = ∇F_B(θ_i) (a functional forward through θ_i's own parameters and buffers); θ_i ← SGD step.
    2. ε = ρ · Λ g/‖g‖ (Eq. 5; Λ zero on the personal layers), from the personal gradient g
       (``ascent="personal"``, the paper) or from ∇F_B(w_i) (``ascent="global"``, one more pass).
    3. w_i ← optimizer step with ∇F_B(w_i + ε). When ε ≡ 0 (ρ = 0 or no universal layer) this is a
       plain gradient at w_i.

    Returns θ_i's batch loss (the training loss FitStats reports).

    With ``ascent="personal"`` clients' fits stack (``pfl.engine.stacked``: θ rows trained beside the w
    rows, ε from each client's own θ gradient); ``ascent="global"``'s third pass has no stacked form.
    """

    @staticmethod
    def stacks_as_sam(context: dict[str, Any]) -> bool:
        """The personal ascent's step is SAM's step with ε from θ_i's gradient (``stacked_personal``)."""
        return context["ascent"] == "personal"

    @staticmethod
    def stacked_personal(context: dict[str, Any]) -> PersonalRow:
        """θ_i and its SGD settings, for the stacked form of this step."""
        group = context["theta_optimizer"].param_groups[0]
        assert not group["nesterov"] and not group["dampening"], "the stacked θ step is plain (heavy-ball) SGD"
        return PersonalRow(context["theta"], group["lr"], group["momentum"], group["weight_decay"])

    def personal_step(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        ctx = self.fit_context
        leaf, theta = ctx["theta_params"], ctx["theta"]
        flat = self.flat
        tensors = {**param_views(flat, leaf), **buffer_views(flat, theta)}
        out = functional_call(self.net, tensors, (x,))
        loss = self.loss(out.squeeze(-1) if self.task == "regression" else out, y)
        scaler = self.optimizers().worker.scaler
        if scaler is None:
            (grad,) = torch.autograd.grad(loss, leaf)
        else:  # scaled like every other backward under 16-mixed, then unscaled; skip a non-finite step
            s = scaler.get_scale()
            (grad,) = torch.autograd.grad(loss * s, leaf)
            grad = grad / s
            if not bool(torch.isfinite(grad).all()):
                return grad, loss.detach()
        leaf.grad = grad
        ctx["theta_optimizer"].step()
        leaf.grad = None
        return grad, loss.detach()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int = 0) -> Tensor:
        x, y = batch
        ctx = self.fit_context
        g_theta, loss = self.personal_step(x, y)
        if not ctx["perturb"]:
            self.backward_at_current(x, y)
        elif ctx["ascent"] == "global":
            self.backward_at_current(x, y)
            self.perturbed_gradient(x, y)
        else:
            self.perturbed_gradient(x, y, ascent_grad=g_theta)
        self.optimizers().step()
        return loss


@register
class PLGULF(FedAvg):
    """PLGU-LF (scheme I, Algorithms 1–2).

    Round t, client i with personalized model θ_i (the global model at its first participation):

    1. ξ = ``layer_scores``(θ_i, w) (Eq. 6, normalised to sum 1 over all L layers); L^Per = the
       ``personal_layers`` (D) layers of largest ξ, L^Uni the others.
    2. θ_i^{t,0}: L^Per from θ_i (with their float buffers), L^Uni from w; w_i^{t,0} = w.
    3. ``client.epochs`` epochs of ``PLGULFObjective`` steps: θ_i by SGD, w_i by the gradient at
       w_i + ε with ε = ρ Λ g/‖g‖ (p = 2; the ℓ_p form otherwise), Λ = diag(ξ) on L^Uni and 0 on L^Per
       (``scale="identity"``: 1 on L^Uni), g the personal gradient (``ascent``).
    4. Upload w_i^{t,K}; the server averages as FedAvg (sample-weighted; the paper's
       w + (1/C) Σ Δw_i is the same with equal client sizes).

    The P-model is θ_i^{t,K} (the global model for a client that never trained); the G-model is w.

    Why ε only on L^Uni: the paper's D = all layers is FedAvg ("no perturbation") and D = 0 is FedSAM
    ("full layers perturbation", Fig. 5), and Theorem 1's adversarial terms count the L − D universal
    layers. The norm in ε is of the whole gradient (Eq. 5). θ_i uses the client's SGD settings (lr,
    momentum, weight decay; momentum fresh each round), like w_i.

    Identities (tests): D ≥ L (every layer personal, so ε ≡ 0) gives FedAvg's global model bit for
    bit; D = 0 with ``scale="identity"`` and ``ascent="global"`` gives FedSAM's bit for bit. With the
    paper's defaults D = 0 is FedSAM-like only: Λ scales each layer's ε by ξ_l (Σξ = 1, so ε is
    about 1/L of SAM's) and ε follows θ_i's gradient, which leaves w_i's after the first step.
    D larger than the model's layer count personalizes every layer.

    Cost per mini-batch: two forward/backward passes (θ_i at θ_i, w_i at w_i + ε), as SAM; the
    ``ascent="global"`` option adds a third.

    Args:
        personal_layers: D, layers kept personal each round (paper: 5).
        rho: radius ρ of the perturbation (paper: 0.05).
        p: the ℓ_p ball (2: SAM/LWSAM).
        scale: layer (Λ = diag(ξ), LWSAM, the paper) | identity (Λ = I on the universal layers).
        ascent: personal (ε from ∇F(θ_i), Algorithm 1) | global (ε from ∇F(w_i), one pass more).
    """

    name = "plgu_lf"
    description = "D most personal layers kept local; global copy trained at an LWSAM-perturbed point (PLGU)"
    has_personal_model = True

    def vectorize_problems(self) -> list[str]:
        if self.ascent == "global":
            return self.runs_one_at_a_time("ascent='global' LWSAM steps (a third pass, from w_i's gradient)")
        return super().vectorize_problems()

    def __init__(
        self,
        personal_layers: int = 5,
        rho: float = 0.05,
        p: float = 2.0,
        scale: Scale = "layer",
        ascent: Ascent = "personal",
    ):
        super().__init__(finetune_epochs=0)
        require(personal_layers >= 0, "method.personal_layers", f"must be >= 0 (got {personal_layers})")
        require(rho >= 0, "method.rho", f"must be >= 0 (got {rho})")
        require(p >= 1, "method.p", f"must be >= 1 (got {p})", "the ℓ_p ball needs p >= 1 (2 is SAM)")
        self.personal_layers, self.rho, self.p, self.scale, self.ascent = personal_layers, rho, p, scale, ascent

    def split_layers(self, theta: Tensor, w: Tensor, client: ClientContext) -> tuple[Tensor, list[int], list[int]]:
        """(ξ, personal layer indices, universal layer indices) of θ_i against w."""
        layers = list(client.layout.layer_slices().values())
        xi = layer_scores(client.params(theta), client.params(w), layers)
        personal = top_layers(xi, min(self.personal_layers, len(layers)))
        universal = [i for i in range(len(layers)) if i not in set(personal)]
        return xi, personal, universal

    def personal_start(self, theta: Tensor, w: Tensor, personal: list[int], flat: FlatModule) -> Tensor:
        """θ_i^{t,0}: the personal layers (and their modules' float buffers) from θ_i, the rest from w."""
        start = w.clone()
        names = list(flat.layout.layer_slices())
        buffers = buffer_slices(flat)
        for i in personal:
            sl = flat.layout.layers[i][1]
            start[sl] = theta[sl]
            if names[i] in buffers:
                b = buffers[names[i]]
                start[flat.num_params + b.start : flat.num_params + b.stop] = theta[
                    flat.num_params + b.start : flat.num_params + b.stop
                ]
        return start

    def perturbation_scale(self, xi: Tensor, universal: list[int], client: ClientContext) -> Tensor | None:
        """diag(Λ) per parameter: ξ_l (or 1) on the universal layers, 0 on the personal ones; None
        for Λ = I over every layer."""
        layers = list(client.layout.layer_slices().values())
        if self.scale == "identity" and len(universal) == len(layers):
            return None
        scores = xi if self.scale == "layer" else torch.ones_like(xi)
        picked = [layers[i] for i in universal]
        return layer_scale(scores[universal], picked, client.layout.num_params)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        w = payload["global"]
        theta_prev = client.state.get("personal", w)
        xi, personal, universal = self.split_layers(theta_prev, w, client)
        theta = self.personal_start(theta_prev, w, personal, client.flat)
        leaf = client.params(theta).detach().requires_grad_(True)  # shares theta's storage
        optimizer = torch.optim.SGD(
            [leaf], lr=client.lr, momentum=client.momentum, weight_decay=client.weight_decay
        )  # fresh momentum each round, as the fit's optimizer for w_i
        perturb = self.rho > 0 and len(universal) > 0
        context: dict[str, Any] = sam_context(
            self.rho if perturb else 0.0,  # ε ≡ 0 (read by the stacked form; the step checks ``perturb``)
            self.p,
            self.perturbation_scale(xi, universal, client) if perturb else None,
            theta=theta,
            theta_params=leaf,
            theta_optimizer=optimizer,
            ascent=self.ascent,
            perturb=perturb,
        )
        trained = client.fit(w, terms=self.local_terms(client, payload), objective=PLGULFObjective, context=context)
        client.state["personal"] = theta
        return Upload(trained, client.num_samples)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        return client.state.get("personal", server["global"])


class GRepBodyObjective(SAMObjective):
    """PLGU-GRep's body update on one mini-batch, with the head frozen by the fit's terms: one
    optimizer step φ ← φ − η∇F_B(h, φ + ε), ε = ρ Λ g/‖g‖ over the body region from g = ∇F_B(h, φ)
    (Eqs. 12–13; two forward/backward passes, one when ε ≡ 0).

    ``pre_step`` first takes Eq. 11's plain step φ_i = φ − η∇_φF_B(h, φ) and builds ε at φ_i: two
    optimizer steps and three passes per mini-batch. Returns the loss at the step's starting point.
    """

    @staticmethod
    def stacks_as_sam(context: dict[str, Any]) -> bool:
        """Without ``pre_step`` the step is SAM's own, so clients' fits stack (``pfl.engine.stacked``)."""
        return not context["pre_step"]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int = 0) -> Tensor:
        if not self.fit_context["pre_step"]:
            return super().training_step(batch, batch_idx)
        x, y = batch
        loss = self.backward_at_current(x, y)
        self.optimizers().step()
        super().training_step(batch, batch_idx)
        return loss


@register
class PLGUGRep(FedRep):
    """PLGU-GRep (scheme II, Algorithm 3, on FedRep).

    Client i, round t, with the received representation (body) φ̃ and its own head h_i:

    1. ``head_epochs`` (K) epochs on the head with the body frozen (Eq. 9; FedRep's head phase).
    2. ξ = ``layer_scores``(φ̃_i, φ̃) over the body layers (Eq. 10), φ̃_i the body the client trained
       last time (uniform at its first participation); Λ = diag(ξ) per body parameter.
    3. ``client.epochs`` epochs of ``GRepBodyObjective`` updates with the head frozen, one per body
       mini-batch: the LWSAM step with ε over the body only, its norm taken over the body's
       gradient (Eqs. 12–13).
    4. The server averages the bodies (FedRep).

    Step count. Algorithm 3 samples one body mini-batch per round and updates φ̃ once on it
    ("by (10)–(13)", line 11). pfl runs FedRep's body phase (``client.epochs`` epochs, one update per
    mini-batch) and makes each update that LWSAM step, so PLGU-GRep and FedRep take the same number
    of body steps and differ only in ε: with ρ = 0 this is FedRep bit for bit (tested). Eqs. 11 and 13
    as printed are two updates on that mini-batch (a plain step, then the perturbed one: "one more SGD
    step"); ``pre_step`` takes Eq. 11's step before every body update, which on an epoch-based body
    phase doubles FedRep's body steps (one extra per mini-batch, not one per round). The measured
    bottom-5 % gain of that variant over FedRep came from the extra steps, not from LWSAM
    (docs/plgu.md). Eq. 13 prints the final update with g (Eq. 11's gradient); it is taken with g̃,
    the gradient at φ_i + ε, as SAM does.

    Args:
        personal_layers: head layers kept on the client (FedRep: the classifier).
        head_epochs: K, head epochs per round (paper: 5).
        rho: radius ρ of the LWSAM perturbation (paper: 0.05).
        p: the ℓ_p ball (2: SAM/LWSAM).
        pre_step: take Eq. 11's plain SGD step before each LWSAM step (two updates and three passes
            per mini-batch); False (default): the LWSAM step alone (one update, two passes).
    """

    name = "plgu_grep"
    description = "FedRep whose body steps are LWSAM steps over the body layers (PLGU)"

    def __init__(
        self, personal_layers: int = 1, head_epochs: int = 5, rho: float = 0.05, p: float = 2.0, pre_step: bool = False
    ):
        super().__init__(personal_layers=personal_layers, head_epochs=head_epochs)
        require(rho >= 0, "method.rho", f"must be >= 0 (got {rho})")
        require(p >= 1, "method.p", f"must be >= 1 (got {p})", "the ℓ_p ball needs p >= 1 (2 is SAM)")
        self.rho, self.p, self.pre_step = rho, p, pre_step

    def shared_mask(self, layout):
        require(
            self.personal_layers < layout.num_layers,
            "method.personal_layers",
            f"leaves no body layer to perturb ({self.personal_layers} of {layout.num_layers} layers)",
            "keep at least one shared layer",
        )
        return super().shared_mask(layout)

    def body_scale(self, client: ClientContext, start: Tensor, body: slice) -> Tensor:
        """diag(Λ) per parameter: ξ over the body layers (Eq. 10), 0 on the head."""
        layers = [sl for _, sl in client.layout.layers if sl.stop <= body.stop]
        own = client.state.get("personal")
        theta = client.params(own if own is not None else start)
        xi = layer_scores(theta, client.params(start), layers)
        return layer_scale(xi, layers, client.layout.num_params)

    def train(self, client: ClientContext, start: Tensor) -> Tensor:
        head = client.layout.tail(self.personal_layers)
        body = slice(0, head.start)
        scale = self.body_scale(client, start, body)
        state = start
        if self.head_epochs > 0:
            state = client.fit(
                state, epochs=self.head_epochs, terms=[Freeze(client.params(state), body)], purpose="head"
            )
        context = sam_context(self.rho, self.p, scale, body, pre_step=self.pre_step)
        frozen = Freeze(client.params(state), head)
        return client.fit(state, terms=[frozen], objective=GRepBodyObjective, context=context)
