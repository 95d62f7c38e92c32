"""Whole-federation checkpoints: written so that a crash never leaves the run without a good one,
read without ever running code from the file.

Saving: the new checkpoint goes to a temp file, is fsynced and loaded back (``weights_only``, memory
mapped, so no second copy in memory); only then does the current checkpoint become
``checkpoint.prev.pt`` and the temp file ``checkpoint.pt`` (two renames, then the directory is
fsynced). A kill at any point leaves at least one complete, verified checkpoint.

Loading: ``torch.load(..., weights_only=True)`` admits tensors, numbers, strings and containers
only; a checkpoint that needs any other global is refused (ConfigError), never unpickled. A
truncated or empty newest checkpoint is reported in one line and the previous one is used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.serialization import get_unsafe_globals_in_checkpoint

from pfl.errors import ConfigError

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
PENDING = "checkpoint.pt.tmp"


class UnreadableCheckpoint(Exception):
    """The file is damaged (truncated, empty, not a torch archive); an older one may still serve."""


def _unsafe_globals(path: Path) -> list[str]:
    try:
        return list(get_unsafe_globals_in_checkpoint(path))
    except Exception:  # an archive too damaged to list is unreadable, which the caller reports
        return []


def read_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Load one checkpoint file with ``weights_only=True``. A file that needs other globals is a
    ConfigError naming them; a damaged file raises UnreadableCheckpoint."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # torch reports damage and refusal with many types; sort them below
        unsafe = _unsafe_globals(path)
        if unsafe:
            raise ConfigError(
                "--resume",
                f"checkpoint {path} holds objects that are not plain tensors/containers: {', '.join(unsafe)}; "
                "pfl refuses to unpickle code",
                "resume only from checkpoints pfl wrote, or start a new run",
            ) from None
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnreadableCheckpoint(reason) from None
    if not isinstance(state, dict):
        raise UnreadableCheckpoint(f"it holds a {type(state).__name__}, not a checkpoint dict")
    return state


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, payload: dict[str, Any]) -> Path:
    path, previous, pending = run_dir / CHECKPOINT, run_dir / PREVIOUS, run_dir / PENDING
    with open(pending, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        read_checkpoint(pending, mmap=True)
    except (ConfigError, UnreadableCheckpoint) as err:  # a bug in what pfl saves, not bad input
        pending.unlink(missing_ok=True)
        raise RuntimeError(
            f"the checkpoint just written does not load back with weights_only=True ({err}); "
            "checkpoints must hold only tensors, Python numbers, strings and containers (e.g. float() numpy scalars)"
        ) from None
    if path.exists():
        os.replace(path, previous)
    os.replace(pending, path)
    _fsync_dir(run_dir)
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """The newest readable checkpoint of ``run_dir`` (``checkpoint.pt``, else ``checkpoint.prev.pt``),
    or None when the run has none. A damaged file is reported in one line on stderr and skipped."""
    candidates = [p for p in (run_dir / CHECKPOINT, run_dir / PREVIOUS) if p.exists()]
    if not candidates:
        return None
    damaged = []
    for k, path in enumerate(candidates):
        try:
            return read_checkpoint(path)
        except UnreadableCheckpoint as err:
            damaged.append(f"{path} ({err})")
            then = f"falling back to {candidates[k + 1]}" if k + 1 < len(candidates) else "no older checkpoint"
            print(f"warning: checkpoint {path} is unreadable ({err}); {then}", file=sys.stderr)
    raise ConfigError(
        "--resume",
        f"no readable checkpoint in {run_dir}: {'; '.join(damaged)}",
        "start a new run; the damaged files cannot be resumed",
    )
