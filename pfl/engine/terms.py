"""Terms a method adds to the plain local loss, applied to flat gradient/parameter vectors.

A term acts after backward (``on_grad``: add to the gradient, i.e. a term of the objective whose
gradient is known in closed form) and/or after the optimizer step (``on_step``: an exact proximal
step). Methods compose them instead of re-writing the same arithmetic.

Stacked forms: a class that defines its own ``stack`` classmethod can act on several clients' fits at
once (``pfl.engine.stacked``): ``stack(terms)`` takes one such term per client (all with the same
``stack_key``) and returns one term whose hooks act on (clients × parameters) matrices, with the
per-client tensors stacked one row per client. A coefficient (μ, λ, and ``on_step``'s ``lr``) is a
Python float when every client has the same one (then the hook is the sequential one's own arithmetic,
bit for bit), else a (clients × 1) float64 column. A subclass that does
not define ``stack`` itself has no stacked form (its hooks may differ from its parent's), so its fits
run one client at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


class Term:
    def on_grad(self, params: Tensor, grads: Tensor) -> None:  # noqa: B027 - optional hook
        """Add this term's gradient to ``grads`` in place."""

    def on_step(self, params: Tensor, lr: Any) -> None:  # noqa: B027 - optional hook
        """Adjust ``params`` in place after the optimizer step (``lr``: a float, or a column in a stacked form)."""

    def stack_key(self) -> tuple:
        """Terms of one stack agree on this (e.g. the frozen slice)."""
        return (type(self),)

    def trained(self) -> list[Tensor]:
        """Tensors outside the model that this term steps from their ``.grad`` (filled by the fit's
        backward): under a gradient scaler their gradients are unscaled with the model's."""
        return []


def stackable(term: Term) -> bool:
    """Whether ``term``'s own class defines a stacked form (``stack``), not only a parent of it."""
    return "stack" in type(term).__dict__


def stack_terms(rows: Sequence[Sequence[Term]]) -> list[Term]:
    """One stacked term per position of the clients' term lists (every list has the same keys)."""
    return [type(column[0]).stack(column) for column in zip(*rows, strict=True)]  # type: ignore[attr-defined]


def coefficient(values: Sequence[float], like: Tensor) -> float | Tensor:
    """Per-client coefficients: one float when they are all equal, else a (clients × 1) float64
    column on ``like``'s device."""
    first = float(values[0])
    if all(float(v) == first for v in values):
        return first
    return torch.tensor([float(v) for v in values], dtype=torch.float64, device=like.device).unsqueeze(1)


def add_scaled_(x: Tensor, y: Tensor, c: float | Tensor) -> Tensor:
    """x += c·y, with a float c as the sequential hooks do it (``add_(alpha=)``), a column row by row."""
    if isinstance(c, float):
        return x.add_(y, alpha=c)
    return x.add_(y * c.to(x.dtype))


def scaled_sum(x: Tensor, y: Tensor, c: float | Tensor) -> Tensor:
    """x + c·y as a new tensor: ``add_scaled_(x.clone(), y, c)``'s arithmetic without first copying x."""
    if isinstance(c, float):
        return torch.add(x, y, alpha=c)
    return torch.add(x, y * c.to(x.dtype))


def _rows(tensors: Sequence[Tensor]) -> Tensor:
    return torch.stack([t.reshape(-1) for t in tensors])


class Proximal(Term):
    """μ/2 · ‖θ − anchor‖², gradient μ(θ − anchor) (FedProx; Ditto as in its official code)."""

    def __init__(self, anchor: Tensor, mu: float):
        self.anchor, self.mu = anchor, mu

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads.add_(params - self.anchor, alpha=self.mu)

    @classmethod
    def stack(cls, terms: Sequence[Proximal]) -> Term:
        anchor = _rows([t.anchor for t in terms])
        return _ProximalRows(anchor, coefficient([t.mu for t in terms], anchor))


class _ProximalRows(Term):
    def __init__(self, anchor: Tensor, mu: float | Tensor):
        self.anchor, self.mu = anchor, mu

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        add_scaled_(grads, params - self.anchor, self.mu)


class ProximalStep(Term):
    """λ/2 · ‖θ − anchor‖² taken as an exact proximal step after each gradient step on f:
    θ ← (θ + ηλ·anchor) / (1 + ηλ). Stable for any λ (λ → ∞ pins θ to the anchor), and equal to the
    explicit gradient step to first order in ηλ."""

    def __init__(self, anchor: Tensor, lam: float):
        self.anchor, self.lam = anchor, lam

    def on_step(self, params: Tensor, lr: float) -> None:
        c = lr * self.lam
        params.add_(self.anchor, alpha=c).div_(1.0 + c)

    @classmethod
    def stack(cls, terms: Sequence[ProximalStep]) -> Term:
        anchor = _rows([t.anchor for t in terms])
        return _ProximalStepRows(anchor, coefficient([t.lam for t in terms], anchor))


class _ProximalStepRows(Term):
    def __init__(self, anchor: Tensor, lam: float | Tensor):
        self.anchor, self.lam = anchor, lam

    def on_step(self, params: Tensor, lr: float | Tensor) -> None:
        c = lr * self.lam  # in float64, as the sequential step's Python floats
        divisor = 1.0 + c
        add_scaled_(params, self.anchor, c).div_(divisor if isinstance(divisor, float) else divisor.to(params.dtype))


class LinearTerm(Term):
    """⟨v, θ⟩: adds a constant vector v to every gradient (PGFed's auxiliary gradient, SCAFFOLD-style
    control variates, FedDyn's linear term)."""

    def __init__(self, vector: Tensor):
        self.vector = vector

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads.add_(self.vector)

    @classmethod
    def stack(cls, terms: Sequence[LinearTerm]) -> Term:
        return LinearTerm(_rows([t.vector for t in terms]))  # adding a matrix is the same hook


class Freeze(Term):
    """Keeps ``params[sl]`` fixed: zeroes its gradient (so momentum never builds up there) and
    restores the values after every step (exact even with weight decay)."""

    def __init__(self, params: Tensor, sl: slice):
        self.sl, self.values = sl, params[sl].detach().clone()

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads[self.sl].zero_()

    def on_step(self, params: Tensor, lr: float) -> None:
        params[self.sl].copy_(self.values)

    def stack_key(self) -> tuple:
        return (Freeze, self.sl.start, self.sl.stop, self.sl.step)

    @classmethod
    def stack(cls, terms: Sequence[Freeze]) -> Term:
        return _FreezeRows(terms[0].sl, torch.stack([t.values for t in terms]))


class _FreezeRows(Term):
    def __init__(self, sl: slice, values: Tensor):
        self.sl, self.values = sl, values

    def on_grad(self, params: Tensor, grads: Tensor) -> None:
        grads[:, self.sl].zero_()

    def on_step(self, params: Tensor, lr: float | Tensor) -> None:
        params[:, self.sl].copy_(self.values)


class ExtraParamSGD(Term):
    """SGD (with optional momentum and weight decay, as ``torch.optim.SGD``) on a tensor that lives
    outside the model, e.g. APFL's personal model or FedRoD's personal head, whose gradient a custom
    loss fills during the same backward. ``buf`` is the momentum buffer: it lives as long as the term
    (one fit), and a method may set it beforehand to continue an earlier one."""

    def __init__(self, tensor: Tensor, lr: float | None = None, momentum: float = 0.0, weight_decay: float = 0.0):
        self.tensor, self.lr, self.momentum, self.weight_decay = tensor, lr, momentum, weight_decay
        self.buf: Tensor | None = None

    def trained(self) -> list[Tensor]:
        return [self.tensor]

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
