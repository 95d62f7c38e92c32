"""Vectorized local training: the sampled clients of a round trained together, one stacked step for
all of them (``torch.func.functional_call`` + ``vmap(grad)`` over a (clients × parameters) matrix).

How it plugs in: during a round the loop hands each local update a ``DeferredWorker`` instead of the
worker. Its ``fit`` records the request and returns at once; the trained state it hands back is a
tensor that ``flush`` fills after training every recorded request together (grouped by epochs,
learning rate, momentum, purpose and terms). This is exact for local updates that only pass trained
states on (into the upload or the client's state) without reading them: the loop enables it for
such methods only (FedAvg, FedProx, Local, Ditto: ``Method.vectorizable``).

What is supported (anything else is refused before training, ``unsupported``):

- SGD with momentum and weight decay, and the terms ``Proximal`` (FedProx; Ditto's ``gradient``
  mode) and ``ProximalStep`` (Ditto's ``exact`` mode). The step is the engine's own: the terms'
  ``on_grad``/``on_step`` and torch's functional SGD, applied to the (clients × parameters) matrix
  with the anchors stacked one row per client;
- models without float buffers (no BatchNorm running statistics: GroupNorm/LayerNorm are fine) and
  without active dropout (both would need per-client state or random streams inside ``vmap``);
- ``*-true`` precisions (no autocast, no gradient scaler); training-batch augmentation (applied per
  client from its own keyed generator, as in the sequential path).

Batches: each client draws exactly the sequential path's keyed batch orders. At step s every client
contributes its s-th batch; batches shorter than the longest one at that step are padded with a
repeated index and masked out of the loss (the loss is the mean over the real samples), and a client
whose batches are used up is masked out of the step entirely (no gradient, no weight decay, no
momentum update), so clients of different sizes train exactly as they would alone. The padded work is
wasted: the cost of a step is that of the largest batch times the number of clients, and the number of
steps is the largest client's. Results equal the sequential path's up to float summation order
(tests: within 1e-5).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.optim.sgd import sgd

from pfl.engine.terms import Proximal, ProximalStep, Term
from pfl.engine.worker import DEFAULT_FIT, FitSpec, FitStats, Worker
from pfl.seeding import torch_generator

TERMS = (Proximal, ProximalStep)


class NotVectorizable(RuntimeError):
    """A local update asked for something the vectorized path cannot do exactly."""


def unsupported(worker: Worker, precision: str = "32-true") -> list[str]:
    """Why this worker's model and settings cannot be trained vectorized (empty: they can)."""
    reasons = []
    if worker.flat.num_buffers:
        reasons.append("the model has float buffers (BatchNorm running statistics); use GroupNorm or LayerNorm")
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in worker.module.net.modules()):
        reasons.append("the model has dropout")
    if "mixed" in precision or worker.scaler is not None:
        reasons.append(f"precision {precision} uses autocast/a gradient scaler; use a *-true precision")
    return reasons


@dataclass
class FitRequest:
    cid: int
    start: Tensor
    round_idx: int
    epochs: int
    purpose: str
    lr: float
    momentum: float
    terms: tuple[Term, ...]
    out: Tensor  # filled by the flush: the trained state
    stats: FitStats  # filled by the flush

    def group(self) -> tuple:
        kinds = tuple((type(t).__name__, float(t.mu if isinstance(t, Proximal) else t.lam)) for t in self.terms)
        return (self.epochs, self.purpose, self.lr, self.momentum, self.round_idx, kinds)


class VectorTrainer:
    """Trains groups of fits with one vmapped step per batch position."""

    def __init__(self, worker: Worker, compile: bool = False):
        self.worker = worker
        net, flat = worker.module.net, worker.flat
        slices, shapes = flat.param_slices, flat.param_shapes
        task_loss = worker.module.loss
        regression = worker.task == "regression"

        def loss(p: Tensor, x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
            params = {name: p[sl].view(shapes[name]) for name, sl in slices.items()}
            out = functional_call(net, params, (x,))
            if regression:
                out = out.squeeze(-1)
            per_sample = task_loss(out, y, reduction="none")
            return (per_sample * mask).sum() / mask.sum().clamp_min(1)

        step: Callable[..., tuple[Tensor, Tensor]] = vmap(grad_and_value(loss))
        self.step = torch.compile(step, dynamic=True) if compile else step

    def train(self, requests: Sequence[FitRequest]) -> None:
        """Train every request; requests of one group share one stacked loop."""
        groups: dict[tuple, list[FitRequest]] = {}
        for r in requests:
            groups.setdefault(r.group(), []).append(r)
        for group in groups.values():
            self._train_group(group)

    def _train_group(self, reqs: list[FitRequest]) -> None:
        w = self.worker
        started = time.perf_counter()
        first = reqs[0]
        p = w.flat.num_params
        params = torch.stack([r.start[:p] for r in reqs]).clone()
        terms = _stacked_terms(reqs, p)
        lr = first.lr
        hp = {"weight_decay": w.settings.weight_decay, "momentum": first.momentum, "lr": lr}
        buf: Tensor | None = None  # SGD momentum, one row per client (None before the first step)
        idx = [w.split(r.cid).train for r in reqs]
        sizes = [len(i) for i in idx]
        bs = w.settings.batch_size
        gens = [torch_generator(w.seed, r.round_idx, r.cid, r.purpose, "batches", device=w.device) for r in reqs]
        aug = [
            torch_generator(w.seed, r.round_idx, r.cid, r.purpose, "augment", device=w.device) if w.augment else None
            for r in reqs
        ]
        loss_sum = torch.zeros(len(reqs), device=params.device)
        last_batches = [0] * len(reqs)
        steps = [0] * len(reqs)
        for epoch in range(first.epochs):
            orders = [
                i[torch.randperm(n, generator=g, device=w.device)] for i, n, g in zip(idx, sizes, gens, strict=True)
            ]
            last_epoch = epoch == first.epochs - 1
            for s in range(max((math.ceil(n / bs) for n in sizes), default=0)):
                batches = [o[s * bs : (s + 1) * bs] for o in orders]
                width = max(len(b) for b in batches)
                active = torch.tensor([len(b) > 0 for b in batches], device=params.device).unsqueeze(1)
                x, y, mask = self._padded(batches, aug, width, params.dtype)
                grads, loss = self.step(params, x, y, mask)
                params, buf = _sgd_step(params, grads, buf, active, terms, hp)
                for k, b in enumerate(batches):
                    if len(b):
                        steps[k] += 1
                        last_batches[k] += last_epoch
                if last_epoch:
                    loss_sum += torch.where(active.squeeze(1), loss.detach().float(), 0.0)
        seconds = (time.perf_counter() - started) / len(reqs)
        losses = loss_sum.tolist()
        for k, r in enumerate(reqs):
            r.out[:p].copy_(params[k])
            r.out[p:].copy_(r.start[p:])
            r.stats.steps, r.stats.seconds = steps[k], seconds
            r.stats.loss = losses[k] / last_batches[k] if last_batches[k] else float("nan")  # as Worker.fit

    def _padded(
        self, batches: list[Tensor], aug: list[torch.Generator | None], width: int, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(inputs, targets, mask) of shape (clients, width, ...): each client's batch, augmented from
        its own generator, padded with its first sample (masked out)."""
        w = self.worker
        xs, ys, masks = [], [], []
        for b, gen in zip(batches, aug, strict=True):
            n = len(b)
            pad = b[:1].expand(width - n) if n else torch.zeros(width, dtype=torch.long, device=w.device)
            x, y = w.data.x[b], w.data.y[b]
            if gen is not None and n:
                x = w.augment(x, gen)
            x = torch.cat([x, w.data.x[pad]]) if width > n else x
            y = torch.cat([y, w.data.y[pad]]) if width > n else y
            xs.append(x)
            ys.append(y)
            m = torch.zeros(width, dtype=dtype, device=w.device)
            m[:n] = 1
            masks.append(m)
        return torch.stack(xs), torch.stack(ys), torch.stack(masks)


def _stacked_terms(reqs: list[FitRequest], p: int) -> list[Term]:
    """The group's terms (one kind and coefficient per group) with anchors stacked one row per client,
    so the engine's own ``on_grad``/``on_step`` act on the (clients × parameters) matrix."""
    terms = reqs[0].terms
    if len(terms) > 1:
        raise NotVectorizable("at most one proximal term per fit")
    stacked = []
    for k, term in enumerate(terms):
        rows = copy.copy(term)
        rows.anchor = torch.stack([r.terms[k].anchor.reshape(-1)[:p] for r in reqs])  # type: ignore[attr-defined]
        stacked.append(rows)
    return stacked


def _sgd_step(
    params: Tensor, grads: Tensor, buf: Tensor | None, active: Tensor, terms: Sequence[Term], hp: dict[str, float]
) -> tuple[Tensor, Tensor | None]:
    """One step of the engine's update for every client at once: the terms' ``on_grad``, torch's SGD
    (weight decay, momentum), the terms' ``on_step``. Rows of clients without a batch at this step
    (``active`` false) keep their parameters and momentum."""
    for term in terms:
        term.on_grad(params, grads)
    new = params.clone()
    bufs = [None if buf is None else buf.clone()]
    sgd([new], [grads], bufs, foreach=False, dampening=0.0, nesterov=False, maximize=False, **hp)
    for term in terms:
        term.on_step(new, hp["lr"])
    # Before the first step every client with data is active (step 0 of epoch 0), so a buffer
    # created then holds each such client's own first gradient.
    if bufs[0] is not None:
        buf = bufs[0] if buf is None else torch.where(active, bufs[0], buf)
    return torch.where(active, new, params), buf


class DeferredWorker:
    """Stands in for the worker during a round's local updates: ``fit`` records, ``flush`` trains.

    Everything but training (settings, data, splits, the flat layout) is the worker's own. Calls that
    would need a trained state before the flush (gradients, evaluation, momentum read-back) are
    refused, so an unsuitable method fails loudly instead of reading an unfilled tensor."""

    def __init__(self, worker: Worker, trainer: VectorTrainer):
        self._worker = worker
        self._trainer = trainer
        self._requests: list[FitRequest] = []
        self._pending: set[int] = set()
        self._last: Tensor | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)

    def fit(self, cid: int, start: Tensor, round_idx: int, spec: FitSpec = DEFAULT_FIT) -> FitStats:
        terms = spec.terms
        if spec.loss_fn is not None or spec.objective is not None or spec.momentum_buffer is not None:
            raise NotVectorizable("custom losses, objectives and kept momentum are trained sequentially")
        if spec.indices is not None:
            raise NotVectorizable("fits on a subset of the train split (indices) are trained sequentially")
        if any(type(t) not in TERMS for t in terms) or len(terms) > 1:
            raise NotVectorizable(f"terms {[type(t).__name__ for t in terms]} have no vector form here")
        inputs = [start, *(t.anchor for t in terms)]
        if any(t.untyped_storage().data_ptr() in self._pending for t in inputs):
            self.flush()  # this fit starts from (or is anchored at) a state not trained yet
        s = self._worker.settings
        n = len(self._worker.split(cid).train)
        epochs = s.epochs if spec.epochs is None else spec.epochs
        out = torch.empty_like(start)
        stats = FitStats(n, n * epochs, 0, float("nan"), 0.0)
        lr = s.lr if spec.lr is None else spec.lr
        mom = s.momentum if spec.momentum is None else spec.momentum
        request = FitRequest(cid, start, round_idx, epochs, spec.purpose, lr, mom, tuple(terms), out, stats)
        self._requests.append(request)
        self._pending.add(out.untyped_storage().data_ptr())
        self._last = out
        return stats

    def snapshot(self) -> Tensor:
        """The state the last ``fit`` will have trained (filled by ``flush``)."""
        assert self._last is not None
        return self._last

    def flush(self) -> None:
        """Train every recorded fit and fill their states and statistics."""
        requests, self._requests, self._pending = self._requests, [], set()
        if requests:
            self._trainer.train(requests)

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise NotVectorizable("this local update reads trained states during the round; train it sequentially")

    momentum_buffer = gradient = mean_gradient = evaluate = batches = epoch_batches = _refuse


__all__ = ["DeferredWorker", "FitRequest", "NotVectorizable", "VectorTrainer", "unsupported"]
