"""Stop a run whose training has diverged: the first non-finite loss or tensor of a round, named.

A NaN or inf that reaches the aggregate spreads to every client through the global model, and the
metrics then read NaN (or an accuracy of one class) for the rest of the run. The loop therefore
checks each round, before anything of it is checkpointed or reported:

- every sampled client's upload and stored state (what the method trained) for non-finite values;
- every local fit's mean training loss for ±inf. A NaN loss is not checked on its own, because
  ``ClientContext.record_fit`` reports NaN for methods that run their own loop (no loss known); a
  real NaN loss from SGD leaves NaN parameters, which the tensor check catches;
- the server state after aggregation and the server optimizer's step.

In a multi-process round every rank runs the check on the gathered uploads, states and fits, so
all ranks stop together with the same message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import is_dataclass
from typing import Any

import torch
from torch import Tensor

from pfl.errors import TrainingDiverged
from pfl.trees import field_names


def _tensors(obj: Any, path: str) -> Iterator[tuple[str, Tensor]]:
    """Every floating tensor inside ``obj`` (tensors, dicts, lists, dataclasses such as Upload) with its path."""
    if isinstance(obj, Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield path, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _tensors(value, f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for k, value in enumerate(obj):
            yield from _tensors(value, f"{path}[{k}]")
    elif is_dataclass(obj) and not isinstance(obj, type):
        for name in field_names(type(obj)):
            yield from _tensors(getattr(obj, name), f"{path}.{name}")


def first_nonfinite(obj: Any, name: str) -> str | None:
    """A description of the first tensor in ``obj`` holding NaN or inf, or None when all are finite."""
    for path, tensor in _tensors(obj, name):
        # A finite sum proves every element finite (a NaN or inf makes the sum NaN or inf) at a tenth
        # of isfinite's cost; only a non-finite sum (overflow included) needs the element-wise test.
        if bool(torch.isfinite(tensor.sum())):
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            kind = "NaN" if bool(torch.isnan(tensor).any()) else "inf"
            return f"{path} has {bad} non-finite value(s) ({kind})"
    return None


def infinite_loss(losses: Iterable[float]) -> str | None:
    for loss in losses:
        if math.isinf(loss):
            return f"the local training loss is {loss}"
    return None


def check_clients(round_idx: int, clients: Iterable[int], uploads: dict[int, Any], states: dict[int, Any]) -> None:
    """Raise TrainingDiverged naming the first client (by id) whose upload or state is non-finite."""
    for cid in sorted(clients):
        what = first_nonfinite(uploads.get(cid), "upload") or first_nonfinite(states.get(cid, {}), "client state")
        if what:
            raise TrainingDiverged(round_idx, cid, what)


def _floating(obj: Any, out: list[Tensor]) -> list[Tensor]:
    """Every floating tensor inside ``obj``, in ``_tensors``' order, without the paths (this runs once
    per client per round: no path strings, a dataclass's field names looked up once per type)."""
    if isinstance(obj, Tensor):
        if obj.is_floating_point() or obj.is_complex():
            out.append(obj)
    elif isinstance(obj, dict):
        for value in obj.values():
            _floating(value, out)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _floating(value, out)
    elif is_dataclass(obj) and not isinstance(obj, type):
        for name in field_names(type(obj)):
            _floating(getattr(obj, name), out)
    return out


def finite_sum(objs: Iterable[Any]) -> Tensor:
    """The sum of the sums of every floating tensor inside ``objs``, in float64: finite when every
    element is finite (a NaN or inf anywhere makes it non-finite; an overflow also can). Not yet
    synchronised, so a caller can take it per client while the client's tensors are in cache."""
    sums = []
    for tensor in _floating(list(objs), []):
        total = tensor.sum()
        sums.append((total.abs() if total.is_complex() else total).double())
    return total_of(sums)


def total_of(sums: list[Tensor]) -> Tensor:
    """The sum of 0-dim tensors that may live on different devices (a state can hold host tensors,
    e.g. PAGE's and Dap-FL's agents, beside the training device's): summed per device, then the
    per-device totals on the first device met that is not the host (a copy of one number to it; the
    other way round would wait for the device's queued work)."""
    if len(sums) == 1:
        return sums[0]
    if not sums:
        return torch.zeros((), dtype=torch.float64)
    devices = list(dict.fromkeys(s.device for s in sums))
    if len(devices) == 1:
        return torch.stack(sums).sum()
    host = torch.device("cpu")
    target = next((d for d in devices if d != host), host)
    totals = [torch.stack([s for s in sums if s.device == d]).sum() for d in devices]
    return torch.stack([t.to(target) for t in totals]).sum()


def all_finite(objs: Iterable[Any]) -> bool:
    """True when every floating tensor inside ``objs`` is finite, decided from one sum of their sums;
    False may also mean an overflow of that sum, so a caller scans element-wise before it reports anything."""
    return bool(torch.isfinite(finite_sum(objs)))


def check_round(
    round_idx: int,
    clients: Iterable[int],
    uploads: dict[int, Any],
    states: Any,
    losses: dict[int, list[float]],
    sums: Iterable[Tensor] | None = None,
) -> None:
    """After a round's local updates: raise TrainingDiverged naming the first client (by id) whose
    upload, state or training loss is non-finite. One quick test over all of them; the per-client
    scan runs only when it fails (a round of finite updates costs a sum per tensor). ``sums``: the
    clients' ``finite_sum((upload, state))`` taken right after each local update, while the
    tensors were in cache (the loop does; it saves a pass over every upload in memory)."""
    clients = sorted(clients)
    if sums is None:
        sums = [finite_sum([uploads.get(c), states.get(c, {})]) for c in clients]
    finite = bool(torch.isfinite(total_of(list(sums)))) if clients else True
    if finite and not any(infinite_loss(losses.get(c, ())) for c in clients):
        return
    for cid in clients:
        check_clients(round_idx, [cid], uploads, states)
        check_losses(round_idx, losses.get(cid, ()), cid)


def check_losses(round_idx: int, losses: Iterable[float], client: int | None = None) -> None:
    what = infinite_loss(losses)
    if what:
        raise TrainingDiverged(round_idx, client, what)


def check_server(round_idx: int, state: Any) -> None:
    what = first_nonfinite(state, "server state")
    if what:
        raise TrainingDiverged(round_idx, None, f"{what} after aggregation")
