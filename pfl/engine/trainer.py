"""The local-training engine: one LightningModule and one ``ClientTrainer`` per process, reused for every
client (a method reaches it as ``ClientContext.worker``; the name predates the class's).

The trainer holds the model in a FlatModule, the federation's tensors (already on the device) and
one optimizer over the flat parameter vector. Training a client is: copy its start vector in,
run epochs of index-batched steps, read the vector out. Nothing is rebuilt per client or per round.

A local objective is either composed from terms (``pfl.engine.terms``: the fast path, closed-form
gradients added to the flat gradient) or written the Lightning way, as a ``ClientModule`` subclass
whose ``training_step`` returns the loss (or, with ``automatic_optimization = False``, drives
``self.optimizers()`` and ``self.manual_backward`` itself, e.g. for two-step objectives). Backward and
optimizer steps go through Fabric's precision plugin, so ``16-mixed`` gets its gradient scaler.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies import Strategy
from torch import Tensor, nn

from pfl.data.augment import from_config as augment_from_config
from pfl.data.federated import ClientSplit, FederatedData
from pfl.engine.compile_clock import CompileClock
from pfl.engine.fit_spec import (
    DEFAULT_FIT,
    EvalStats,
    FitSpec,
    FitStats,
    LossFn,
    TrainSettings,
    keyed_batches,
)
from pfl.engine.flat import FlatModule
from pfl.engine.terms import Term
from pfl.models.dropout import number_keyed_dropouts, set_dropout_key, step_key_tensor
from pfl.seeding import seed_everything, torch_generator


def task_of(data: FederatedData) -> str:
    """Regression when the targets are real numbers (the model then has one output), else classification."""
    return "regression" if data.y.is_floating_point() else "classification"


def direct_hooks(fabric: L.Fabric | None) -> tuple[bool, bool]:
    """(backward, forward): whether Fabric's ``backward`` is exactly ``loss.backward()`` and its
    forward context exactly none, i.e. the precision plugin and the strategy keep the base hooks."""
    if fabric is None:
        return True, True
    strategy, precision = fabric.strategy, fabric.strategy.precision
    plugin = type(precision)
    backward = type(strategy).backward is Strategy.backward and all(
        getattr(plugin, hook) is getattr(Precision, hook) for hook in ("pre_backward", "backward", "post_backward")
    )
    return backward, plugin.forward_context is Precision.forward_context


class ClientModule(L.LightningModule):
    """The local objective: cross-entropy (classification) or mean squared error (regression) of the
    network on a batch.

    Method-specific terms (proximal, auxiliary gradients, ...) are composed on top by the trainer from
    ``pfl.engine.terms``. A method may instead subclass this module and override ``training_step``;
    ``self.fit_context`` then holds what the method passed for this fit (e.g. the global model), and
    ``self.flat_params()`` is the parameter vector as a differentiable tensor.
    """

    def __init__(self, net: nn.Module, task: str = "classification"):
        super().__init__()
        self.net = net
        self.task = task
        self.fit_context: dict[str, Any] = {}
        self._worker_optimizer: Any = None
        self._worker_backward: Callable[[Tensor], None] | None = None

    def flat_params(self) -> Tensor:
        """All trainable parameters as one vector, in the flat layout, differentiable."""
        return torch.cat([p.reshape(-1) for p in self.net.parameters() if p.requires_grad])

    # Manual optimisation without Lightning's Trainer: the ClientTrainer's optimizer and Fabric-aware backward.
    def optimizers(self, use_pl_optimizer: bool = True) -> Any:  # noqa: ARG002 - Lightning's signature
        return self._worker_optimizer

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        assert self._worker_backward is not None, "manual_backward is only available during a ClientTrainer fit"
        self._worker_backward(loss)

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        return out.squeeze(-1) if self.task == "regression" else out

    def loss(self, out: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
        if self.task == "regression":
            return F.mse_loss(out, y, reduction=reduction)
        return F.cross_entropy(out, y, reduction=reduction)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int = 0) -> Tensor:
        x, y = batch
        return self.loss(self(x), y)


class StepOptimizer:
    """What a manual-optimisation ``training_step`` gets from ``self.optimizers()``: ``zero_grad`` and
    ``step`` on the flat parameter vector, with the fit's terms applied around the step and the
    precision plugin's gradient scaler honoured, exactly as in an automatic step."""

    def __init__(self, worker: ClientTrainer, optimizer: torch.optim.Optimizer, terms: Sequence[Term], lr: float):
        self.worker, self.optimizer, self.terms, self.lr = worker, optimizer, terms, lr

    def zero_grad(self, set_to_none: bool = False) -> None:  # noqa: ARG002 - the flat gradient is reused
        self.worker.flat.grads.zero_()

    def step(self) -> None:
        self.worker.apply_step(self.optimizer, self.terms, self.lr)


class ClientTrainer:
    """Trains and evaluates any client by loading its vectors into one reusable model: ``train`` is one
    local fit (its ``FitStats``), which ``ClientContext.fit`` wraps for methods (the trained vector)."""

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
        self.precision = fabric.strategy.precision if fabric is not None else None
        self.scaler: Any = getattr(self.precision, "scaler", None)  # 16-mixed's gradient scaler, else None
        self.compile_clock = CompileClock(self.device)  # trainer.compile: seconds its first compiled calls took
        # Fabric's backward and forward context are exactly loss.backward() and no context when the
        # plugin and strategy keep the base hooks (32-true, 64-true, ... on one device): call those
        # directly then, since the layers cost about a tenth of a small model's step.
        self._direct_backward, self._direct_forward = direct_hooks(fabric)
        self.task = task_of(data)
        net = net.to(self.device)
        if self.precision is not None:  # *-true precisions store the model in that dtype
            net = self.precision.convert_module(net)
        self.module = ClientModule(net, self.task)
        self.flat = FlatModule(self.module.net)
        self.keyed_dropout = number_keyed_dropouts(self.module.net)  # masks keyed per client and step
        self.data = data.to(self.device)
        dtype = self.flat.state.dtype
        if self.data.x.is_floating_point() and self.data.x.dtype != dtype:  # *-true: inputs in the model's dtype
            self.data.x = self.data.x.to(dtype)
        if self.data.y.is_floating_point() and self.data.y.dtype != dtype:  # regression targets likewise
            self.data.y = self.data.y.to(dtype)
        # Held-out clients (ids num_clients, num_clients + 1, ...): trained only when adapting to them.
        self.new_clients = [c.to(self.device) for c in getattr(data, "new_clients", [])]
        self.settings = settings
        self.augment = augment_from_config(settings.augment)
        if self.augment is not None:
            self.augment.check_input_shape(tuple(data.input_shape))
        self._augment_gen: torch.Generator | None = None
        self.seed = seed
        self.eval_batch_size = eval_batch_size
        hp = {"lr": settings.lr, "momentum": settings.momentum, "weight_decay": settings.weight_decay}
        # With terms: one optimizer over the flat vector, gradients accumulated into flat views that
        # the terms read and change. Without: the per-tensor optimizer on fresh gradients, which is
        # exactly what a plain PyTorch loop does (the same update, fewer passes over memory).
        self.optimizer = torch.optim.SGD([self.flat.flat_param], **hp)
        self.tensor_optimizer = torch.optim.SGD(self.flat.tensors, **hp)
        self._last_optimizer = self.optimizer
        self._loss_fn: LossFn | None = None
        self._objectives: dict[type[ClientModule], ClientModule] = {ClientModule: self.module}
        self._module_lists: dict[int, list[nn.Module]] = {}
        self._active: ClientModule = self.module

    def autocast(self) -> contextlib.AbstractContextManager:
        """Fabric's forward context (autocast under *-mixed precisions)."""
        if self.fabric is None or self._direct_forward:
            return contextlib.nullcontext()
        return self.fabric.autocast()

    def objective(self, cls: type[ClientModule] | None) -> ClientModule:
        """The (cached) instance of a method's ClientModule subclass, sharing the one network."""
        if cls is None:
            return self.module
        if cls not in self._objectives:
            if not (isinstance(cls, type) and issubclass(cls, ClientModule)):
                raise TypeError(f"a local objective must be a ClientModule subclass, got {cls!r}")
            module = cls(self.module.net, self.task)
            module._worker_backward = self.backward
            self._objectives[cls] = module
        return self._objectives[cls]

    # -- training -------------------------------------------------------------------------------
    def backward(self, loss: Tensor) -> None:
        """``loss.backward()`` through Fabric's precision plugin (scaled under 16-mixed)."""
        if self._direct_backward:
            loss.backward()
        else:
            self.fabric.backward(loss)

    def apply_step(self, optimizer: torch.optim.Optimizer, terms: Sequence[Term], lr: float) -> None:
        """One optimizer step with the terms around it. Under a gradient scaler the gradients are
        unscaled first (terms add unscaled quantities), those of the tensors the terms train beside the
        model too (``Term.trained``), and a step with inf/NaN gradients is skipped."""
        scaler = self.scaler
        extra = [t for term in terms for t in term.trained() if t.grad is not None] if scaler is not None else []
        if scaler is not None:
            scale = scaler.get_scale()  # read once (on a GPU a read waits for the device); unscale_ keeps it
            scaler.unscale_(optimizer)
            for tensor in extra:
                tensor.grad.mul_(1.0 / scale)
        for term in terms:
            term.on_grad(self.flat.params, self.flat.grads)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() < scale:  # the step was skipped: leave the parameters alone
                for tensor in extra:  # and start the next step's gradients afresh, as the optimizer's
                    tensor.grad = None
                return
        else:
            optimizer.step()
        for term in terms:
            term.on_step(self.flat.params, lr)

    def train(self, cid: int, start: Tensor, round_idx: int, spec: FitSpec = DEFAULT_FIT) -> FitStats:
        """Train client ``cid`` from ``start`` (a full state vector) as ``spec`` says (``FitSpec``).

        Every random draw is keyed by (seed, round, client, purpose): the result does not depend on
        which clients were trained before this one, nor on which process trains it."""
        epochs, terms, purpose, lr, indices = spec.epochs, spec.terms, spec.purpose, spec.lr, spec.indices
        self._loss_fn = spec.loss_fn  # every fit sets it, so a custom loss never leaks into the next one
        module = self._active = self.objective(spec.objective)
        # A plain attribute: set in __dict__, past nn.Module.__setattr__'s checks (~8 us a fit).
        module.__dict__["fit_context"] = spec.context or {}
        manual = not module.automatic_optimization
        self.flat.load(start)
        epochs = self.settings.epochs if epochs is None else epochs
        lr = self.settings.lr_at(round_idx) if lr is None else lr
        n = len(self.split(cid).train if indices is None else indices)
        flat_path = bool(terms) or manual or self.scaler is not None
        optimizer = self.optimizer if flat_path else self.tensor_optimizer
        group = optimizer.param_groups[0]
        group["lr"] = lr
        group["momentum"] = self.settings.momentum if spec.momentum is None else spec.momentum
        optimizer.state.clear()  # fresh momentum per local update unless a method restores it
        if spec.momentum_buffer is not None:
            self._restore_momentum(optimizer, spec.momentum_buffer)
        self._last_optimizer = optimizer
        if not all(m.training for m in self._submodules(module)):  # train() sets every flag: skip when set
            module.train()
        grads = self.flat.grads
        if not flat_path:
            self.flat.release_grads()
        if manual:
            module._worker_optimizer = StepOptimizer(self, optimizer, terms, lr)
        batch_loss = self._batch_loss(module)
        steps, last_epoch_losses = 0, []
        keyed = self.keyed_dropout
        t0 = time.perf_counter()
        for epoch, b in self.epoch_batches(cid, round_idx, purpose, epochs, indices):
            if keyed:  # the stacked step draws the same masks (pfl.models.dropout)
                set_dropout_key(step_key_tensor(self.seed, round_idx, cid, purpose, steps))
            if manual:
                loss = batch_loss(self.train_batch(b), steps)
            else:
                if flat_path:
                    grads.zero_()
                else:
                    optimizer.zero_grad(set_to_none=True)
                loss = batch_loss(self.train_batch(b), steps)
                self.backward(loss)
                self.apply_step(optimizer, terms, lr)
            steps += 1
            if epoch == epochs - 1:
                last_epoch_losses.append(loss.detach())
        seconds = time.perf_counter() - t0
        if keyed:
            set_dropout_key(None)
        if not flat_path:
            self.flat.attach_grads()  # callers outside fit may rely on p.grad viewing flat.grads
        self._active = self.module
        return FitStats(n, n * epochs, steps, last_epoch_losses, seconds)

    def momentum_buffer(self) -> Tensor | None:
        """A flat copy of the optimizer's momentum after the last fit (None without momentum),
        whichever of the two optimizers that fit used."""
        opt = self._last_optimizer
        if opt is self.optimizer:
            buf = opt.state.get(self.flat.flat_param, {}).get("momentum_buffer")
            return None if buf is None else buf.detach().clone()
        bufs = [opt.state.get(p, {}).get("momentum_buffer") for p in self.flat.tensors]
        if any(b is None for b in bufs):
            return None
        return torch.cat([b.detach().reshape(-1) for b in bufs])

    def _restore_momentum(self, optimizer: torch.optim.Optimizer, buf: Tensor) -> None:
        if optimizer is self.optimizer:
            optimizer.state[self.flat.flat_param]["momentum_buffer"] = buf.clone()
            return
        offset = 0
        for p in self.flat.tensors:
            optimizer.state[p]["momentum_buffer"] = buf[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def _batch_loss(self, module: ClientModule) -> Callable[[tuple[Tensor, Tensor], int], Tensor]:
        """The fit's ``(batch, step) -> loss``, chosen once per fit: the custom loss, the objective's
        ``training_step``, or (the base objective) its data loss without the per-batch call layers;
        inside Fabric's forward context unless that is none."""
        loss_fn, net = self._loss_fn, module.net
        if loss_fn is not None:
            step = lambda batch, _: loss_fn(net, *batch)  # noqa: E731
        elif type(module).training_step is ClientModule.training_step:
            step = lambda batch, _: module.loss(module.forward(batch[0]), batch[1])  # noqa: E731
        else:
            step = module.training_step
        if self._direct_forward:
            return step

        def in_context(batch: tuple[Tensor, Tensor], i: int) -> Tensor:
            with self.autocast():
                return step(batch, i)

        return in_context

    def _submodules(self, module: ClientModule) -> list[nn.Module]:
        """Every module of an objective (cached: the network's structure is fixed once flattened)."""
        mods = self._module_lists.get(id(module))
        if mods is None:
            mods = self._module_lists[id(module)] = list(module.modules())
        return mods

    def snapshot(self) -> Tensor:
        return self.flat.snapshot()

    def split(self, cid: int) -> ClientSplit:
        """Client ``cid``'s index split; ids past the federation are the held-out new clients."""
        n = self.data.num_clients
        return self.data.clients[cid] if cid < n else self.new_clients[cid - n]

    # -- building blocks for methods with their own local loop ------------------------------------
    def epoch_batches(
        self, cid: int, round_idx: int, purpose: str, epochs: int, indices: Tensor | None = None
    ) -> Iterator[tuple[int, Tensor]]:
        """(epoch, index batch) pairs of client ``cid``'s train split (or of ``indices``), reshuffled
        every epoch from generators keyed by (seed, round, client, purpose); also seeds dropout and
        initialisers. With ``settings.drop_last`` each epoch's last batch is dropped when it is
        smaller than the batch size, unless it is the only batch (a client with fewer samples than
        the batch size still trains, on one batch of all its samples, as a loader whose batch size
        is capped at the data size does)."""
        seed_everything(self.seed, round_idx, cid, purpose)
        gen, self._augment_gen = self.fit_generators(cid, round_idx, purpose)
        idx = self.split(cid).train if indices is None else indices
        yield from keyed_batches(gen, idx, epochs, self.settings.batch_size, self.settings.drop_last)

    def fit_generators(self, cid: int, round_idx: int, purpose: str) -> tuple[torch.Generator, torch.Generator | None]:
        """The keyed generators of a fit's batch orders and (when the data setting augments) of its
        augmentation: each its own key, so the batch order is the same with augmentation on or off."""
        gen = torch_generator(self.seed, round_idx, cid, purpose, "batches", device=self.device)
        if self.augment is None:
            return gen, None
        return gen, torch_generator(self.seed, round_idx, cid, purpose, "augment", device=self.device)

    def batches(
        self, cid: int, round_idx: int, purpose: str, epochs: int, indices: Tensor | None = None
    ) -> Iterator[Tensor]:
        """The index batches ``fit`` draws for (cid, round, purpose): same keys, same order."""
        for _, b in self.epoch_batches(cid, round_idx, purpose, epochs, indices):
            yield b

    def train_batch(self, b: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs and targets of training batch ``b``, augmented (never in evaluation) from the
        generator of the batches being drawn, so determinism and resume hold."""
        x, y = self.data.x[b], self.data.y[b]
        if self.augment is not None and self._augment_gen is not None:
            x = self.augment(x, self._augment_gen)
        return x, y

    def gradient_batch(self, b: Tensor, augment: bool) -> tuple[Tensor, Tensor]:
        """The inputs and targets ``gradient`` takes the loss on: a training batch (``augment``), or the
        data itself."""
        return self.train_batch(b) if augment else (self.data.x[b], self.data.y[b])

    def gradient(self, b: Tensor, loss_fn: LossFn | None = None, augment: bool = True) -> Tensor:
        """Set ``flat.grads`` to the gradient of the loss on pool samples ``b`` at the current
        parameters (a training batch: augmented when the data setting says so); returns the
        (detached) loss."""
        self.module.train()
        self.flat.grads.zero_()
        x, y = self.gradient_batch(b, augment)
        loss = loss_fn(self.module.net, x, y) if loss_fn is not None else self.module.loss(self.module(x), y)
        loss.backward()
        return loss.detach()

    def mean_gradient(self, cid: int, state: Tensor, round_idx: int = 0) -> tuple[Tensor, float]:
        """One full pass over client ``cid``'s train split at ``state`` (in index order): the mean of
        the batch-mean gradients and the sample-mean loss (PGFed's uploaded ∇f_i and f_i); keyed
        dropout draws batch s's masks from (seed, ``round_idx``, cid, "mean_gradient", s)."""
        self.flat.load(state)
        idx = self.split(cid).train
        total = torch.zeros_like(self.flat.grads)
        loss_sum, batches = 0.0, 0
        for s in range(0, len(idx), self.settings.batch_size):
            b = idx[s : s + self.settings.batch_size]
            if self.keyed_dropout:
                set_dropout_key(step_key_tensor(self.seed, round_idx, cid, "mean_gradient", batches))
            loss = self.gradient(b, augment=False)  # the uploaded ∇f_i is of the data itself
            total += self.flat.grads
            loss_sum += float(loss) * len(b)
            batches += 1
        self.flat.grads.zero_()
        if self.keyed_dropout:
            set_dropout_key(None)
        return total / max(batches, 1), loss_sum / max(len(idx), 1)

    # -- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, state: Tensor, idx: Tensor) -> EvalStats:
        """Accuracy and summed loss of the model ``state`` on pool samples ``idx``."""
        self.flat.load(state)
        self.module.eval()
        correct, loss_sum = 0, 0.0
        for s in range(0, len(idx), self.eval_batch_size):
            b = idx[s : s + self.eval_batch_size]
            with self.autocast():
                out = self.module(self.data.x[b]).float()
            y = self.data.y[b]
            y = y.float() if y.is_floating_point() else y
            if self.task == "classification":
                correct += int((out.argmax(1) == y).sum())
            loss_sum += float(self.module.loss(out, y, reduction="sum"))
        return EvalStats(correct, loss_sum, len(idx))
