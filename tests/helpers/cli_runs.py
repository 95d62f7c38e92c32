"""Small runs through the command line, shared by the run-folder tests."""

from __future__ import annotations

import os
from pathlib import Path

from pfl.cli import main

TINY = [
    "--data.num_clients", "4", "--model.hidden", "[16]", "--trainer.rounds", "2", "--trainer.eval_every", "1",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def fit(root: Path, name: str, *extra: str) -> int:
    """``pfl fit`` of the tiny run into ``root/name``; the exit code."""
    return main(["fit", *TINY, "--tracking.root", str(root), "--tracking.name", name, *extra])


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a ``python -m pfl`` child process: this checkout's pfl first on PYTHONPATH, the
    caller's entries kept (a machine may reach its torch or other dependencies only through them), one thread."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}
