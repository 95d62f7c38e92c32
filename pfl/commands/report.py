"""``python -m pfl report RUN_DIR [RUN_DIR ...] [--metrics k1,k2] [--format markdown|csv|latex]
[--digits N] [--per-run] [--plot FILE [--plot-metric KEY]] [--plot-clients FILE]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matplotlib.figure import Figure

from pfl.errors import CommandParser, ConfigError
from pfl.metrics.compare_plots import check_output, clients_figure, curve_figure, plot_groups
from pfl.metrics.plots import save_figure
from pfl.metrics.report import FORMATS, platform_note, report
from pfl.runner.fit_help import method_defaults
from pfl.runner.wandb_report import log_report, report_identity

USAGE = (
    "usage: python -m pfl report RUN_DIR [RUN_DIR ...] [--metrics k1,k2] [--format markdown|csv|latex] "
    "[--plot FILE.png [--plot-metric KEY]] [--plot-clients FILE.png] [--wandb]"
)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m pfl report",
        usage_line=USAGE,
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
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="also draw the rows' curves over rounds into FILE (.png): mean over seeds, min–max band",
    )
    parser.add_argument(
        "--plot-metric",
        default=None,
        metavar="KEY",
        help="the metrics.csv key --plot draws (default: pm.l_acc.mean, else gm.acc, pm.mae.mean, gm.mae)",
    )
    parser.add_argument(
        "--plot-clients",
        type=Path,
        default=None,
        metavar="FILE",
        help="also draw each row's per-client own-test scores of the reported round into FILE, seeds pooled",
    )
    parser.add_argument(
        "--wandb",
        action="store_true",
        help="also log the figures to a new W&B run (job type report) in the runs' project and group",
    )
    return parser


def check_plots(args: argparse.Namespace) -> None:
    """The figure options make sense together and their files can be written (before anything is read)."""
    if args.plot_metric is not None and args.plot is None:
        raise ConfigError("--plot-metric", "chooses what --plot draws", "add --plot FILE.png")
    if args.wandb and args.plot is None and args.plot_clients is None:
        raise ConfigError("--wandb", "logs the figures", "add --plot FILE.png and/or --plot-clients FILE.png")
    for flag, path in (("--plot", args.plot), ("--plot-clients", args.plot_clients)):
        if path is not None:
            check_output(path, flag)
    if args.plot is not None and args.plot_clients is not None and args.plot.resolve() == args.plot_clients.resolve():
        raise ConfigError("--plot-clients", f"{args.plot} is also the --plot file", "give each figure its own file")


def draw_plots(args: argparse.Namespace) -> dict[Path, Figure]:
    """The requested figures by file, drawn in memory (nothing is written if one of them fails)."""
    if args.plot is None and args.plot_clients is None:
        return {}
    groups = plot_groups(args.run_dirs, group=not args.per_run, defaults=method_defaults)
    figures: dict[Path, Figure] = {}  # outside pyplot: nothing to close when one of them fails
    if args.plot is not None:
        figures[args.plot] = curve_figure(groups, args.plot_metric)[0]
    if args.plot_clients is not None:
        figures[args.plot_clients] = clients_figure(groups)[0]
    return figures


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_plots(args)
    to_wandb = report_identity(args.run_dirs) if args.wandb else None  # refused before anything is drawn
    metrics = [k.strip() for k in args.metrics.split(",") if k.strip()] if args.metrics else None
    table = report(
        args.run_dirs, metrics, args.format, group=not args.per_run, digits=args.digits, defaults=method_defaults
    )
    figures = draw_plots(args)
    for path, fig in figures.items():
        save_figure(fig, path)
        print(f"wrote {path}", file=sys.stderr)  # stdout stays the table (csv pipes)
    if to_wandb is not None:
        identity, runs = to_wandb
        keys = {args.plot: "curves", args.plot_clients: "clients"}
        where = log_report(identity, runs, {keys[path]: path for path in figures}, next(iter(figures)).parent)
        print(where, file=sys.stderr)
    note = platform_note(args.run_dirs)
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    print(table, end="")
    return 0
