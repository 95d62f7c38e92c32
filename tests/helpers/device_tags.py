"""A training device that a CPU machine can check placement on: tensors tagged as living on it.

On a CUDA run a tensor created without ``device=`` stays on the CPU, and meeting a tensor of the
training device in ``torch.cat``, a comparison or a matmul raises ``Expected all tensors to be on the
same device``. A CPU run cannot show that: every tensor is on the CPU. Inside ``training_device()``
the training device is ``DEVICE`` (``cpu:0``, a device object distinct from ``cpu``): tensors created
or moved there (``device=DEVICE``, ``.to(DEVICE)``, ``.to(tagged)``) are tagged ``OnDevice``, results
of ops on tagged tensors stay tagged, ``.cpu()`` / ``.to("cpu")`` untag, and an op that mixes tagged
tensors with untagged ones raises as CUDA does: CPU tensors of one element and no dimension are
allowed as scalars in elementwise ops, never in ``cat`` / ``stack``; a tensor indexed with host
indices, copies (``copy_``, ``.to``) and writes into a tensor are allowed. ``.device`` of a tagged
tensor reads ``DEVICE``, so code that creates tensors on "the device of x" creates tagged ones.

``loop_on_device(cfg)`` builds a run's loop on that device (a stand-in for Lightning Fabric's device):
its model, data, states and uploads are tagged, so a whole run checks its placement. Where torch
makes tensors the mode cannot see (autograd's gradients, functorch's vmapped step) they are tagged as
CUDA would place them: beside their tensor, on the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies import Strategy
from torch import Tensor
from torch.overrides import TorchFunctionMode

DEVICE = torch.device("cpu", 0)
HOST = torch.device("cpu")
JOINS = {torch.cat, torch.concat, torch.concatenate, torch.stack, torch.hstack, torch.vstack, torch.column_stack}
# Calls that compute nothing from the values, and torch.optim's multi-tensor kernels, whose gradients
# autograd makes untagged (on CUDA they are the parameters' device).
INSPECTIONS = {torch._has_compatible_shallow_copy_type}
GRADIENTS = {Tensor.grad.__get__, Tensor._grad.__get__}
COPIES = {Tensor.copy_, Tensor.to, Tensor.cpu, Tensor.__setitem__, Tensor.__getitem__, Tensor.set_}


class OnDevice(Tensor):
    """A CPU tensor standing for one on the training device (see the module docstring)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return DEVICE


def on_device(t: Tensor) -> Tensor:
    """``t`` tagged as living on the training device."""
    return t.as_subclass(OnDevice)


def on_host(t: Tensor) -> Tensor:
    return t.as_subclass(Tensor)


def is_on_device(t: Any) -> bool:
    return isinstance(t, OnDevice)


def _tensors(obj: Any) -> Iterator[Tensor]:
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)


def _device_arg(func: Any, args: tuple, kwargs: dict) -> Any:
    """The device a call creates or moves to: its ``device=``, or ``.to``'s positional device/tensor."""
    if "device" in kwargs:
        return kwargs["device"]
    if func is Tensor.to:
        for a in args[1:]:
            if isinstance(a, (torch.device, str, Tensor)):
                return a
    if func is Tensor.cpu:
        return HOST
    return None


def _mismatch(func: Any, args: tuple, kwargs: dict) -> str | None:
    if func in INSPECTIONS or getattr(func, "__name__", "").startswith("_foreach"):
        return None
    tensors = list(_tensors((args, kwargs)))
    tagged = [t for t in tensors if is_on_device(t)]
    if not tagged or len(tagged) == len(tensors):
        if func is Tensor.__getitem__ and not is_on_device(args[0]) and tagged:
            return "a host tensor indexed with device indices"
        return None
    if func in (Tensor.copy_, Tensor.to, Tensor.cpu, Tensor.set_):
        return None
    if func is Tensor.__getitem__:
        return None if is_on_device(args[0]) else "a host tensor indexed with device indices"
    if func is Tensor.__setitem__:
        index = list(_tensors(args[1]))
        if not is_on_device(args[0]) and any(is_on_device(t) for t in index):
            return "a host tensor written at device indices"
        return None
    host = [t for t in tensors if not is_on_device(t)]
    if func not in JOINS and all(t.dim() == 0 for t in host):
        return None  # CPU scalars are allowed in elementwise ops with CUDA tensors
    shapes = ", ".join(str(tuple(t.shape)) for t in host)
    return f"host tensors of shapes {shapes} meet device tensors in {getattr(func, '__name__', func)}"


def _host_target(a: Any) -> Any:
    """``.to``'s argument with the training device replaced by the host one (where the data lives)."""
    if isinstance(a, Tensor):
        return on_host(a)
    if isinstance(a, (torch.device, str)) and torch.device(a) == DEVICE:
        return HOST
    return a


class _TrainingDevice(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        problem = _mismatch(func, args, kwargs)
        if problem is not None:
            raise RuntimeError(f"Expected all tensors to be on the same device: {problem}")
        target = _device_arg(func, args, kwargs)
        if isinstance(target, Tensor):
            target = DEVICE if is_on_device(target) else HOST
        if isinstance(target, str):
            target = torch.device(target)
        if target == DEVICE:  # a real CPU tensor underneath
            if "device" in kwargs:
                kwargs = {**kwargs, "device": HOST}
            elif func is Tensor.to:
                args = tuple(_host_target(a) for a in args)
        out = func(*args, **kwargs)
        if isinstance(target, torch.device) and isinstance(out, Tensor):
            return on_device(out) if target == DEVICE else on_host(out)
        if func in GRADIENTS and isinstance(out, Tensor) and is_on_device(args[0]):
            return on_device(out)  # autograd made it (untagged), beside its tensor on the device
        return out


@contextmanager
def training_device() -> Iterator[torch.device]:
    """Within the block, ``DEVICE`` is a device that tags its tensors (the module docstring). Modules
    moved there get tagged parameters (``nn.Module.to`` makes new ones instead of swapping ``.data``)."""
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        with _TrainingDevice():
            yield DEVICE
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)


class _StandInStrategy:
    backward = Strategy.backward  # Fabric's hooks are the plain ones: the worker calls backward itself
    precision = Precision()


class StandInFabric:
    """What the worker reads of Lightning Fabric, for one process training on ``DEVICE``."""

    world_size, global_rank, is_global_zero = 1, 0, True
    strategy = _StandInStrategy()
    device = DEVICE


def loop_on_device(cfg: Any) -> Any:
    """The run's loop as ``build_loop`` assembles it, trained on ``DEVICE`` (call inside ``training_device``).
    Vectorized training is trained as on CUDA: functorch hands its results back untagged, so the
    stacked step's are tagged here."""
    from pfl.data.config import build_data
    from pfl.runner.assembly import build_loop
    from pfl.runner.plan import plan_run

    loop = build_loop(plan_run(cfg, build_data(cfg.data, cfg.seed)), StandInFabric(), announce_path=False)
    lockstep = getattr(loop.dispatcher, "lockstep", None)
    if lockstep is not None:
        for name in ("step", "unpadded_step", "gradient_step", "unpadded_gradient_step"):
            step = getattr(lockstep.trainer, name)
            setattr(lockstep.trainer, name, lambda *args, step=step: tuple(on_device(out) for out in step(*args)))
        loss_step = lockstep.trainer._loss_step  # a custom loss's vmapped step (pfl.engine.stacked_loss)

        def tagged_loss_step(loss: Any, loss_step: Any = loss_step) -> Any:
            step = loss_step(loss)
            return lambda *args: tuple(on_device(out) for out in step(*args))

        lockstep.trainer._loss_step = tagged_loss_step
        run = lockstep.run  # each client's update runs in a thread of its own: the mode is per thread
        lockstep.run = lambda updates: run([_in_mode(update) for update in updates])
    return loop


def _in_mode(update: Any) -> Any:
    def run(worker: Any) -> Any:
        with _TrainingDevice():
            return update(worker)

    return run
