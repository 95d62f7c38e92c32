"""A stacked fit's batches, step by step (``pfl.engine.stacked``).

``schedule_steps`` lays out which batch each client trains on at each stacked step; ``PaddedFeed``
gathers each step's padded (inputs, targets, mask) from one index table built for the whole fit: a few
tensor operations per step instead of a few per client, which on a GPU is the difference between a
step the host can launch quickly and one it cannot.
"""

from __future__ import annotations

from collections.abc import Iterator

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


class PaddedFeed:
    """The padded batches of a whole stacked fit, gathered step by step from one index table: row r of
    ``table`` is a batch padded to the batch size with its first sample (the last row, sample 0: no
    batch), ``rows[s]`` each client's row at step s. A step's (inputs, targets, mask) have the step's
    width (its longest batch, or the batch size when ``static``): each client's samples, then copies of
    its first one (masked out); a client without a batch gets sample 0, fully masked."""

    def __init__(
        self,
        schedule: list[Drawn],
        batch_size: int,
        static: bool,
        dtype: torch.dtype,
        device: torch.device,
    ):
        pieces: list[Tensor] = []
        rows: list[list[int]] = []
        lengths: list[list[int]] = []
        for drawn in schedule:
            rows.append([])
            lengths.append([])
            for d in drawn:
                n = 0 if d is None else len(d[1])
                lengths[-1].append(n)
                rows[-1].append(len(pieces) if n else -1)  # -1: the last row
                if n:
                    b = d[1]  # type: ignore[index]
                    pieces.append(b if n >= batch_size else torch.cat([b, b[:1].expand(batch_size - n)]))
        pieces.append(torch.zeros(batch_size, dtype=torch.long, device=device))
        self.table = torch.stack(pieces)  # keyed batches are never longer than the batch size
        self.rows = torch.tensor(rows, dtype=torch.long).remainder_(len(pieces)).to(device)
        n = torch.tensor(lengths, dtype=torch.long).to(device)
        self.mask = (torch.arange(batch_size, device=device) < n.unsqueeze(-1)).to(dtype)
        self.active = (n > 0).unsqueeze(-1)
        self.widths = [max(batch_size, *row) if static else max(row) for row in lengths]

    def step(self, s: int, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        width = self.widths[s]
        idx = self.table[self.rows[s], :width]
        return x[idx], y[idx], self.mask[s, :, :width].contiguous()  # a copy only when narrower


__all__ = ["Drawn", "PaddedFeed", "schedule_steps"]
