"""What one local fit is, apart from the engine that trains it: its options (``FitSpec``), the run's
settings (``TrainSettings``), what it reports (``FitStats``, ``EvalStats``) and the batches it draws
(``keyed_batches``). Kept free of Lightning, so that reading a method's interface (``pfl fit --help``,
``pfl.methods.base``) imports no trainer."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from pfl.engine.stacked_loss import StackedLoss
    from pfl.engine.terms import Term


def mean_of(losses: list[Tensor]) -> float:
    """Mean of a fit's batch losses, summed in order in float32 (a vectorized fit sums the same way);
    NaN for a fit without batches (epochs = 0), which the round's train.loss then leaves out.
    One stack and one read of the values; numpy's float32 adds round as torch's do."""
    if not losses:
        return float("nan")
    values = torch.stack(losses).float().tolist()
    total = np.float32(values[0])
    for value in values[1:]:
        total = total + np.float32(value)
    return float(total) / len(losses)


LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]  # (net, x, y) -> scalar loss


@dataclass
class FitStats:
    num_samples: int  # local training set size
    samples_seen: int  # samples processed (epochs x size)
    steps: int
    # Mean training loss over the last epoch: a float, or that epoch's batch losses until it is read
    # (the round reads every client's at its end, where one warm pass beats a cold one per fit).
    _loss: float | list[Tensor]
    seconds: float

    @property
    def loss(self) -> float:
        if not isinstance(self._loss, float):
            self._loss = mean_of(self._loss)
        return self._loss

    @loss.setter
    def loss(self, value: float) -> None:
        self._loss = value


@dataclass
class EvalStats:
    correct: int
    loss_sum: float
    count: int

    @property
    def acc(self) -> float:
        return self.correct / max(self.count, 1)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.count, 1)


@dataclass(frozen=True)
class TrainSettings:
    """A run's local-training settings (``client.*`` with the method's overrides), fixed for the run:
    what changes with the round is computed from them (``lr_at``), never written into them."""

    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    augment: str = "none"  # training-batch augmentation (pfl.data.augment): none | cifar | flip
    drop_last: bool = False  # drop each epoch's last, incomplete batch (unless it is the only one)
    keep_momentum: bool = False  # "train" fits continue the client's SGD momentum from its previous one
    lr_decay: float = 1.0  # the learning rate of round r is lr · lr_decay^r (lr_at)

    def lr_at(self, round_idx: int) -> float:
        """The learning rate of the fits of round ``round_idx`` (``lr`` · ``lr_decay``^round_idx)."""
        return self.lr * self.lr_decay**round_idx


@dataclass(frozen=True)
class FitSpec:
    """The options of one local fit (``ClientTrainer.train``; ``ClientContext.fit`` documents each).

    None means the run's setting (``TrainSettings``): epochs, lr, momentum."""

    epochs: int | None = None
    terms: Sequence[Term] = ()
    purpose: str = "train"  # keys the fit's random draws, and its kept momentum
    lr: float | None = None
    momentum: float | None = None
    momentum_buffer: Tensor | None = None  # SGD momentum to continue from (``ClientTrainer.momentum_buffer``)
    loss_fn: LossFn | None = None  # ``loss_fn(net, x, y)`` replaces the cross-entropy data term
    # A ClientModule subclass (pfl.engine.trainer) whose ``training_step`` is the objective; typed as a
    # plain class here so that this module never imports the engine that imports it.
    objective: type | None = None
    context: dict[str, Any] | None = None  # the objective's ``fit_context``
    indices: Tensor | None = None  # train on these pool samples instead of the train split
    # loss_fn restated for the stacked trainer (pfl.engine.stacked_loss); the sequential worker ignores it
    stacked_loss: StackedLoss | None = None


DEFAULT_FIT = FitSpec()


def kept_samples(n: int, batch_size: int, drop_last: bool) -> int:
    """How many of an epoch's ``n`` shuffled samples are trained: all, or with ``drop_last`` all but the
    last incomplete batch (unless that batch is the only one)."""
    return n - n % batch_size if drop_last and n >= batch_size else n


def batches_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    """The batches ``keyed_batches`` draws per epoch from ``n`` samples."""
    return math.ceil(kept_samples(n, batch_size, drop_last) / batch_size)


def keyed_batches(
    gen: torch.Generator, idx: Tensor, epochs: int, batch_size: int, drop_last: bool
) -> Iterator[tuple[int, Tensor]]:
    """(epoch, index batch) pairs of ``idx``, reshuffled every epoch from ``gen`` (``ClientTrainer.epoch_batches``
    documents ``drop_last``). The one place a fit's batches are drawn: the sequential worker and the
    stacked trainer (``pfl.engine.stacked``) both take theirs from here."""
    n, bs = len(idx), batch_size
    stop = kept_samples(n, bs, drop_last)
    for epoch in range(epochs):
        order = idx[torch.randperm(n, generator=gen, device=gen.device)]
        for s in range(0, stop, bs):
            yield epoch, order[s : s + bs]
