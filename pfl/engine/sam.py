"""Sharpness-aware local steps (SAM, LWSAM, ℓ_p) as a Lightning-style objective of the training engine.

``SAMObjective`` is a ``ClientModule`` with ``automatic_optimization = False``. Any method trains with
it through ``client.fit(start, objective=SAMObjective, context=sam_context(rho, p, scale, region))``;
each mini-batch B is one SAM step (Foret et al. 2021; FedSAM is FedAvg with it):

1. zero_grad, forward, backward: g = ∇F_B(w) in the flat gradient;
2. ε = ``perturbation(g[R], ρ, p, Λ[R])`` over the region R (all parameters by default), formed in
   place in the gradient; w[R] += ε (p = 2, Λ = I: ε = ρ g/‖g‖₂; with Λ: LWSAM's ε = ρ Λ g/‖g‖₂);
3. zero_grad, forward, backward at w + ε;
4. w[R] restored by copy (bit for bit, ``SharpnessStep.two_pass``); the float buffers (BatchNorm
   running statistics) restored to their values after pass 1, so the perturbed forward leaves no trace;
5. ``optimizers().step()``: the fit's optimizer (momentum, weight decay), its terms (proximal, linear,
   freeze: evaluated at w with the gradient from w + ε) and the gradient scaler, as for a plain step.

Memory: one reusable P-sized buffer (the copy of w[R] that restores it; ε itself lives in the gradient)
and one B-sized buffer for the float buffers. ρ = 0 skips steps 2–4 entirely, so SAM with ρ = 0 is
SGD bit for bit. The perturbation is of the data loss only: terms are added to the final gradient,
not to g. Under a gradient scaler g is scaled, which leaves ε unchanged (ε depends on g's direction).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from pfl.engine.flat import FlatModule
from pfl.engine.trainer import ClientModule
from pfl.optim.sharpness import SharpnessStep

SAM_KEYS = ("rho", "p", "scale", "region")


def sam_context(
    rho: float, p: float = 2.0, scale: Tensor | None = None, region: slice | None = None, **extra: Any
) -> dict[str, Any]:
    """The ``fit_context`` of ``SAMObjective`` (checked here so a bad value fails before training).

    ``rho``: radius ρ ≥ 0; ``p``: the ℓ_p ball (≥ 1); ``scale``: diag(Λ) per parameter, over the whole
    parameter vector (``pfl.optim.sharpness.layer_scale``), None for Λ = I; ``region``: a contiguous
    slice of the parameter vector that is perturbed (and whose gradient norm normalises ε), None for
    all of it. ``extra``: further keys for subclasses.
    """
    if not rho >= 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if not p >= 1:
        raise ValueError(f"p must be >= 1, got {p}")
    if region is not None and (region.start is None or region.stop is None or region.step not in (None, 1)):
        raise ValueError(f"region must be a plain slice(start, stop), got {region}")
    return {"rho": float(rho), "p": float(p), "scale": scale, "region": region, **extra}


class SAMObjective(ClientModule):
    """One SAM step per mini-batch (see the module docstring); ``fit_context`` from ``sam_context``."""

    automatic_optimization = False

    def __init__(self, net: nn.Module, task: str = "classification"):
        super().__init__(net, task)
        self.sharpness = SharpnessStep()
        self._buffers_backup: Tensor | None = None

    # -- pieces subclasses compose ------------------------------------------------------------------
    @property
    def flat(self) -> FlatModule:
        """The worker's model as flat vectors (the parameters being trained, their gradient, buffers)."""
        return self.optimizers().worker.flat

    def batch_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The data loss at the model's current parameters."""
        return self.loss(self(x), y)

    def backward_at_current(self, x: Tensor, y: Tensor) -> Tensor:
        """Overwrite the flat gradient with ∇F_B at the current parameters; returns the (graph-free) loss."""
        self.optimizers().zero_grad()
        loss = self.batch_loss(x, y)
        self.manual_backward(loss)
        return loss.detach()

    def perturbed_gradient(self, x: Tensor, y: Tensor, ascent_grad: Tensor | None = None) -> None:
        """Leave in the flat gradient ∇F_B at w + ε, with w unchanged afterwards.

        Without ``ascent_grad`` the flat gradient must hold g = ∇F_B(w) (``backward_at_current``) and
        ε is built from it; with it, ε is built from ``ascent_grad`` (a full parameter-sized vector,
        e.g. another model's gradient as in PLGU-LF) and the forward at w + ε is w's only one on this
        batch, so its buffer update is kept.
        """
        ctx = self.fit_context
        region = ctx.get("region") or slice(0, None)
        scale = ctx.get("scale")
        flat = self.flat
        keep = ascent_grad is not None
        self.sharpness.two_pass(
            flat.params[region],
            flat.grads[region],
            self._grad_fn(x, y, flat, restore_buffers=not keep),
            ctx["rho"],
            ctx.get("p", 2.0),
            None if scale is None else scale[region],
            None if ascent_grad is None else ascent_grad[region],
        )

    def _grad_fn(self, x: Tensor, y: Tensor, flat: FlatModule, restore_buffers: bool) -> Callable[[], None]:
        def grad_fn() -> None:
            saved = self._save_buffers(flat) if restore_buffers else None
            self.backward_at_current(x, y)
            if saved is not None:
                with torch.no_grad():
                    flat.buffers.copy_(saved)

        return grad_fn

    def _save_buffers(self, flat: FlatModule) -> Tensor | None:
        if flat.num_buffers == 0:
            return None
        buf = self._buffers_backup
        if buf is None or buf.shape != flat.buffers.shape or buf.device != flat.buffers.device:
            buf = self._buffers_backup = torch.empty_like(flat.buffers)
        return buf.copy_(flat.buffers)

    # -- the step -----------------------------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int = 0) -> Tensor:
        x, y = batch
        loss = self.backward_at_current(x, y)
        self.perturbed_gradient(x, y)
        self.optimizers().step()
        return loss
