"""``python -m pfl report RUN_DIR [RUN_DIR ...] [--metrics k1,k2] [--format markdown|csv]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from pfl.errors import ConfigError
from pfl.metrics.report import FORMATS, report


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # bad input is a ConfigError like everywhere else in the CLI
        raise ConfigError("report", message, "usage: python -m pfl report RUN_DIR [RUN_DIR ...] [--metrics k1,k2]")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m pfl report", description="Table of runs: one row per run, mean (std) cells.")
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each with a summary.json)")
    parser.add_argument(
        "--metrics",
        type=str,
        default=None,
        help="comma-separated keys; a key without .mean shows 'mean (std)' (default: every measured headline key)",
    )
    parser.add_argument("--format", choices=FORMATS, default="markdown", help="markdown (best in bold) or csv (*)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    metrics = [k.strip() for k in args.metrics.split(",") if k.strip()] if args.metrics else None
    print(report(args.run_dirs, metrics, args.format), end="")
    return 0
