"""Stacked training: several clients' fits as one (clients × parameters) matrix, one vmapped step per
batch position (``torch.func.functional_call`` + ``vmap(grad_and_value)``).

A ``FitRequest`` is one client's fit (what ``Worker.fit`` would do with its ``FitSpec``); ``StackedTrainer.train``
trains a list of them, grouped by the structure of their terms (``pfl.engine.terms``: kinds and, for
``Freeze``, the slice). Inside a group every client keeps its own learning rate, momentum, epochs,
initial momentum buffer, terms' tensors and coefficients, and samples (its train split or
``indices``), and draws exactly the sequential worker's keyed batches (``keyed_batches``, with
``drop_last``) and augmentation. At step s every client contributes its s-th batch of the fit (over
all its epochs); shorter batches are padded with a repeated index and masked out of the loss (the
mean over the real samples), and a client whose batches are used up is masked out of the step (its
parameters, momentum and terms' state stay), so each client trains exactly as it would alone, up to
float summation order. The cost of a step is that of the largest batch times the number of clients.

The step is the engine's: the terms' ``on_grad``, SGD with weight decay and per-client momentum
(a zero buffer where a client has none: 0·m + g is torch's first-step buffer g), the terms'
``on_step``; with SAM's objective (``pfl.engine.sam``: FedSAM, PLGU-GRep's body steps) the gradient is
the second pass's, at w + ε with each client's ε. A learning rate or coefficient shared by the group is
applied with torch's own scalar arithmetic (as the sequential step), per-client ones as columns. What a
fit needs that this cannot do exactly (a custom loss or another objective, a term without a stacked
form: ``spec_problem``; a model with float buffers or active dropout, autocast or a gradient scaler:
``model_problems``) is left to the lockstep dispatcher (``pfl.engine.lockstep``), which trains such
fits on the worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from pfl.engine.sam import SAMObjective
from pfl.engine.terms import Term, add_scaled_, coefficient, stack_terms, stackable
from pfl.engine.worker import FitSpec, FitStats, Worker, keyed_batches
from pfl.optim.sharpness import perturbation


def model_problems(worker: Worker, precision: str = "32-true") -> list[str]:
    """Why no fit of this worker's model and settings can be stacked (empty: they can)."""
    reasons = []
    if worker.flat.num_buffers:
        reasons.append("the model has float buffers (BatchNorm running statistics); use GroupNorm or LayerNorm")
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in worker.module.net.modules()):
        reasons.append("the model has dropout")
    if "mixed" in precision or worker.scaler is not None:
        reasons.append(f"precision {precision} uses autocast/a gradient scaler; use a *-true precision")
    return reasons


@dataclass(frozen=True)
class SAMRow:
    """One client's SAM step settings (``pfl.engine.sam``'s ``fit_context``)."""

    rho: float
    p: float
    scale: Tensor | None
    region: slice


def sam_row(spec: FitSpec) -> SAMRow | None:
    """The SAM settings of a fit whose objective is SAM's plain step: ``SAMObjective`` itself, or a
    subclass whose own ``stacks_as_sam(context)`` says its step is that one with this context."""
    cls = spec.objective
    if cls is None or not issubclass(cls, SAMObjective):
        return None
    ctx = spec.context or {}
    own = cls.__dict__.get("stacks_as_sam")
    if cls is not SAMObjective and (own is None or not own.__func__(ctx)):
        return None
    return SAMRow(ctx["rho"], ctx.get("p", 2.0), ctx.get("scale"), ctx.get("region") or slice(0, None))


def spec_problem(spec: FitSpec) -> str | None:
    """Why this fit's options have no stacked form (None: they have)."""
    if spec.loss_fn is not None:
        return "a custom loss (loss_fn)"
    if spec.objective is not None and sam_row(spec) is None:
        return f"a custom objective ({spec.objective.__name__})"
    for term in spec.terms:
        if not stackable(term):
            return f"the term {type(term).__name__}, which has no stacked form"
    return None


@dataclass
class FitRequest:
    """One client's fit. ``out`` and ``stats`` are filled by the training; ``buffer_out`` is the SGD
    momentum the worker's ``momentum_buffer()`` would return after the fit."""

    cid: int
    start: Tensor
    round_idx: int
    epochs: int
    purpose: str
    lr: float
    momentum: float
    terms: tuple[Term, ...]
    out: Tensor
    stats: FitStats
    buffer: Tensor | None = None  # momentum to continue from (FitSpec.momentum_buffer)
    indices: Tensor | None = None  # pool samples to train on instead of the train split
    sam: SAMRow | None = None  # each step a SAM step (pfl.engine.sam)
    buffer_out: Tensor | None = field(default=None, repr=False)

    @classmethod
    def of(cls, worker: Worker, cid: int, start: Tensor, round_idx: int, spec: FitSpec) -> FitRequest:
        """The request ``worker.fit(cid, start, round_idx, spec)`` stands for (settings read now)."""
        s = worker.settings
        epochs = s.epochs if spec.epochs is None else spec.epochs
        n = len(worker.split(cid).train if spec.indices is None else spec.indices)
        return cls(
            cid,
            start,
            round_idx,
            epochs,
            spec.purpose,
            s.lr if spec.lr is None else spec.lr,
            s.momentum if spec.momentum is None else spec.momentum,
            tuple(spec.terms),
            torch.empty_like(start),
            FitStats(n, n * epochs, 0, float("nan"), 0.0),
            spec.momentum_buffer,
            spec.indices,
            sam_row(spec),
        )

    def group(self) -> tuple:
        sam = None if self.sam is None else (self.sam.region.start, self.sam.region.stop)
        return (sam, *(t.stack_key() for t in self.terms))


class StackedTrainer:
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
        # Compiled, every step pads to the batch size: one input width, so a short last batch never
        # compiles another graph.
        self.static_width = compile

    def train(self, requests: Sequence[FitRequest]) -> None:
        """Train every request; requests with the same term structure share one stacked loop."""
        groups: dict[tuple, list[FitRequest]] = {}
        for r in requests:
            groups.setdefault(r.group(), []).append(r)
        for group in groups.values():
            self._train_group(group)

    def _train_group(self, reqs: list[FitRequest]) -> None:
        w = self.worker
        started = time.perf_counter()
        p, k = w.flat.num_params, len(reqs)
        params = torch.stack([r.start[:p] for r in reqs]).clone()
        dtype = params.dtype
        terms = stack_terms([r.terms for r in reqs])
        lr = coefficient([r.lr for r in reqs], params)  # a float when shared: torch's SGD arithmetic exactly
        moms = [float(r.momentum) for r in reqs]
        mom = torch.tensor(moms, dtype=dtype, device=params.device).unsqueeze(1)
        buf = None
        if any(moms):
            buf = torch.stack([torch.zeros_like(params[0]) if r.buffer is None else r.buffer for r in reqs])
        wd = w.settings.weight_decay
        streams = [self._stream(r) for r in reqs]
        augment = [w.fit_generators(r.cid, r.round_idx, r.purpose)[1] for r in reqs]
        steps = [0] * k
        losses: list[list[Tensor]] = [[] for _ in reqs]
        # With equal epochs the clients step epoch by epoch (a client done with its epoch waits for the
        # others: the same number of steps, and each epoch's batches stacked together); with unequal
        # epochs each client goes through all of its batches at its own pace.
        aligned = len({r.epochs for r in reqs}) == 1
        upcoming = [next(s, None) for s in streams]
        while any(d is not None for d in upcoming):
            epoch = min(d[0] for d in upcoming if d is not None)
            drawn = [d if d is not None and (not aligned or d[0] == epoch) else None for d in upcoming]
            upcoming = [next(s, None) if d is not None else u for s, d, u in zip(streams, drawn, upcoming, strict=True)]
            batches = [d[1] if d is not None else None for d in drawn]
            active = torch.tensor([b is not None for b in batches], device=params.device).unsqueeze(1)
            x, y, mask = self._padded(batches, augment, dtype)
            grads, loss = self.step(params, x, y, mask)
            if reqs[0].sam is not None:
                grads = self._sam_gradient(reqs, params, grads, x, y, mask)
            for term in terms:
                if hasattr(term, "active"):  # a stateful stacked term updates the active rows only
                    term.active = active  # type: ignore[attr-defined]
                term.on_grad(params, grads)
            if wd:
                grads = grads.add(params, alpha=wd)
            if buf is not None:
                buf = torch.where(active, buf * mom + grads, buf)
                grads = buf
            new = add_scaled_(params.clone(), grads, -lr)
            for term in terms:
                term.on_step(new, lr)
            params = torch.where(active, new, params)
            loss = loss.detach()
            for j, d in enumerate(drawn):
                if d is not None:
                    steps[j] += 1
                    if d[0] == reqs[j].epochs - 1:
                        losses[j].append(loss[j])
        for term in terms:
            finish = getattr(term, "finish", None)
            if finish is not None:
                finish()
        seconds = (time.perf_counter() - started) / k
        for j, r in enumerate(reqs):
            r.out[:p].copy_(params[j])
            r.out[p:].copy_(r.start[p:])
            r.stats.steps, r.stats.seconds = steps[j], seconds
            r.stats._loss = losses[j]  # averaged when read, as Worker.fit's
            r.buffer_out = _buffer_after(r, None if buf is None else buf[j], steps[j])

    def _sam_gradient(
        self, reqs: list[FitRequest], params: Tensor, grads: Tensor, x: Tensor, y: Tensor, mask: Tensor
    ) -> Tensor:
        """SAM's second pass for every client (``SharpnessStep.two_pass``): the gradient at w + ε,
        ε = ``perturbation`` of the client's own gradient over its region, with its ρ, p and Λ."""
        region = reqs[0].sam.region  # type: ignore[union-attr] # one region per group
        eps = []
        for r, g in zip(reqs, grads, strict=True):
            sam = r.sam
            assert sam is not None
            scale = None if sam.scale is None else sam.scale[region]
            eps.append(perturbation(g[region], sam.rho, sam.p, scale) if sam.rho else torch.zeros_like(g[region]))
        perturbed = params.clone()
        perturbed[:, region] += torch.stack(eps)
        return self.step(perturbed, x, y, mask)[0]

    def _stream(self, r: FitRequest) -> Iterator[tuple[int, Tensor]]:
        w = self.worker
        gen, _ = w.fit_generators(r.cid, r.round_idx, r.purpose)
        idx = w.split(r.cid).train if r.indices is None else r.indices
        return keyed_batches(gen, idx, r.epochs, w.settings.batch_size, w.settings.drop_last)

    def _padded(
        self, batches: list[Tensor | None], augment: list[torch.Generator | None], dtype: torch.dtype
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(inputs, targets, mask) of shape (clients, width, ...): each client's batch, augmented from
        its own generator, padded with its first sample (masked out); a client without a batch gets
        a fully masked batch of sample 0."""
        w = self.worker
        width = max(len(b) for b in batches if b is not None)
        if self.static_width:
            width = max(width, w.settings.batch_size)
        xs, ys, masks = [], [], []
        for b, gen in zip(batches, augment, strict=True):
            n = 0 if b is None else len(b)
            if b is None:
                pad = torch.zeros(width, dtype=torch.long, device=w.device)
                x, y = w.data.x[pad], w.data.y[pad]
            else:
                x, y = w.data.x[b], w.data.y[b]
                if gen is not None:
                    x = w.augment(x, gen)
                if width > n:
                    pad = b[:1].expand(width - n)
                    x, y = torch.cat([x, w.data.x[pad]]), torch.cat([y, w.data.y[pad]])
            xs.append(x)
            ys.append(y)
            m = torch.zeros(width, dtype=dtype, device=w.device)
            m[:n] = 1
            masks.append(m)
        return torch.stack(xs), torch.stack(ys), torch.stack(masks)


def _buffer_after(r: FitRequest, trained: Tensor | None, steps: int) -> Tensor | None:
    """What ``Worker.momentum_buffer()`` returns after this fit: torch keeps no buffer without
    momentum (a restored one stays as it was), and none is created before the first step."""
    if not r.momentum or steps == 0 or trained is None:
        return None if r.buffer is None else r.buffer.clone()
    return trained.clone()


__all__ = ["FitRequest", "StackedTrainer", "model_problems", "spec_problem"]
