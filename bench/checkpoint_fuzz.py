"""Flipped-byte sweep over a small checkpoint: every offset of ``checkpoint.pt`` (a delta link whose
parent is ``checkpoint.prev.pt``) has one byte flipped, and the run folder is loaded as a resume loads
it (``CheckpointChain.load`` with the restored values checked). Each offset ends in one of:

- ``same``: the newest checkpoint's exact content (the flip hit bytes nothing reads, e.g. a zip CRC);
- ``fallback``: the previous checkpoint's exact content, after a one-line warning;
- ``silent_difference``: any other content (numbers, types, structure): the failure this guards;
- ``refused``: a one-line ConfigError although the previous checkpoint verifies (a failure too);
- ``crash``: any other exception (a failure too).

Contents are compared by an exact walk (types, dtypes, shapes, bytes), independent of the digest.
``python -m bench.checkpoint_fuzz [--step K]`` sweeps every K-th offset (default 1: all) and prints
the counts as one JSON line; the acceptance is 0 silent differences, 0 refusals and 0 crashes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from pfl.errors import ConfigError
from pfl.federation.checkpoint import CHECKPOINT, PREVIOUS, CheckpointChain, check_values

OUTCOMES = ("same", "fallback", "silent_difference", "refused", "crash")
RUN_ARGS = [
    "--method", "ditto", "--data.num_clients", "3", "--model.hidden", "[4]", "--client.epochs", "1",
    "--trainer.rounds", "2", "--trainer.eval_every", "1", "--trainer.checkpoint_every", "1",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def identical(a: Any, b: Any) -> bool:
    """Exactly the same tree: the same types (list is not tuple, int is not float), dict keys in the
    same order, tensors of the same dtype and shape with the same bytes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)  # NaN equals itself here


def small_run(folder: Path) -> Path:
    """A finished 2-round run of a few tiny clients (checkpoint.pt: a delta on checkpoint.prev.pt)."""
    from pfl.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["fit", *RUN_ARGS, "--tracking.root", str(folder), "--tracking.name", "r"])
    if code != 0:
        raise RuntimeError(f"the small run failed (exit code {code})")
    return folder / "r"


def load_as_resume(run: Path) -> tuple[dict[str, Any] | None, str]:
    """What a resume of ``run`` restores (materialized), or None, with what it printed on stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        checkpoint = CheckpointChain(run).load(check=check_values)
        state = None if checkpoint is None else checkpoint.materialize()
    return state, err.getvalue()


def outcome(run: Path, newest: dict[str, Any], previous: dict[str, Any]) -> str:
    try:
        state, _ = load_as_resume(run)
    except ConfigError:
        return "refused"
    except Exception:  # anything else is what the sweep looks for
        return "crash"
    if state is not None and identical(state, newest):
        return "same"
    if state is not None and identical(state, previous):
        return "fallback"
    return "silent_difference"


def sweep(run: Path, offsets: Iterable[int]) -> dict[str, Any]:
    """Counts of each outcome over ``offsets`` of ``run``'s checkpoint.pt (each flipped alone, then
    restored), and the offsets of every failure."""
    path = run / CHECKPOINT
    original = path.read_bytes()
    newest, _ = load_as_resume(run)
    saved = run / "intact.pt"
    shutil.move(path, saved)
    try:
        previous_state, _ = load_as_resume(run)
    finally:
        shutil.move(saved, path)
    assert newest is not None and previous_state is not None
    counts: Counter[str] = Counter()
    failures: dict[str, list[int]] = {}
    try:
        for offset in offsets:
            damaged = bytearray(original)
            damaged[offset] ^= 0xFF
            path.unlink()
            path.write_bytes(bytes(damaged))
            result = outcome(run, newest, previous_state)
            counts[result] += 1
            if result not in ("same", "fallback"):
                failures.setdefault(result, []).append(offset)
    finally:
        path.unlink()
        path.write_bytes(original)
    return {"bytes": len(original), **{k: counts[k] for k in OUTCOMES}, "failures": failures}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, default=1, help="sweep every STEP-th offset (1: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pfl-bench-fuzz-") as tmp:
        run = small_run(Path(tmp))
        assert (run / PREVIOUS).exists()
        started = time.perf_counter()
        row = sweep(run, range(0, (run / CHECKPOINT).stat().st_size, args.step))
    row["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    sys.exit(0 if not main()["failures"] else 1)
