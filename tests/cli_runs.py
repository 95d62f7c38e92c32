"""Small runs through the command line, shared by the run-folder tests."""

from __future__ import annotations

from pathlib import Path

from pfl.cli import main

TINY = [
    "--data.num_clients", "4", "--model.hidden", "[16]", "--trainer.rounds", "2", "--trainer.eval_every", "1",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def fit(root: Path, name: str, *extra: str) -> int:
    """``pfl fit`` of the tiny run into ``root/name``; the exit code."""
    return main(["fit", *TINY, "--tracking.root", str(root), "--tracking.name", name, *extra])
