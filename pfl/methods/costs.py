"""What a method's hooks cost besides their results: wall-clock seconds per named phase and the bytes of the
server<->client exchanges outside the payload/upload pair (a line search asking clients for losses, a
direction sent down). A hook only wraps a phase in ``timed(name)`` or performs the exchange; the
framework turns the sums into metrics and resets them. Reports describe the machine (timings) or one
round (bytes, drained every round), so they are never part of the checkpointed state.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

SCALAR_BYTES = 4  # one loss or step size on the wire: a 32-bit number, as the communication metrics count scalars


@dataclass
class Times:
    """Seconds and run counts per phase, and the rounds they were spent in, since the last take."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    rounds: int = 0

    def merged(self, other: Times) -> Times:
        """Both sets of phases (seconds and counts of a phase in both add up); ``self``'s rounds."""
        seconds, counts = dict(self.seconds), dict(self.counts)
        for name, s in other.seconds.items():
            seconds[name] = seconds.get(name, 0.0) + s
            counts[name] = counts.get(name, 0) + other.counts[name]
        return Times(seconds, counts, self.rounds)

    def per_round(self, method: str) -> dict[str, float]:
        """``time.<method>.<phase>_s_per_round``: each phase's seconds over the rounds (none without a round)."""
        if not self.rounds:
            return {}
        return {f"time.{method}.{name}_s_per_round": s / self.rounds for name, s in self.seconds.items()}


class Reports:
    """The running sums behind ``Times`` and the exchanged bytes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.rounds: set[int] = set()
        self.up = self.down = 0

    @contextmanager
    def timed(self, name: str, round_idx: int | None = None) -> Iterator[None]:
        """Add the block's wall-clock seconds to phase ``name`` (and ``round_idx`` to the rounds spent)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started
            self.counts[name] += 1
            if round_idx is not None:
                self.rounds.add(round_idx)

    def count_bytes(self, up: int, down: int) -> None:
        self.up += up
        self.down += down

    def take_bytes(self) -> tuple[int, int]:
        out = self.up, self.down
        self.up = self.down = 0
        return out

    def take_times(self) -> Times:
        out = Times(dict(self.seconds), dict(self.counts), len(self.rounds))
        self.seconds.clear()
        self.counts.clear()
        self.rounds.clear()
        return out
