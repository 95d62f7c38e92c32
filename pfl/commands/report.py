"""``python -m pfl report RUN_DIR [RUN_DIR ...] [--metrics k1,k2] [--format markdown|csv|latex]
[--digits N] [--per-run]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from pfl.errors import ConfigError
from pfl.metrics.report import FORMATS, report

USAGE = "usage: python -m pfl report RUN_DIR [RUN_DIR ...] [--metrics k1,k2] [--format markdown|csv|latex]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # bad input is a ConfigError like everywhere else in the CLI
        raise ConfigError("report", message, USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m pfl report",
        description="Table of runs: runs that differ only in their seed are one row, mean ± std over seeds; "
        "a column per setting that differs between rows; the best value of each column marked.",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each with a summary.json)")
    parser.add_argument(
        "--metrics",
        type=str,
        default=None,
        help="comma-separated keys; a key without .mean reads key.mean (with key.std over clients) "
        "(default: every measured headline key)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="markdown",
        help="markdown (best in bold), csv (numbers: key, key_std, key_best columns) or latex (booktabs)",
    )
    parser.add_argument("--digits", type=int, default=4, help="decimals of the printed numbers (default 4)")
    parser.add_argument(
        "--per-run", action="store_true", help="one row per run instead of one per group of seeds (seed a column)"
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    metrics = [k.strip() for k in args.metrics.split(",") if k.strip()] if args.metrics else None
    print(report(args.run_dirs, metrics, args.format, group=not args.per_run, digits=args.digits), end="")
    return 0
