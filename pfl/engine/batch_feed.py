"""A stacked fit's batches, step by step (``pfl.engine.stacked``).

``schedule_steps`` lays out which batch each client trains on at each stacked step; ``PaddedFeed``
gathers each step's padded (inputs, targets, mask) from one index table built for the whole fit: a few
tensor operations per step instead of a few per client, which on a GPU is the difference between a
step the host can launch quickly and one it cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

Drawn = list[tuple[int, Tensor] | None]  # one step: each client's (epoch, index batch), or None


def schedule_steps(streams: list[Iterator[tuple[int, Tensor]]], aligned: bool) -> list[Drawn]:
    """Each step's (epoch, batch) per client (None: no batch at that step). With ``aligned`` epochs a
    client done with its epoch waits for the others; otherwise each goes through its batches at its own
    pace. Each stream draws from its client's own generator, so drawing them all first changes nothing."""
    steps = []
    upcoming = [next(s, None) for s in streams]
    while any(d is not None for d in upcoming):
        epoch = min(d[0] for d in upcoming if d is not None)
        drawn = [d if d is not None and (not aligned or d[0] == epoch) else None for d in upcoming]
        upcoming = [next(s, None) if d is not None else u for s, d, u in zip(streams, drawn, upcoming, strict=True)]
        steps.append(drawn)
    return steps


def stack_size(active: int, clients: int, rows: str) -> int:
    """How many rows a step with ``active`` clients with a batch (of ``clients``) trains. ``rows``:
    "active", exactly those; "powers", the next power of two, at most ``clients`` (captured steps: a fit
    meets a few step shapes, one graph each, rather than one per count); "all", every client (compiled
    steps: each new shape would compile again)."""
    if rows == "all":
        return clients
    if rows == "active":
        return active
    size = 1
    while size < active:
        size *= 2
    return min(size, clients)


class PaddedFeed:
    """The padded batches of a whole stacked fit, gathered step by step from one index table: row r of
    ``table`` is a batch padded to the batch size with its first sample (the last row, sample 0: no
    batch). A step trains the clients with a batch (``stack_size`` with ``stack_rows``: perhaps filled up
    with clients without one); ``selected[s]`` are its rows' clients, in order (None: every client,
    in order). A step's (inputs, targets, mask) have one row per selected client and the step's width
    (its longest batch, or the batch size when ``static``): each client's samples, then copies of its
    first one (masked out); a client without a batch gets sample 0, fully masked.

    Trained together, clients of unequal size (a Dirichlet split) would otherwise all compute at every
    step until the largest is done: with 20 clients of an MNIST Dirichlet(0.5) split, about half of
    that work was on padding."""

    def __init__(
        self,
        schedule: list[Drawn],
        batch_size: int,
        static: bool,
        dtype: torch.dtype,
        device: torch.device,
        stack_rows: str = "active",
    ):
        pieces: list[Tensor] = []
        rows: list[int] = []  # each step's selected rows of ``table``, one after the other
        lengths: list[int] = []
        self.clients: list[list[int]] = []  # each step's rows' clients (``selected``, as lists)
        self.widths: list[int] = []
        bounds = [0]
        active = []
        chosen: list[int] = []  # the compacted steps' clients, one step after the other
        spans: list[tuple[int, int] | None] = []  # each step's part of ``chosen`` (None: every client)
        for drawn in schedule:
            k = len(drawn)
            ready = [j for j, d in enumerate(drawn) if d is not None]
            idle = [j for j, d in enumerate(drawn) if d is None]
            size = stack_size(len(ready), k, stack_rows)
            if size == k:
                clients = list(range(k))
                spans.append(None)
            else:
                clients = (ready + idle)[:size]
                spans.append((len(chosen), len(chosen) + size))
                chosen += clients
            self.clients.append(clients)
            step_lengths = [0 if drawn[j] is None else len(drawn[j][1]) for j in clients]  # type: ignore[index]
            for j, n in zip(clients, step_lengths, strict=True):
                rows.append(len(pieces) if n else -1)  # -1: the last row
                if n:
                    b = drawn[j][1]  # type: ignore[index]
                    pieces.append(b if n >= batch_size else torch.cat([b, b[:1].expand(batch_size - n)]))
            lengths += step_lengths
            bounds.append(len(rows))
            active.append([d is not None for d in drawn])
            self.widths.append(max(batch_size, *step_lengths) if static else max(step_lengths))
        pieces.append(torch.zeros(batch_size, dtype=torch.long, device=device))
        self.table = torch.stack(pieces)  # keyed batches are never longer than the batch size
        self.bounds = bounds
        self.rows = torch.tensor(rows, dtype=torch.long).remainder_(len(pieces)).to(device)
        n = torch.tensor(lengths, dtype=torch.long).to(device)
        self.mask = (torch.arange(batch_size, device=device) < n.unsqueeze(-1)).to(dtype)
        self.active = torch.tensor(active, dtype=torch.bool).unsqueeze(-1).to(device)
        # the selections as views of one tensor on the device: one transfer for the whole fit
        flat = torch.tensor(chosen, dtype=torch.long).to(device)
        self.selected = [None if span is None else flat[span[0] : span[1]] for span in spans]

    def step(self, s: int, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        width, lo, hi = self.widths[s], self.bounds[s], self.bounds[s + 1]
        idx = self.table[self.rows[lo:hi], :width]
        return x[idx], y[idx], self.mask[lo:hi, :width].contiguous()  # a copy only when narrower


def compact_pass(
    step: Callable[..., tuple[Tensor, Tensor]],
    params: Tensor,
    inputs: tuple[Tensor, Tensor, Tensor],
    keys: tuple[Tensor, ...],
    selected: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """``step`` (gradients and losses) on the selected clients' rows of ``params`` and ``keys`` with the
    step's ``inputs`` (a feed's, already those clients'): one row per selected client (every client when
    ``selected`` is None)."""
    if selected is None:
        return step(params, *inputs, *keys)
    return step(params[selected], *inputs, *(key[selected] for key in keys))


def widen(values: Tensor, selected: Tensor | None, clients: int) -> Tensor:
    """A compacted step's per-row results (gradients or losses) as one row per client, zero for the
    clients it did not train (what a fully masked batch gives them)."""
    if selected is None:
        return values
    return values.new_zeros((clients, *values.shape[1:])).index_copy_(0, selected, values)


__all__ = ["Drawn", "PaddedFeed", "compact_pass", "schedule_steps", "stack_size", "widen"]
