"""How far a run has come: one state the loop advances and a checkpoint saves and restores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunProgress:
    """The rounds completed, the evaluated rounds' metrics (``history``), the client rows of the last
    evaluation, and the samples and seconds the clients have trained so far (``throughput.*``)."""

    round: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    train_samples: int = 0
    train_seconds: float = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "history": self.history,
            "client_rows": self.client_rows,
            "train_samples": self.train_samples,
            "train_seconds": self.train_seconds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``; ``client_rows`` may be absent (a checkpoint written before any evaluation)."""
        self.round = int(state["round"])
        self.history = list(state["history"])
        self.client_rows = list(state.get("client_rows", []))
        self.train_samples = state["train_samples"]
        self.train_seconds = state["train_seconds"]


__all__ = ["RunProgress"]
