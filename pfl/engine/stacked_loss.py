"""A custom loss in a form the stacked trainer can train for several clients at once.

A fit with a custom loss (``FitSpec.loss_fn``, e.g. APFL's mixture, FedRoD's two heads) closes over its
client's tensors and fills their ``.grad`` through autograd, which one vmapped step cannot do for
several clients. ``StackedLoss`` restates such a loss as a pure function of the model's flat
parameters, one tensor trained beside them (``extra``: the ``ExtraParamSGD`` among the fit's terms), the
batch and the client's constant tensors, returning one loss per sample. The stacked trainer
(``pfl.engine.stacked``) differentiates it for the parameters and the extra tensor of every client in
one vmapped step, masks the padded samples out of the mean, and takes the extra tensor's SGD step
(its lr, momentum and weight decay, as ``ExtraParamSGD.on_step``) beside the model's. The sequential
worker keeps using ``loss_fn``: a batch's mean of ``per_sample`` equals it up to float summation order,
which the registry-wide lockstep test checks (``tests/engine/test_lockstep_real_runs.py``).

Clients whose ``per_sample`` callables compare equal (a frozen dataclass with equal fields, a bound
method of the same instance) share one vmapped step, so everything a loss reads that differs between
clients must be ``extra`` or a constant. Models with running statistics or keyed dropout keep such fits
on the worker (their several forwards per step would each move the statistics, or draw masks, as the
stacked step does not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch.func import functional_call

from pfl.engine.terms import ExtraParamSGD


class _Call(nn.Module):
    """``forward(fn, *args) = fn(*args)``: ``functional_call`` of it runs any code of ``net``'s modules
    (its forward, a body and a head apart) with the parameters it is given."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class ParamsAt:
    """The model at a flat parameter vector: ``at(p, x)`` is its output on ``x``, ``at.run(p, fn, *args)``
    runs ``fn(*args)`` (code that calls ``at.net``'s modules) with the parameters ``p``, and
    ``at.loss(out, y)`` is the task's loss per sample (a regression's outputs squeezed to the targets')."""

    def __init__(
        self,
        net: nn.Module,
        named: Callable[[Tensor], dict[str, Tensor]],
        task_loss: Callable[..., Tensor],
        regression: bool,
    ):
        self.net, self._named, self._call = net, named, _Call(net)
        self._task_loss, self._regression = task_loss, regression

    def __call__(self, p: Tensor, x: Tensor) -> Tensor:
        return functional_call(self.net, self._named(p), (x,))

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        return self._task_loss(out.squeeze(-1) if self._regression else out, y, reduction="none")

    def run(self, p: Tensor, fn: Callable[..., Any], *args: Any) -> Any:
        params = {f"net.{name}": t for name, t in self._named(p).items()}
        return functional_call(self._call, params, (fn, *args))


PerSample = Callable[..., Tensor]  # (at: ParamsAt, p, extra, x, y, *constants) -> (batch,) losses


@dataclass(frozen=True, eq=False)
class StackedLoss:
    """A fit's custom loss as the stacked trainer trains it (the module docstring): ``per_sample(at, p,
    extra, x, y, *constants)`` gives one loss per sample at flat parameters ``p`` and extra tensor
    ``extra`` (a row each, inside ``vmap``); ``extra`` is the term that trains ``extra.tensor`` in the
    sequential fit (one of its ``terms``), ``constants`` the client's tensors the loss reads."""

    per_sample: PerSample
    extra: ExtraParamSGD
    constants: tuple[Tensor, ...] = ()

    def group_key(self) -> tuple:
        """Fits with equal keys share one vmapped step: the same loss, the same shapes."""
        return (self.per_sample, tuple(self.extra.tensor.shape), *(tuple(c.shape) for c in self.constants))


__all__ = ["ParamsAt", "PerSample", "StackedLoss"]
