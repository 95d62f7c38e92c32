"""The client side: one LightningModule and one worker per process, reused for every client.

The worker holds the model in a FlatModule, the federation's tensors (already on the device) and
one optimizer over the flat parameter vector. Training a client is: copy its start vector in,
run epochs of index-batched steps, read the vector out. Nothing is rebuilt per client or per round.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pfl.data.federated import FederatedData
from pfl.flat import FlatModule
from pfl.optim.terms import Term
from pfl.seeding import seed_everything, torch_generator


class ClientModule(L.LightningModule):
    """The local objective's data term: cross-entropy of the network on a batch.

    Method-specific terms (proximal, auxiliary gradients, ...) are composed on top by the worker
    from ``pfl.optim.terms``, so this module stays the same for every method.
    """

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int = 0) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)


@dataclass
class FitStats:
    num_samples: int  # local training set size
    samples_seen: int  # samples processed (epochs x size)
    steps: int
    loss: float  # mean training loss over the last epoch
    seconds: float


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


@dataclass
class TrainSettings:
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0


class Worker:
    """Trains and evaluates any client by loading its vectors into one reusable model."""

    def __init__(
        self,
        net: nn.Module,
        data: FederatedData,
        settings: TrainSettings,
        seed: int,
        fabric: L.Fabric | None = None,
        eval_batch_size: int = 4096,
    ):
        self.fabric = fabric
        self.device = fabric.device if fabric is not None else torch.device("cpu")
        self.module = ClientModule(net.to(self.device))
        self.flat = FlatModule(self.module.net)
        self.data = data.to(self.device)
        self.settings = settings
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        hp = {"lr": settings.lr, "momentum": settings.momentum, "weight_decay": settings.weight_decay}
        # With terms: one optimizer over the flat vector, gradients accumulated into flat views that
        # the terms read and change. Without: the per-tensor optimizer on fresh gradients, which is
        # exactly what a plain PyTorch loop does (the same update, fewer passes over memory).
        self.optimizer = torch.optim.SGD([self.flat.flat_param], **hp)
        self.tensor_optimizer = torch.optim.SGD(self.flat.tensors, **hp)

    # -- training -------------------------------------------------------------------------------
    def fit(
        self,
        cid: int,
        start: Tensor,
        round_idx: int,
        *,
        epochs: int | None = None,
        terms: Sequence[Term] = (),
        purpose: str = "train",
        lr: float | None = None,
    ) -> FitStats:
        """Train client ``cid`` from ``start`` (a full state vector) on its train split.

        Every random draw is keyed by (seed, round, client, purpose): the result does not depend on
        which clients were trained before this one, nor on which process trains it.
        """
        self.flat.load(start)
        epochs = self.settings.epochs if epochs is None else epochs
        lr = self.settings.lr if lr is None else lr
        seed_everything(self.seed, round_idx, cid, purpose)
        gen = torch_generator(self.seed, round_idx, cid, purpose, "batches", device=self.device)
        idx = self.data.clients[cid].train
        n, bs = len(idx), self.settings.batch_size
        optimizer = self.optimizer if terms else self.tensor_optimizer
        optimizer.param_groups[0]["lr"] = lr
        optimizer.state.clear()  # fresh momentum per local update unless a method restores it
        self.module.train()
        params, grads = self.flat.params, self.flat.grads
        if not terms:
            self.flat.release_grads()
        steps, loss_sum, last_epoch_batches = 0, torch.zeros((), device=self.device), 0
        t0 = time.perf_counter()
        for epoch in range(epochs):
            order = idx[torch.randperm(n, generator=gen, device=self.device)]
            if epoch == epochs - 1:
                loss_sum.zero_()
            for start_i in range(0, n, bs):
                b = order[start_i : start_i + bs]
                if terms:
                    grads.zero_()
                else:
                    optimizer.zero_grad(set_to_none=True)
                loss = self._loss((self.data.x[b], self.data.y[b]), steps)
                loss.backward()
                for term in terms:
                    term.on_grad(params, grads)
                optimizer.step()
                for term in terms:
                    term.on_step(params, lr)
                steps += 1
                if epoch == epochs - 1:
                    loss_sum += loss.detach()
                    last_epoch_batches += 1
        seconds = time.perf_counter() - t0
        if not terms:
            self.flat.attach_grads()  # callers outside fit may rely on p.grad viewing flat.grads
        mean_loss = float(loss_sum) / max(last_epoch_batches, 1)
        return FitStats(n, n * epochs, steps, mean_loss, seconds)

    def _loss(self, batch: tuple[Tensor, Tensor], step: int) -> Tensor:
        if self.fabric is not None:
            with self.fabric.autocast():
                return self.module.training_step(batch, step)
        return self.module.training_step(batch, step)

    def snapshot(self) -> Tensor:
        return self.flat.snapshot()

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, state: Tensor, idx: Tensor) -> EvalStats:
        """Accuracy and summed loss of the model ``state`` on pool samples ``idx``."""
        self.flat.load(state)
        self.module.eval()
        correct, loss_sum = 0, 0.0
        for s in range(0, len(idx), self.eval_batch_size):
            b = idx[s : s + self.eval_batch_size]
            logits = self.module(self.data.x[b]).float()
            y = self.data.y[b]
            correct += int((logits.argmax(1) == y).sum())
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        return EvalStats(correct, loss_sum, len(idx))

    @torch.no_grad()
    def evaluate_many(self, state: Tensor, splits: Sequence[Tensor]) -> list[EvalStats]:
        """``evaluate`` of one model on many index sets (e.g. every client's test split) in one pass:
        batches run over their concatenation and stats are split back per set by index_add."""
        self.flat.load(state)
        self.module.eval()
        sizes = torch.tensor([len(s) for s in splits], device=self.device)
        idx = torch.cat(list(splits)) if splits else torch.zeros(0, dtype=torch.long, device=self.device)
        owner = torch.repeat_interleave(torch.arange(len(splits), device=self.device), sizes)
        correct = torch.zeros(len(splits), dtype=torch.long, device=self.device)
        loss_sum = torch.zeros(len(splits), dtype=torch.float64, device=self.device)
        for s in range(0, len(idx), self.eval_batch_size):
            b, who = idx[s : s + self.eval_batch_size], owner[s : s + self.eval_batch_size]
            logits = self.module(self.data.x[b]).float()
            y = self.data.y[b]
            correct.index_add_(0, who, (logits.argmax(1) == y).long())
            loss_sum.index_add_(0, who, F.cross_entropy(logits, y, reduction="none").double())
        rows = zip(correct.tolist(), loss_sum.tolist(), sizes.tolist(), strict=True)
        return [EvalStats(int(c), float(v), int(n)) for c, v, n in rows]
