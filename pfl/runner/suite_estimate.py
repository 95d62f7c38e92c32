"""An estimate of the full reproduction suite's time from a QUICK suite's per-run records.

A QUICK run is one seed at 1/10 of the rounds, evaluated once, after its last round. Its wall time is
fixed costs (Python, torch, the data, the model, a CUDA context, the run-level evaluation after the
rounds, the output files), its rounds and its evaluations. Each run records the seconds of its rounds
and of its evaluations (``summary.json`` → ``timing``, ``pfl.federation.loop.FitTimes``); the suite keeps
them per run (``timing.json``). The full run then costs the same fixed part once, its first round as the
QUICK run's first (which pays what later rounds do not: compiling, capturing CUDA graphs, lazy
allocations), its later rounds at the QUICK run's seconds per later round, and its evaluations (every
``eval_every`` and the last) at the QUICK run's seconds per evaluation. A QUICK run of one round, or one
recorded without its first round apart, has its rounds scaled as a whole. With warm workers only each
worker's first run pays the imports; kept once for every full run scaled from such a QUICK run, that
errs high by at most the imports times those runs.

A run recorded by an older pfl has no such split: its whole wall time is scaled by its rounds, with a
start-up taken as the shortest QUICK run's time (an upper bound of it: that run also trained at least a
round) kept as is. That errs high where fixed costs are most of a QUICK run, as with warm workers.
It is an estimate, marked as such wherever it is printed: a full run's later rounds can cost more or
less than its QUICK run's (a method whose rounds change as it goes), and runs that share one device slow
each other down by more than their share when the device is saturated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

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
class Split:
    """A QUICK run's rounds and evaluations: how many, and their wall seconds (``summary.json`` → ``timing``);
    of the rounds' seconds, the first round's (None where not recorded)."""

    rounds: int
    rounds_s: float
    evaluations: int
    evaluations_s: float
    first_round_s: float | None = None


def split_of(record: Any) -> Split | None:
    """A run's ``timing`` record as a Split; None for a run without one (recorded by an older pfl)."""
    try:
        split = Split(int(record["rounds"]), float(record["rounds_s"]), int(record["evaluations"]),
                      float(record["evaluations_s"]))  # fmt: skip
    except (TypeError, KeyError, ValueError):
        return None
    try:
        first = float(record["first_round_s"])
    except (TypeError, KeyError, ValueError):
        first = None
    if first is not None and 0 <= first <= split.rounds_s:  # a part of the rounds' seconds, or not used
        split = replace(split, first_round_s=first)
    # a run with a round evaluated at least once (after its last): anything else cannot be scaled
    return split if min(split.rounds, split.evaluations) > 0 else None


def split_seconds(quick_s: float, split: Split, rounds: int, evaluations: int) -> float:
    """A run of ``rounds`` rounds and ``evaluations`` evaluations, from a QUICK run that took ``quick_s``
    in all: its first round once and its later rounds scaled by their count (all its rounds, where it ran
    one or did not record its first apart), its evaluations scaled by their count, the rest of its time
    kept once."""
    fixed = quick_s - split.rounds_s - split.evaluations_s
    first = split.first_round_s
    if first is None or split.rounds < 2:
        rounds_s = split.rounds_s * rounds / split.rounds
    else:
        rounds_s = first + (split.rounds_s - first) * (rounds - 1) / (split.rounds - 1)
    return fixed + rounds_s + split.evaluations_s * evaluations / split.evaluations


def evaluations(rounds: int, eval_every: int) -> int:
    """How many times a run of ``rounds`` evaluates: after every ``eval_every``-th round and the last."""
    return -(-rounds // eval_every)


@dataclass(frozen=True)
class Planned:
    """One run of the full suite: the QUICK run it is scaled from (its name), its rounds and evaluations."""

    quick_name: str
    rounds: int
    evaluations: int


@dataclass(frozen=True)
class Estimate:
    """The planned runs' estimated seconds in all; how many planned runs had no QUICK record; how many of
    the QUICK runs they are scaled from were recorded with a split, and how many without one (scaled
    whole, by rounds, keeping ``startup`` seconds as is)."""

    seconds: float
    missing: int
    split: int
    unsplit: int
    startup: float


def estimate(
    planned: list[Planned], quick_s: dict[str, float], quick_rounds: dict[str, int], splits: dict[str, Split]
) -> Estimate:
    """The full suite's ``planned`` runs from the QUICK runs' wall seconds ``quick_s``, their rounds and,
    where recorded, their ``splits``."""
    known = [p for p in planned if p.quick_name in quick_s]
    startup = min(quick_s.values(), default=0.0)
    total = 0.0
    for p in known:
        split = splits.get(p.quick_name)
        if split is None:
            total += scaled_seconds(quick_s[p.quick_name], quick_rounds[p.quick_name], p.rounds, startup)
        else:
            total += split_seconds(quick_s[p.quick_name], split, p.rounds, p.evaluations)
    used = {p.quick_name for p in known}
    return Estimate(total, len(planned) - len(known), len(used & set(splits)), len(used - set(splits)), startup)


__all__ = [
    "Estimate",
    "Planned",
    "Split",
    "device_label",
    "estimate",
    "evaluations",
    "scaled_seconds",
    "split_of",
    "split_seconds",
]
