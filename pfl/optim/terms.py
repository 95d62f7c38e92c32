"""Terms a method adds to the plain local loss, applied to flat gradient/parameter vectors.

A term acts after backward (``on_grad``: add to the gradient, i.e. a term of the objective whose
gradient is known in closed form) and/or after the optimizer step (``on_step``: an exact proximal
step). Methods compose them instead of re-writing the same arithmetic.
"""

from __future__ import annotations

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
