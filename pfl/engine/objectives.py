"""Local objectives written the Lightning way: ClientModule subclasses whose ``training_step`` is the
whole loss, differentiated by autograd. Each is the twin of a closed-form term in
``pfl.engine.terms`` (the fast path); ``make bench`` reports what the autograd path costs."""

from __future__ import annotations

from torch import Tensor

from pfl.engine.trainer import ClientModule


class ProximalObjective(ClientModule):
    """f(θ; B) + μ/2·‖θ − anchor‖², with ``fit_context = {"anchor": Tensor, "mu": float}``: the same
    gradient as ``terms.Proximal(anchor, mu)``, computed by autograd through the parameters."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int = 0) -> Tensor:
        x, y = batch
        anchor, mu = self.fit_context["anchor"], self.fit_context["mu"]
        return self.loss(self(x), y) + mu / 2 * (self.flat_params() - anchor).pow(2).sum()
