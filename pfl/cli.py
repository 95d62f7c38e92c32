"""Command line: ``python -m pfl fit|methods|sweep|reproduce|data|report``.

Argument parsing for ``fit`` lives in ``pfl.runner.args``; this module only dispatches commands.
Each command imports what it needs when it runs: ``methods``, the usage and a built-in method's
``fit --help`` (``pfl.runner.fit_help``) need no torch.
Exit codes: 0 success (also a resume with nothing left to do), 2 bad input or an unusable run
folder (one line on stderr, nothing written), 3 training diverged (round and client named), 141 the
reader of stdout went away (``pfl methods | head``; nothing on stderr).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pfl.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, CommandParser, ConfigError, TrainingDiverged
from pfl.methods.registry import registered_descriptions
from pfl.suggest import choice_fix


def fit(argv: list[str]) -> dict[str, Any]:
    if "-h" in argv or "--help" in argv:
        from pfl.runner.fit_help import fit_help

        sys.stdout.write(fit_help([a for a in argv if a not in ("-h", "--help")]))
        return {}
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from pfl.runner.experiment import run_argv

    summary = run_argv(argv)
    if rank_zero_only.rank != 0:  # the other ranks of a multi-process run stay quiet
        return summary
    shown = {k: v for k, v in summary["metrics"].items() if k.endswith((".mean", ".std")) or k == "gm.acc"}
    if summary.get("already_finished"):
        print(f"{summary['run_dir']} already finished its {summary['rounds']} rounds; nothing to do", end=" ")
        print(f"(resume with --trainer.rounds > {summary['rounds']} to continue it). Its results:")
    if summary.get("replaced"):
        print(f"the earlier run of that name was moved to {summary['replaced']}")
    print(f"{summary['method']} on {summary['dataset']}: {summary['rounds']} rounds -> {summary['run_dir']}")
    for key, value in shown.items():
        print(f"  {key:<24} {'n/a' if value is None else format(value, '.4f')}")
    return summary


def list_methods(argv: list[str] | None = None) -> None:
    CommandParser(
        prog="python -m pfl methods",
        description="List every registered method with its one-line description "
        "(python -m pfl fit --method NAME --help: its options).",
    ).parse_args(argv or [])
    described = registered_descriptions()  # the built-ins read from the sources: no torch import
    width = max(len(n) for n in described)
    for name, description in described.items():
        print(f"{name:<{width}}  {description}")


def sweep(argv: list[str]) -> None:
    parser = CommandParser(prog="python -m pfl sweep", description="Run a W&B sweep file locally.")
    parser.add_argument("file", help="sweep YAML, e.g. sweeps/fedprox_mu.yaml")
    parser.add_argument("--count", type=int, default=None, help="runs to draw (random) or keep (grid)")
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel")
    parser.add_argument("--root", type=Path, default=None, help="directory for the runs")
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="ROOT",
        help="continue the interrupted sweep in ROOT: finished runs are kept, interrupted ones continue from "
        "their last checkpoint, the others start",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an option of every run")
    parser.add_argument(
        "--fresh-processes",
        action="store_true",
        help="start a new process for every run (default: each worker process runs one run after another)",
    )
    args = parser.parse_args(argv)
    from pfl.metrics.report import platform_note, report
    from pfl.runner.sweep import run_sweep  # after the parse: --help and a bad option need no torch

    dirs = run_sweep(args.file, args.count, args.workers, args.root, args.set, args.fresh_processes, args.resume)
    note = platform_note(dirs)  # as pfl report's: stdout stays the table
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    print(report(dirs), end="")


USAGE = """usage: python -m pfl <command> [options]

commands:
  fit       run an experiment (python -m pfl fit --help)
  methods   list every method with a one-line description
  sweep     run a W&B sweep file locally (python -m pfl sweep sweeps/fedprox_mu.yaml --workers 2)
  reproduce run the paper-reproduction suite, writes reproduce/REPORT.md (make reproduce)
  data      export a partition (npz) or print its statistics (python -m pfl data --help)
  report    table of finished runs (python -m pfl report --help)
"""


COMMANDS = ("fit", "methods", "sweep", "reproduce", "data", "report")
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell tool's status is when its reader goes away


def working_directory_on_path() -> None:
    """Put the working directory first on ``sys.path``, as ``python -m pfl`` has it, unless it is there:
    the installed ``pfl`` script starts with its own folder there instead, and would not import a user's
    ``--method mymodule.MyMethod`` (a model, a data source, ...) from the folder it is run in."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.insert(0, cwd)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a command line (the pfl script, python -m pfl), not a call from Python
        working_directory_on_path()
    try:
        code = run_command(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, where a reader that went away can still be handled
    except BrokenPipeError:
        # The reader stopped early (`pfl methods | head`): end quietly, as shell tools do, instead of a
        # traceback; stdout goes to /dev/null so that the interpreter's last flush fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def run_command(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "fit":
            fit(rest)
        elif command == "methods":
            list_methods(rest)
        elif command == "sweep":
            sweep(rest)
        elif command == "reproduce":
            from pfl.runner.reproduce_options import parse_args

            args = parse_args(rest)  # --help and a refused option need no torch
            from pfl.runner.reproduce import run_parsed

            run_parsed(args)
        elif command == "data":
            from pfl.commands.data_usage import help_text

            text = help_text(rest)
            if text is not None:  # the usage needs no torch
                print(text)
                return 0
            from pfl.commands.data import main as data_main

            data_main(rest)
        elif command == "report":
            from pfl.commands.report import main as report_main

            return report_main(rest)
        else:
            raise ConfigError("command", f"unknown command {command!r}", choice_fix(command, COMMANDS))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrainingDiverged as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    return 0
