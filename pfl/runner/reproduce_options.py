"""The reproduction suite's command line and the checks of its options: the standard library, the
claims' names and the worker processes' check only, so that ``pfl reproduce --help`` and a refused option
answer without importing torch (``pfl.runner.reproduce`` does the work)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pfl.errors import CommandParser, require
from pfl.runner.claims import Claim, all_claims
from pfl.runner.warm_workers import require_workers
from pfl.suggest import choice_fix

# What the suite sets every run's trainer.accelerator to: the part of pfl.config.ACCELERATORS whose device
# its time records can name (suite_estimate.device_label: the GPU, or the CPU).
SUITE_ACCELERATORS = ("auto", "cpu", "cuda")


def default_workers() -> int:
    """Runs in parallel: one per core (each run trains with one thread; on a GPU machine they share the card)."""
    return max(1, os.cpu_count() or 1)


def check_suite_options(keys: list[str], only: list[str] | None, workers: int, accelerator: str) -> None:
    """Refuse, in one line naming the option, a claim not among the suite's ``keys`` (with the closest name),
    fewer than one worker, or an accelerator the suite does not run on."""
    for key in only or []:
        require(key in keys, "--only", f"{key!r} is not a claim of the suite", choice_fix(key, keys))
    require_workers(workers)
    require(accelerator in SUITE_ACCELERATORS, "--accelerator", f"{accelerator!r} is not one the suite runs on",
            "give auto (a GPU when there is one), cpu or cuda")  # fmt: skip


def check_runs(claims: list[Claim], only: list[str] | None, runs: list[str] | None) -> None:
    """Refuse, in one line naming ``--runs``, a label that is no run of the claims chosen (``only``: all when
    None), with the closest label."""
    labels = sorted({label for c in claims if not only or c.key in only for label in c.runs})
    for label in runs or []:
        require(label in labels, "--runs", f"{label!r} is not a run of the claims chosen", choice_fix(label, labels))


def parser(keys: list[str]) -> CommandParser:
    """``python -m pfl reproduce``'s options; ``keys``: the suite's claims, named in ``--only``'s help."""
    p = CommandParser(prog="python -m pfl reproduce", description="Run the paper-reproduction suite.")
    p.add_argument("--out", type=Path, default=Path("reproduce"))
    p.add_argument("--only", nargs="*", default=None, help=f"claims to run: {', '.join(keys)}")
    p.add_argument(
        "--runs",
        nargs="+",
        default=None,
        help="only these runs (labels) of the claims, with their lr grids: a partial table, whose verdict covers "
        "the contrasts among them",
    )
    p.add_argument("--quick", action="store_true", help="first seed, 1/10 of the rounds, no lr grid (a smoke test)")
    p.add_argument(
        "--workers", type=int, default=None, help="runs in parallel (default: one per core; they share a GPU)"
    )
    p.add_argument("--reuse", action="store_true", help="keep runs that already finished (continue a suite)")
    p.add_argument(
        "--accelerator",
        default="auto",
        choices=SUITE_ACCELERATORS,
        help="every run's trainer.accelerator (default auto: the GPU when there is one; cpu: the cores only)",
    )
    p.add_argument(
        "--fresh-processes",
        action="store_true",
        help="start a new process for every run (default: each worker process runs one run after another)",
    )
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="every run leaves its final checkpoint, for pfl.api.Run.model() (default: none is written; tens of GB)",
    )
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line, its options checked (``check_suite_options``); ``workers`` filled in."""
    claims = all_claims()
    keys = [c.key for c in claims]
    args = parser(keys).parse_args(argv)
    args.workers = default_workers() if args.workers is None else args.workers
    check_suite_options(keys, args.only, args.workers, args.accelerator)
    check_runs(claims, args.only, args.runs)
    return args
