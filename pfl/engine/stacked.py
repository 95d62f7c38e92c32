"""Stacked training: several clients' fits as one (clients × parameters) matrix, one vmapped step per
batch position (``torch.func.functional_call`` + ``vmap(grad_and_value)``).

A ``FitRequest`` is one client's fit (what ``ClientTrainer.train`` does with its ``FitSpec``); ``StackedTrainer.train``
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
the second pass's, at w + ε with each client's ε; with PLGU-LF's (``PersonalRow``) ε comes from a
personal model's gradient, that model trained by its own SGD step in the same loop. A learning rate
or coefficient shared by the group is applied with torch's own scalar arithmetic (as the sequential
step), per-client ones as columns. What a
fit needs that this cannot do exactly (a custom loss or another objective, a term without a stacked
form: ``spec_problem``; a model with float buffers or with dropout drawn from torch's global generator,
a gradient scaler: ``model_problems``) is left to the lockstep dispatcher (``pfl.engine.lockstep``),
which trains such fits on the worker. Keyed dropout (``pfl.models.dropout.KeyedDropout``) stacks: each
vmapped call gets every client's key of the step, and each client draws its sequential step's masks.
``mean_gradients`` is ``ClientTrainer.mean_gradient`` (PGFed's full pass) for several clients, one vmapped
pass per batch position.

Without BatchNorm's running statistics, a fit's padded batches are gathered step by step from one index
table built for the whole fit (``pfl.engine.batch_feed``), a few operations per step instead of a few per
client (with augmentation, each client's real rows are then augmented from its own generator); a step
trains only the clients with a batch at it, so the largest client of an unequal split no longer makes
every other one compute on padding until it is done; without terms, an extra tensor or a second pass,
its SGD step then reads and writes only those clients' rows (``_StackSGD.step_rows``), and a step where
every client has a batch selects nothing. The padded step, a custom loss's step and the
full pass are each compiled (``trainer.compile``) or, on CUDA, replayed from CUDA graphs
(``trainer.cuda_graphs``, ``pfl.engine.cuda_graphs``); every step is then padded to the batch size. A
method's own gradient calls (``batch_gradients``) are not padded (each is its batch's mean, as the
worker's): they are replayed from one graph per number of calls and batch width, and not compiled
(every new width would compile again).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from lightning.fabric.plugins.precision import MixedPrecision
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from pfl.engine.batch_feed import PaddedFeed, compact_pass, schedule_steps, widen
from pfl.engine.cuda_graphs import CapturedStep
from pfl.engine.sam import SAMObjective
from pfl.engine.stacked_loss import ParamsAt, StackedLoss
from pfl.engine.terms import Term, coefficient, scaled_sum, stack_terms, stackable
from pfl.engine.trainer import ClientTrainer, FitSpec, FitStats, keyed_batches
from pfl.models.dropout import KeyedDropout, dropout_key, step_key
from pfl.optim.sharpness import perturbation


def model_problems(worker: ClientTrainer, precision: str = "32-true") -> list[str]:
    """Why no fit of this worker's model and settings can be stacked (empty: they can)."""
    return net_problems(worker.module.net, precision, scaler=worker.scaler is not None)


def net_problems(net: nn.Module, precision: str = "32-true", scaler: bool = False) -> list[str]:
    """Why no fit of ``net`` (its structure only: a network built on the meta device will do) under
    ``precision`` can be stacked; ``scaler``: the worker has a gradient scaler."""
    reasons = []
    others = [type(m).__name__ for m in _buffer_modules(net) if not _stacked_batch_norm(m)]
    if others:
        reasons.append(
            f"the model has float buffers outside BatchNorm layers with a momentum ({', '.join(sorted(set(others)))})"
        )
    drawn = [type(m).__name__ for m in net.modules() if _global_dropout(m)]
    if drawn:
        reasons.append(
            f"the model has dropout drawn from torch's global generator ({', '.join(sorted(set(drawn)))}); "
            "pfl.models.dropout.KeyedDropout draws each client's own masks and stacks"
        )
    if precision in ("16-mixed", "16") or scaler:
        reasons.append(f"precision {precision} uses a gradient scaler; use bf16-mixed or a *-true precision")
    elif precision.startswith("transformer-engine"):
        reasons.append(f"precision {precision} has no stacked form; use bf16-mixed or a *-true precision")
    return reasons


def precision_name(worker: ClientTrainer) -> str:
    """The worker's Fabric precision (``32-true`` without Fabric), as ``model_problems`` reads it."""
    return str(getattr(worker.precision, "precision", "32-true"))


def forward_context(worker: ClientTrainer, cache: bool) -> Callable[[], AbstractContextManager]:
    """The stacked forward's context, as the sequential worker's ``autocast()``: bf16 autocast under
    ``bf16-mixed`` (``torch.autocast`` itself, which ``torch.compile`` traces; ``cache`` false: without
    its cast cache, as CUDA graph capture needs), Fabric's own forward context under a *-true precision
    (none for 32-true; the default dtype for 16/bf16-true)."""
    if isinstance(worker.precision, MixedPrecision):
        device = worker.device.type
        return lambda: torch.autocast(device_type=device, dtype=torch.bfloat16, cache_enabled=cache)
    return worker.autocast


@dataclass(frozen=True)
class PersonalRow:
    """A personal model trained beside the fit (PLGU-LF's θ_i): each step first takes one SGD step of
    it on the batch (its lr, momentum from a zero buffer, weight decay), whose gradient at the step's
    start is SAM's ascent gradient; its batch loss is the fit's reported loss. ``state`` (its full
    state vector, running statistics included) is overwritten in place with the trained one."""

    state: Tensor
    lr: float
    momentum: float
    weight_decay: float


@dataclass(frozen=True)
class SAMRow:
    """One client's SAM step settings (``pfl.engine.sam``'s ``fit_context``)."""

    rho: float
    p: float
    scale: Tensor | None
    region: slice
    personal: PersonalRow | None = None  # ε from a personal model's gradient (``stacked_personal``)


def sam_row(spec: FitSpec) -> SAMRow | None:
    """The SAM settings of a fit whose objective is SAM's plain step: ``SAMObjective`` itself, or a
    subclass whose own ``stacks_as_sam(context)`` says its step is that one with this context. A
    subclass whose ε comes from a personal model trained beside the fit also defines
    ``stacked_personal(context) -> PersonalRow`` (PLGU-LF)."""
    cls = spec.objective
    if cls is None or not issubclass(cls, SAMObjective):
        return None
    ctx = spec.context or {}
    own = cls.__dict__.get("stacks_as_sam")
    if cls is not SAMObjective and (own is None or not own.__func__(ctx)):
        return None
    hook = cls.__dict__.get("stacked_personal")
    personal = None if hook is None else hook.__func__(ctx)
    return SAMRow(ctx["rho"], ctx.get("p", 2.0), ctx.get("scale"), ctx.get("region") or slice(0, None), personal)


def _global_dropout(m: nn.Module) -> bool:
    """An active dropout layer that draws from torch's global generator (not ``KeyedDropout``)."""
    return isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and not isinstance(m, KeyedDropout)


def _buffer_modules(net: nn.Module) -> list[nn.Module]:
    """The modules that own float buffers (running statistics)."""
    return [m for m in net.modules() if any(b is not None and b.is_floating_point() for b in m._buffers.values())]


def _stacked_batch_norm(m: nn.Module) -> bool:
    """A BatchNorm layer whose running statistics stack: an exponential average (``momentum`` set; a
    cumulative one would read the module's shared ``num_batches_tracked``)."""
    return isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is not None


def spec_problem(spec: FitSpec) -> str | None:
    """Why this fit's options have no stacked form (None: they have)."""
    custom = spec.stacked_loss
    if spec.loss_fn is not None and custom is None:
        return "a custom loss (loss_fn)"
    if custom is not None and (spec.loss_fn is None or not any(t is custom.extra for t in spec.terms)):
        return "a stacked loss (stacked_loss) without the loss_fn and the extra tensor's term it restates"
    if spec.objective is not None and sam_row(spec) is None:
        return f"a custom objective ({spec.objective.__name__})"
    for term in _model_terms(spec):
        if not stackable(term):
            return f"the term {type(term).__name__}, which has no stacked form"
    return None


def _model_terms(spec: FitSpec) -> tuple[Term, ...]:
    """The fit's terms but the one that trains a stacked loss's extra tensor (the loss's own step)."""
    custom = spec.stacked_loss
    return tuple(t for t in spec.terms if custom is None or t is not custom.extra)


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
    buffer: Tensor | None  # momentum to continue from (FitSpec.momentum_buffer)
    indices: Tensor | None  # pool samples to train on instead of the train split
    sam: SAMRow | None  # each step a SAM step (pfl.engine.sam)
    loss: StackedLoss | None  # a custom loss and the extra tensor it trains (pfl.engine.stacked_loss)
    buffer_out: Tensor | None = field(default=None, repr=False)

    @classmethod
    def of(cls, worker: ClientTrainer, cid: int, start: Tensor, round_idx: int, spec: FitSpec) -> FitRequest:
        """The request ``worker.train(cid, start, round_idx, spec)`` stands for (settings read now)."""
        s = worker.settings
        epochs = s.epochs if spec.epochs is None else spec.epochs
        n = len(worker.split(cid).train if spec.indices is None else spec.indices)
        return cls(
            cid,
            start,
            round_idx,
            epochs,
            spec.purpose,
            s.lr_at(round_idx) if spec.lr is None else spec.lr,
            s.momentum if spec.momentum is None else spec.momentum,
            _model_terms(spec),
            torch.empty_like(start),
            FitStats(n, n * epochs, 0, float("nan"), 0.0),
            spec.momentum_buffer,
            spec.indices,
            sam_row(spec),
            spec.stacked_loss,
        )

    def group(self) -> tuple:
        sam = None if self.sam is None else (self.sam.region.start, self.sam.region.stop, self.sam.personal is None)
        loss = None if self.loss is None else self.loss.group_key()
        return (sam, loss, *(t.stack_key() for t in self.terms))


@dataclass
class GradientRequest:
    """One client's ``ClientTrainer.mean_gradient(cid, state, round_idx)`` (PGFed's uploaded ∇f_i and f_i).
    ``grad``, ``loss`` and ``state_out`` (the worker's state as the sequential pass leaves it: ``state``
    with BatchNorm's running statistics moved by its train-mode forwards) are filled by the pass."""

    cid: int
    state: Tensor
    round_idx: int
    grad: Tensor | None = field(default=None, repr=False)
    loss: float = math.nan
    state_out: Tensor | None = field(default=None, repr=False)


@dataclass
class BatchGradientRequest:
    """One ``ClientTrainer.gradient`` call of a method's own loop (pFedMe, Per-FedAvg, FedALA): the
    gradient of the task loss on the batch (``x``, ``y``: inputs already augmented as the call would)
    at ``params``. ``grad`` and ``loss`` are filled by the pass."""

    params: Tensor
    x: Tensor
    y: Tensor
    grad: Tensor | None = field(default=None, repr=False)
    loss: Tensor | None = field(default=None, repr=False)


class StackedTrainer:
    """Trains groups of fits with one vmapped step per batch position; ``mean_gradients`` is
    ``ClientTrainer.mean_gradient`` for several clients in one vmapped pass per batch position."""

    def __init__(self, worker: ClientTrainer, compile: bool = False, graphs: bool = False):
        self.worker = worker
        # Keyed dropout (pfl.models.dropout): every vmapped call then takes one more input, each
        # client's key of the step, so each client draws the masks of its sequential step.
        self.keyed = worker.keyed_dropout
        # trainer.cuda_graphs: the padded step replayed from CUDA graphs (pfl.engine.cuda_graphs)
        captured = self.captured = graphs and not compile and worker.device.type == "cuda"
        # the forward and loss in the fit's context, the backward outside, as ClientTrainer.train
        self._context = forward_context(worker, cache=not captured)
        self._named = _param_splitter(worker)
        module = worker.module
        self._at = ParamsAt(module.net, self._named, module.loss, worker.task == "regression")
        self.compiled = compile
        step, self.unpadded_step = self._vmapped(self._context)
        self.step = self._staged(step)
        # The mean gradient's pass, as ClientTrainer.gradient: its loss outside any forward context.
        gradient_step, self.unpadded_gradient_step = self._vmapped(contextlib.nullcontext)
        self.gradient_step = self._staged(gradient_step)
        # BatchNorm: each client's running statistics are a row of a (clients × buffers) matrix passed
        # through functional_call, which BatchNorm updates in place, row by row under vmap; its other
        # buffers (num_batches_tracked) are passed as throwaway copies. Batches are never padded
        # then (padding would enter the batch statistics): each step runs once per batch width.
        net = worker.module.net
        self.buffer_views = _buffer_views(net)
        self._others = {n: b for n, b in net.named_buffers() if not b.is_floating_point()}
        # A method's own gradient calls (batch_gradients) are unpadded: captured once per stack size and
        # batch width, on models without integer buffers (which would pass as inputs).
        self._batch_gradient = CapturedStep(self._bufferless_gradient) if captured and not self._others else None
        # Compiled or captured, every step pads to the batch size: one input width, so a short last
        # batch never compiles or captures another graph.
        self.static_width = compile or captured
        # Which clients a padded step trains (pfl.engine.batch_feed.stack_size): those with a batch; captured,
        # a power of two of them (a few graphs); compiled, all (another stack size would compile again).
        self.stack_rows = "all" if compile else "powers" if captured else "active"
        # Custom losses (pfl.engine.stacked_loss: one vmapped step per loss, compiled or captured as the step) and
        # a method's own gradient calls stack only on a model whose forwards move no running statistics and
        # draw no keyed masks: a custom loss may run several forwards per step, and a gradient call's pass
        # must change nothing but the gradient (Lockstep.stacks, LockstepTrainer.gradient).
        self.stacks_method_passes = not self.buffer_views and not self.keyed
        self._loss_steps: dict[Callable, Callable] = {}

    def _staged(self, step: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Tensor, Tensor]]:
        """A padded vmapped step as the trainer runs it: compiled (``trainer.compile``, its first call,
        where torch.compile traces and compiles, on the run's compile clock), replayed from CUDA graphs
        (``trainer.cuda_graphs``), or as it is."""
        if self.compiled:
            return self.worker.compile_clock.first_call(torch.compile(step, dynamic=True))
        return CapturedStep(step) if self.captured else step

    def _vmapped(self, context: Callable[[], AbstractContextManager]) -> tuple[Callable, Callable]:
        """The vmapped (gradient, loss) of the padded batch's masked mean loss and of the unpadded
        batch's loss (with BatchNorm's buffers), the forward and loss inside ``context``; with keyed
        dropout each takes the clients' step keys as its last input."""
        w = self.worker
        net, named = w.module.net, self._named
        task_loss, regression = w.module.loss, w.task == "regression"

        def keys(key: tuple[Tensor, ...]) -> AbstractContextManager:
            return dropout_key(key[0]) if key else contextlib.nullcontext()

        at = self._at

        def loss(p: Tensor, x: Tensor, y: Tensor, mask: Tensor, *key: Tensor) -> Tensor:
            with context(), keys(key):
                per_sample = at.loss(at(p, x), y)
            return _masked_mean(per_sample, mask)

        def unpadded_loss(p: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor, *key: Tensor) -> Tensor:
            tensors = named(p)
            with context(), keys(key):
                out = functional_call(net, {**tensors, **buffers}, (x,))
                return task_loss(out.squeeze(-1) if regression else out, y)

        return vmap(grad_and_value(loss)), vmap(grad_and_value(unpadded_loss))

    def _loss_step(self, loss: StackedLoss) -> Callable[..., tuple[Tensor, Tensor]]:
        """The vmapped (gradient, loss) of a custom loss's masked mean over the padded batch, for rows
        that are the model's flat parameters followed by the extra tensor (``pfl.engine.stacked_loss``);
        the loss's constants are its last inputs. One per loss, built at its first fit, compiled or
        replayed from CUDA graphs as the default loss's step (``_staged``)."""
        step = self._loss_steps.get(loss.per_sample)
        if step is None:
            p, per_sample, context, at = self.worker.flat.num_params, loss.per_sample, self._context, self._at

            def masked(row: Tensor, x: Tensor, y: Tensor, mask: Tensor, *constants: Tensor) -> Tensor:
                with context():
                    per = per_sample(at, row[:p], row[p:], x, y, *constants)
                return _masked_mean(per, mask)

            step = self._loss_steps[loss.per_sample] = self._staged(vmap(grad_and_value(masked)))
        return step

    def captured_steps(self) -> list[CapturedStep]:
        """The steps replayed from CUDA graphs (none uncaptured): the default loss's, the mean gradient's
        and each custom loss's built so far."""
        steps = [self.step, self.gradient_step, self._batch_gradient, *self._loss_steps.values()]
        return [s for s in steps if isinstance(s, CapturedStep)]

    def _keys(self, reqs: Sequence[FitRequest | GradientRequest], purpose: str | None, steps: Sequence[int]) -> tuple:
        """The vmapped calls' extra input: each client's dropout key of its step (none without keyed
        dropout); ``purpose`` None: each fit's own."""
        if not self.keyed:
            return ()
        w = self.worker
        keys = [
            step_key(w.seed, r.round_idx, r.cid, purpose or r.purpose, s)  # type: ignore[union-attr]
            for r, s in zip(reqs, steps, strict=True)
        ]
        return (torch.tensor(keys, dtype=torch.int64, device=w.device),)

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
        bufs = torch.stack([r.start[p:] for r in reqs]).clone()  # running statistics, one row per client
        dtype = params.dtype
        if self.buffer_views or self.keyed:
            w.module.net.train()  # as ClientTrainer.train: BatchNorm uses and updates batch statistics, dropout drops
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
        personal = _PersonalStack(reqs, params, bufs) if reqs[0].sam and reqs[0].sam.personal else None
        extra = _ExtraStack(reqs, params) if reqs[0].loss is not None else None
        step = self.step if reqs[0].loss is None else self._loss_step(reqs[0].loss)
        schedule = schedule_steps(streams, aligned)
        # Without running statistics, every step's padded batch is gathered from one index table built
        # for the whole fit: a few ops per step instead of a few per client.
        feed = None
        if not self.buffer_views:
            feed = PaddedFeed(schedule, w.settings.batch_size, self.static_width, dtype, params.device, self.stack_rows)
        # A plain step (no term, extra tensor or second pass) of some of the clients updates only their rows.
        plain = personal is None and extra is None and reqs[0].sam is None and not terms
        sgd = _StackSGD(lr, mom, wd)
        for s, drawn in enumerate(schedule):
            batches = [d[1] if d is not None else None for d in drawn]
            every = all(d is not None for d in drawn)  # every client has a batch at this step
            # every pass of the step draws the step's masks; a custom loss takes its constants instead
            keys = self._keys(reqs, None, steps) if extra is None else extra.constants
            sel = None
            if self.buffer_views:
                active = torch.tensor([b is not None for b in batches], device=params.device).unsqueeze(1)
                inputs = self._inputs(batches, augment)

                def pass_at(
                    q: Tensor, stats: Tensor, inputs: list = inputs, keys: tuple = keys
                ) -> tuple[Tensor, Tensor]:
                    return self._unpadded(q, stats, inputs, keys, self.unpadded_step)  # updates the rows of ``stats``
            else:
                assert feed is not None
                active, sel = feed.active[s], feed.selected[s]
                x, y, mask = feed.step(s, w.data.x, w.data.y)
                if w.augment is not None:
                    rows = feed.clients[s]
                    x = self._augmented(x, [batches[j] for j in rows], [augment[j] for j in rows])

                def pass_at(
                    q: Tensor, stats: Tensor, batch: tuple = (x, y, mask), keys: tuple = keys, sel: Tensor | None = sel
                ) -> tuple[Tensor, Tensor]:
                    g, value = compact_pass(step, q, batch, keys, sel)  # widened to one row per client
                    return widen(g, sel, len(q)), widen(value, sel, len(q))

            if plain and sel is not None:
                rows = params[sel]  # the step's input and the rows it moves
                g, value = step(rows, x, y, mask, *(key[sel] for key in keys))
                moving = len(sel) == sum(d is not None for d in drawn)  # no selected row without a batch
                buf = sgd.step_rows(params, rows, g, buf, sel, active, moving)  # in place: only those rows
                loss = widen(value, sel, k).detach()
            else:
                if personal is not None:
                    # PLGU-LF: θ's pass and SGD step, then w's only pass at w + ε(θ's gradient), its
                    # running statistics kept (``SAMObjective.perturbed_gradient`` with ``ascent_grad``).
                    ascent, loss = pass_at(personal.params, personal.bufs)
                    personal.step(ascent, active)
                    grads = pass_at(self._perturbed(reqs, params, ascent), bufs)[0]
                elif extra is not None:  # a custom loss: the model's and the extra tensor's gradients in one pass
                    joint, loss = pass_at(extra.joined(params), bufs)
                    grads = extra.step(joint, active)
                else:
                    grads, loss = pass_at(params, bufs)
                    if reqs[0].sam is not None:  # the second pass leaves no statistics behind
                        grads = pass_at(self._perturbed(reqs, params, grads), bufs.clone())[0]
                params, buf = sgd.step(params, grads, buf, active, every, terms)
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
        if personal is not None:
            personal.write_back()
        if extra is not None:
            extra.write_back(steps)
        seconds = (time.perf_counter() - started) / k
        for j, r in enumerate(reqs):
            r.out[:p].copy_(params[j])
            r.out[p:].copy_(bufs[j])
            r.stats.steps, r.stats.seconds = steps[j], seconds
            r.stats._loss = losses[j]  # averaged when read, as ClientTrainer.train's
            r.buffer_out = _buffer_after(r, None if buf is None else buf[j], steps[j])

    def mean_gradients(self, reqs: Sequence[GradientRequest]) -> None:
        """``ClientTrainer.mean_gradient`` of every request: at each batch position s, every client's s-th
        batch of its train split in index order (no augmentation, outside the fit's forward context,
        as ``ClientTrainer.gradient``) in one vmapped pass; each client's gradients summed in order and
        divided by its number of batches, its losses weighted by batch size in float64, as the
        worker does."""
        w = self.worker
        p, bs = w.flat.num_params, w.settings.batch_size
        params = torch.stack([r.state[:p] for r in reqs])
        bufs = torch.stack([r.state[p:] for r in reqs]).clone()
        if self.buffer_views or self.keyed:
            w.module.net.train()  # as ClientTrainer.gradient
        idxs = [w.split(r.cid).train for r in reqs]
        # each client's batches in index order (epoch 0 of the schedule; none for an empty split, as the
        # worker's), then None once it has none left
        batches = [[(0, i[s : s + bs]) for s in range(0, len(i), bs)] for i in idxs]
        schedule = [list(step) for step in itertools.zip_longest(*batches)]
        total = torch.zeros_like(params)
        losses: list[Tensor] = []
        feed = None
        if not self.buffer_views:
            feed = PaddedFeed(schedule, bs, self.static_width, params.dtype, params.device, self.stack_rows)
        for s, drawn in enumerate(schedule):
            keys = self._keys(reqs, "mean_gradient", [s] * len(reqs))
            if feed is None:
                inputs = [None if d is None else (w.data.x[d[1]], w.data.y[d[1]]) for d in drawn]
                active = torch.tensor([d is not None for d in drawn], device=params.device).unsqueeze(1)
                grads, loss = self._unpadded(params, bufs, inputs, keys, self.unpadded_gradient_step)
                total = torch.where(active, total + grads, total)
            else:
                sel = feed.selected[s]
                grads, loss = compact_pass(self.gradient_step, params, feed.step(s, w.data.x, w.data.y), keys, sel)
                if sel is None:
                    every = all(d is not None for d in drawn)
                    total = total + grads if every else torch.where(feed.active[s], total + grads, total)
                else:  # only the selected clients' rows gain a gradient
                    kept = total[sel]
                    total.index_copy_(0, sel, torch.where(feed.active[s][sel], kept + grads, kept))
                    loss = widen(loss, sel, len(reqs))
            losses.append(loss.detach())
        rows = torch.stack(losses).tolist() if losses else []  # one transfer: the float32 losses
        for j, r in enumerate(reqs):
            loss_sum = 0.0
            for s, (_, b) in enumerate(batches[j]):
                loss_sum += rows[s][j] * len(b)
            r.grad = total[j] / max(len(batches[j]), 1)
            r.loss = loss_sum / max(len(idxs[j]), 1)
            r.state_out = torch.cat([params[j], bufs[j]])

    def batch_gradients(self, reqs: Sequence[BatchGradientRequest]) -> None:
        """``ClientTrainer.gradient`` of every request, one vmapped pass per batch width (no padding:
        each gradient is of its batch's mean loss, as the worker's); only for models without float
        buffers or keyed dropout (``stacks_method_passes``)."""
        params = torch.stack([r.params for r in reqs])
        none = params.new_zeros((len(reqs), 0))  # no running statistics
        step = self.unpadded_gradient_step
        if self._batch_gradient is not None:
            captured = self._batch_gradient

            def step(p: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
                return captured(p, x, y)  # ``buffers`` is empty: only the model's parameters are inputs

        grads, loss = self._unpadded(params, none, [(r.x, r.y) for r in reqs], (), step)
        for j, r in enumerate(reqs):
            r.grad, r.loss = grads[j], loss[j]

    def _bufferless_gradient(self, p: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The unpadded gradient step of a model without buffers, its inputs all tensors (capturable)."""
        return self.unpadded_gradient_step(p, {}, x, y)

    def _perturbed(self, reqs: list[FitRequest], params: Tensor, grads: Tensor) -> Tensor:
        """SAM's perturbed point for every client (``SharpnessStep.two_pass``): w + ε, ε =
        ``perturbation`` of the client's own ascent gradient over its region, with its ρ, p and Λ."""
        region = reqs[0].sam.region  # type: ignore[union-attr] # one region per group
        eps = []
        for r, g in zip(reqs, grads, strict=True):
            sam = r.sam
            assert sam is not None
            scale = None if sam.scale is None else sam.scale[region]
            eps.append(perturbation(g[region], sam.rho, sam.p, scale) if sam.rho else torch.zeros_like(g[region]))
        perturbed = params.clone()
        perturbed[:, region] += torch.stack(eps)
        return perturbed

    def _stream(self, r: FitRequest) -> Iterator[tuple[int, Tensor]]:
        w = self.worker
        gen, _ = w.fit_generators(r.cid, r.round_idx, r.purpose)
        idx = w.split(r.cid).train if r.indices is None else r.indices
        return keyed_batches(gen, idx, r.epochs, w.settings.batch_size, w.settings.drop_last)

    def _inputs(
        self, batches: list[Tensor | None], augment: list[torch.Generator | None]
    ) -> list[tuple[Tensor, Tensor] | None]:
        """Each client's (inputs, targets) of this step, augmented from its own generator (None: no batch)."""
        w = self.worker
        out: list[tuple[Tensor, Tensor] | None] = []
        for b, gen in zip(batches, augment, strict=True):
            if b is None:
                out.append(None)
                continue
            x = w.data.x[b]
            out.append((w.augment(x, gen) if gen is not None else x, w.data.y[b]))
        return out

    def _augmented(self, x: Tensor, batches: list[Tensor | None], augment: list[torch.Generator | None]) -> Tensor:
        """The step's padded inputs (``x``, a fresh gather) with each client's batch augmented from its own
        generator, as ``_inputs`` does, and its padding rows copies of its first augmented sample."""
        for j, (b, gen) in enumerate(zip(batches, augment, strict=True)):
            if b is not None and gen is not None:
                n = len(b)
                x[j, :n] = self.worker.augment(x[j, :n], gen)
                x[j, n:] = x[j, :1]
        return x

    def _unpadded(
        self,
        params: Tensor,
        bufs: Tensor,
        inputs: list[tuple[Tensor, Tensor] | None],
        keys: tuple[Tensor, ...],
        step: Callable[..., tuple[Tensor, Tensor]],
    ) -> tuple[Tensor, Tensor]:
        """Gradients and losses of every client with a batch, one vmapped ``step`` per batch width (no
        padding), updating those clients' rows of ``bufs`` (BatchNorm's running statistics)."""
        grads, loss = torch.zeros_like(params), torch.zeros(len(params), dtype=params.dtype, device=params.device)
        widths: dict[int, list[int]] = {}
        for j, i in enumerate(inputs):
            if i is not None:
                widths.setdefault(len(i[1]), []).append(j)
        for rows in widths.values():
            idx = torch.tensor(rows, device=params.device)
            sub = bufs[idx]
            # One tensor per buffer (BatchNorm updates them in place; an update through a view of one
            # stacked matrix would not reach it under vmap), the integer ones as throwaway copies.
            buffers = {n: sub[:, sl].reshape(len(rows), *shape).clone() for n, sl, shape in self.buffer_views}
            buffers.update({n: b.expand(len(rows)).clone() for n, b in self._others.items()})
            x = torch.stack([inputs[j][0] for j in rows])  # type: ignore[index]
            y = torch.stack([inputs[j][1] for j in rows])  # type: ignore[index]
            g, value = step(params[idx], buffers, x, y, *(k[idx] for k in keys))
            for n, sl, _ in self.buffer_views:
                sub[:, sl] = buffers[n].reshape(len(rows), -1)
            grads[idx], loss[idx], bufs[idx] = g, value.to(loss.dtype), sub
        return grads, loss


class _StackSGD:
    """torch's SGD step (weight decay, momentum, lr) of a stacked fit's parameter rows, the clients with a
    batch at the step (``active``) moving and the others kept; ``lr`` a float or a column per client,
    ``mom`` a column per client, ``wd`` shared."""

    def __init__(self, lr: float | Tensor, mom: Tensor, wd: float):
        self.lr, self.mom, self.wd = lr, mom, wd

    def step(
        self, params: Tensor, grads: Tensor, buf: Tensor | None, active: Tensor, every: bool, terms: Sequence[Term]
    ) -> tuple[Tensor, Tensor | None]:
        """Every row's step, the terms' hooks around it: (parameters, momentum). ``every``: every client
        has a batch (nothing to keep, so no selection)."""
        for term in terms:
            if hasattr(term, "active"):  # a stateful stacked term updates the active rows only
                term.active = active  # type: ignore[attr-defined]
            term.on_grad(params, grads)
        new, buf = self._descent(params, grads, buf, self.mom, self.lr, active, every)
        for term in terms:
            term.on_step(new, self.lr)
        return (new if every else torch.where(active, new, params)), buf

    def step_rows(
        self,
        params: Tensor,
        rows: Tensor,
        grads: Tensor,
        buf: Tensor | None,
        sel: Tensor,
        active: Tensor,
        every: bool,
    ) -> Tensor | None:
        """The step of the rows ``sel`` only (a compacted step's clients: ``rows`` is ``params[sel]``,
        ``grads`` one row each), in place on ``params`` and on the momentum, which it returns: the same
        arithmetic row by row as ``step``, without reading or writing the rows of the clients the step left
        out. ``every``: each selected client has a batch (no row to keep)."""
        moving = active[sel]
        lr = self.lr if isinstance(self.lr, float) else self.lr[sel]
        kept = None if buf is None else buf[sel]
        new, kept = self._descent(rows, grads, kept, self.mom[sel], lr, moving, every)
        if buf is not None:
            buf.index_copy_(0, sel, kept)
        params.index_copy_(0, sel, new if every else torch.where(moving, new, rows))
        return buf

    def _descent(
        self,
        rows: Tensor,
        grads: Tensor,
        buf: Tensor | None,
        mom: Tensor,
        lr: float | Tensor,
        active: Tensor,
        every: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """The rows after torch's SGD step with weight decay and momentum (each row's momentum ``mom``,
        learning rate ``lr``), before keeping the rows without a batch, and the momentum, in which those
        rows are kept (``every``: there are none)."""
        if self.wd:
            grads = grads.add(rows, alpha=self.wd)
        if buf is not None:
            buf = buf * mom + grads if every else torch.where(active, buf * mom + grads, buf)
            grads = buf
        return scaled_sum(rows, grads, -lr), buf


class _RowSGD:
    """torch's SGD step (weight decay, momentum, lr) for rows of tensors trained beside the model,
    each row with its own settings; ``buf`` the rows' momentum (None without momentum; a zero row
    where a client starts without a buffer: 0·m + g is torch's first buffer g)."""

    def __init__(self, lrs: list[float], wds: list[float], moms: list[float], like: Tensor, buf: Tensor | None):
        self.lr, self.wd = coefficient(lrs, like), coefficient(wds, like)
        self.mom = torch.tensor(moms, dtype=like.dtype, device=like.device).unsqueeze(1)
        self.buf = buf

    def step(self, rows: Tensor, grads: Tensor, active: Tensor) -> Tensor:
        """``rows`` after one SGD step of the active ones."""
        if isinstance(self.wd, float):
            if self.wd:
                grads = grads.add(rows, alpha=self.wd)
        else:
            grads = grads + rows * self.wd.to(grads.dtype)
        if self.buf is not None:
            self.buf = torch.where(active, self.buf * self.mom + grads, self.buf)
            grads = self.buf
        return torch.where(active, scaled_sum(rows, grads, -self.lr), rows)


class _PersonalStack:
    """The personal models of a PLGU-LF group (``PersonalRow``): their parameters and running
    statistics as rows, trained by torch's SGD step row by row."""

    def __init__(self, reqs: list[FitRequest], params: Tensor, bufs: Tensor):
        self.rows = [r.sam.personal for r in reqs]  # type: ignore[union-attr]
        p = params.shape[1]
        self.params = torch.stack([row.state[:p] for row in self.rows]).to(params).clone()
        self.bufs = torch.stack([row.state[p:] for row in self.rows]).to(bufs).clone()
        moms = [float(row.momentum) for row in self.rows]
        buf = torch.zeros_like(params) if any(moms) else None
        self.sgd = _RowSGD([row.lr for row in self.rows], [row.weight_decay for row in self.rows], moms, params, buf)

    def step(self, grads: Tensor, active: Tensor) -> None:
        """One SGD step (weight decay, momentum, lr) of the active rows."""
        self.params = self.sgd.step(self.params, grads, active)

    def write_back(self) -> None:
        """Each trained personal model into its state vector, in place."""
        p = self.params.shape[1]
        for j, row in enumerate(self.rows):
            row.state[:p].copy_(self.params[j])
            row.state[p:].copy_(self.bufs[j])


class _ExtraStack:
    """The extra tensors of a custom-loss group (``StackedLoss.extra``, ``ExtraParamSGD``) as rows beside
    the model's parameters, their constants stacked, trained by the term's SGD step row by row."""

    def __init__(self, reqs: list[FitRequest], params: Tensor):
        losses = [r.loss for r in reqs]
        self.terms = [loss.extra for loss in losses]  # type: ignore[union-attr]
        self.p = params.shape[1]
        self.rows = torch.stack([t.tensor.detach().reshape(-1) for t in self.terms]).to(params)
        self.constants = tuple(torch.stack(c) for c in zip(*(loss.constants for loss in losses), strict=True))  # type: ignore[union-attr]
        moms = [float(t.momentum) for t in self.terms]
        buf = None
        if any(moms):  # a term's buffer (a kept one, set by its method) or a zero row
            zero = torch.zeros_like(self.rows[0])
            buf = torch.stack([zero if t.buf is None else t.buf.reshape(-1) for t in self.terms])
        lrs = [r.lr if t.lr is None else t.lr for r, t in zip(reqs, self.terms, strict=True)]
        self.sgd = _RowSGD(lrs, [t.weight_decay for t in self.terms], moms, params, buf)

    def joined(self, params: Tensor) -> Tensor:
        """Each client's row: its model parameters, then its extra tensor."""
        return torch.cat([params, self.rows], 1)

    def step(self, joint: Tensor, active: Tensor) -> Tensor:
        """The extra rows' SGD step with their part of the joint gradients; returns the model's part."""
        self.rows = self.sgd.step(self.rows, joint[:, self.p :], active)
        return joint[:, : self.p]

    def write_back(self, steps: list[int]) -> None:
        """Each trained extra tensor into its term's tensor, in place, and its momentum into the term's
        buffer where the sequential term would have one (momentum, and at least one step)."""
        buf = self.sgd.buf
        for j, t in enumerate(self.terms):
            with torch.no_grad():
                t.tensor.copy_(self.rows[j].view_as(t.tensor))
            if buf is not None and t.momentum and steps[j]:
                t.buf = buf[j].view_as(t.tensor).clone()


def _masked_mean(per_sample: Tensor, mask: Tensor) -> Tensor:
    """A padded batch's loss: the mean of its real samples' losses (``mask`` 1 for them, 0 for padding;
    a fully masked row gives 0)."""
    return (per_sample.to(mask.dtype) * mask).sum() / mask.sum().clamp_min(1)


def _param_splitter(worker: ClientTrainer) -> Callable[[Tensor], dict[str, Tensor]]:
    """A flat parameter row as the model's named parameters, consecutive pieces of it: split's backward
    is one concatenation, where a slice per parameter would write each gradient into a zero row and sum them."""
    slices, shapes = worker.flat.param_slices, worker.flat.param_shapes
    names = list(slices)
    sizes = [slices[n].stop - slices[n].start for n in names]

    def named(p: Tensor) -> dict[str, Tensor]:
        return {n: t.view(shapes[n]) for n, t in zip(names, p.split(sizes), strict=True)}

    return named


def _buffer_views(net: nn.Module) -> list[tuple[str, slice, torch.Size]]:
    """(name, slice of the flat buffers, shape) of each float buffer, in ``FlatModule``'s order."""
    views, offset = [], 0
    for prefix, m in net.named_modules():
        for name, b in m._buffers.items():
            if b is not None and b.is_floating_point():
                views.append((f"{prefix}.{name}" if prefix else name, slice(offset, offset + b.numel()), b.shape))
                offset += b.numel()
    return views


def _buffer_after(r: FitRequest, trained: Tensor | None, steps: int) -> Tensor | None:
    """What ``ClientTrainer.momentum_buffer()`` returns after this fit: torch keeps no buffer without
    momentum (a restored one stays as it was), and none is created before the first step."""
    if not r.momentum or steps == 0 or trained is None:
        return None if r.buffer is None else r.buffer.clone()
    return trained.clone()


__all__ = [
    "BatchGradientRequest",
    "FitRequest",
    "GradientRequest",
    "StackedTrainer",
    "forward_context",
    "model_problems",
    "net_problems",
    "precision_name",
    "spec_problem",
]
