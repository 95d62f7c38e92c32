"""Terms a method adds to the plain local loss, applied to flat gradient/parameter vectors.

A term acts after backward (``on_grad``: add to the gradient, i.e. a term of the objective whose
gradient is known in closed form) and/or after the optimizer step (``on_step``: an exact proximal
step). Methods compose them instead of re-writing the same arithmetic.
"""

from __future__ import annotations

import torch
from torch import Tensor


class Term:
    def on_grad(self, params: Tensor, grads: Tensor) -> None:  # noqa: B027 - optional hook
        """Add this term's gradient to ``grads`` in place."""

    def on_step(self, params: Tensor, lr: float) -> None:  # noqa: B027 - optional hook
        """Adjust ``params`` in place after the optimizer step."""


class Proximal(Term):
    """μ/2 · ‖θ − anchor‖², gradient μ(θ − anchor) (FedProx; Ditto as in its official code)."""

    def __init__(self, anchor: Tensor, mu: float):
        self.anchor, self.mu = anchor, mu

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads.add_(params - self.anchor, alpha=self.mu)


class ProximalStep(Term):
    """λ/2 · ‖θ − anchor‖² taken as an exact proximal step after each gradient step on f:
    θ ← (θ + ηλ·anchor) / (1 + ηλ). Stable for any λ (λ → ∞ pins θ to the anchor), and equal to the
    explicit gradient step to first order in ηλ."""

    def __init__(self, anchor: Tensor, lam: float):
        self.anchor, self.lam = anchor, lam

    def on_step(self, params: Tensor, lr: float) -> None:
        c = lr * self.lam
        params.add_(self.anchor, alpha=c).div_(1.0 + c)


class LinearTerm(Term):
    """⟨v, θ⟩: adds a constant vector v to every gradient (PGFed's auxiliary gradient, SCAFFOLD-style
    control variates, FedDyn's linear term)."""

    def __init__(self, vector: Tensor):
        self.vector = vector

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads.add_(self.vector)


class Freeze(Term):
    """Keeps ``params[sl]`` fixed: zeroes its gradient (so momentum never builds up there) and
    restores the values after every step (exact even with weight decay)."""

    def __init__(self, params: Tensor, sl: slice):
        self.sl, self.values = sl, params[sl].detach().clone()

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads[self.sl].zero_()

    def on_step(self, params: Tensor, lr: float) -> None:
        params[self.sl].copy_(self.values)


class ExtraParamSGD(Term):
    """SGD (with optional momentum and weight decay, as ``torch.optim.SGD``) on a tensor that lives
    outside the model, e.g. APFL's personal model or FedRoD's personal head, whose gradient a custom
    loss fills during the same backward. ``buf`` is the momentum buffer: it lives as long as the term
    (one fit), and a method may set it beforehand to continue an earlier one."""

    def __init__(self, tensor: Tensor, lr: float | None = None, momentum: float = 0.0, weight_decay: float = 0.0):
        self.tensor, self.lr, self.momentum, self.weight_decay = tensor, lr, momentum, weight_decay
        self.buf: Tensor | None = None

    def on_step(self, params: Tensor, lr: float) -> None:
        grad = self.tensor.grad
        if grad is None:
            return
        with torch.no_grad():
            if self.weight_decay:
                grad = grad.add(self.tensor, alpha=self.weight_decay)
            if self.momentum:
                self.buf = grad.clone() if self.buf is None else self.buf.mul_(self.momentum).add_(grad)
                grad = self.buf
            self.tensor.sub_(grad, alpha=self.lr if self.lr is not None else lr)
        self.tensor.grad = None
