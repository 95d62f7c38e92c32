"""An estimate of the full reproduction suite's time from a QUICK suite's per-run records.

A QUICK run is one seed at 1/10 of the rounds. Its wall time is a start-up cost (Python, torch, the
data, a CUDA context) plus rounds; the full run is the same start-up plus its own rounds. The start-up
is taken as the shortest QUICK run's time (an upper bound of it: that run also trained at least a
round), and the rest scales with the rounds. With warm workers only each worker's first run pays the
imports; scaled with its rounds, that errs high by at most (workers x imports x the rounds' factor).
It is an estimate, marked as such wherever it is printed: evaluation and the last rounds can cost more
or less than the first, and runs that share one device slow each other down by more than their share
when the device is saturated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def device_label(accelerator: str = "auto") -> str:
    """The training device of runs with ``trainer.accelerator: accelerator`` on this machine, as the suite
    records it: the GPU's name, or the CPU and its cores."""
    if accelerator != "cpu" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"CPU, {os.cpu_count()} cores"


def scaled_seconds(quick_s: float, quick_rounds: int, rounds: int, startup_s: float) -> float:
    """A run of ``rounds`` rounds, from a QUICK run of ``quick_rounds`` that took ``quick_s``."""
    start = min(startup_s, quick_s)
    return start + (quick_s - start) * rounds / quick_rounds


@dataclass(frozen=True)
class Planned:
    """One run of the full suite: the QUICK run it is scaled from (its name) and its rounds."""

    quick_name: str
    rounds: int


def estimate(
    planned: list[Planned], quick_s: dict[str, float], quick_rounds: dict[str, int]
) -> tuple[float, int, float]:
    """(the planned runs' estimated seconds in all, how many had no QUICK record, the start-up used)."""
    known = [quick_s[p.quick_name] for p in planned if p.quick_name in quick_s]
    startup = min(quick_s.values(), default=0.0)
    total = sum(
        scaled_seconds(quick_s[p.quick_name], quick_rounds[p.quick_name], p.rounds, startup)
        for p in planned
        if p.quick_name in quick_s
    )
    return total, len(planned) - len(known), startup


__all__ = ["Planned", "device_label", "estimate", "scaled_seconds"]
