"""Command line: ``python -m pfl fit|methods``.

``fit`` is jsonargparse in Lightning-CLI style: ``--config FILE.yaml`` (repeatable, OmegaConf
interpolation) and dotted overrides (``--method.mu 0.05 --trainer.rounds 3``). The method is chosen
first (``--method.name ditto``, or ``--method ditto``), so ``--help`` lists that method's own options.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf

from pfl.config import ClientConfig, EvalConfig, RunConfig, TrackingConfig, TrainerConfig, validate
from pfl.data.config import DataConfig
from pfl.errors import ConfigError
from pfl.methods import METHODS, method_class
from pfl.models import ModelConfig

DEFAULT_METHOD = "fedavg"
GROUPS: dict[str, type] = {
    "trainer": TrainerConfig,
    "client": ClientConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "eval": EvalConfig,
    "tracking": TrackingConfig,
}


def build_fit_parser(method_name: str) -> ArgumentParser:
    cls = method_class(method_name)
    parser = ArgumentParser(
        prog="python -m pfl fit",
        description=f"Run a federated experiment. Method: {method_name} - {cls.description}",
        parser_mode="omegaconf",
        exit_on_error=False,
    )
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file (repeatable; later wins)")
    parser.add_argument("--resume", type=str | None, default=None, help="continue the run in this run directory")
    parser.add_argument("--seed", type=int, default=0, help="seeds data partition, sampling, init and batches")
    parser.add_argument("--method.name", type=str, default=DEFAULT_METHOD, help=f"one of: {', '.join(METHODS)}")
    parser.add_class_arguments(cls, "method")
    for group, dc in GROUPS.items():
        parser.add_class_arguments(dc, group)
    return parser


def _method_from_argv(argv: list[str]) -> tuple[str, list[str]]:
    """Find the chosen method (argv wins over config files, later over earlier) and rewrite the
    ``--method NAME`` shorthand to ``--method.name NAME``."""
    name, out, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--method", "--method.name") and i + 1 < len(argv):
            name = argv[i + 1]
            out += ["--method.name", name]
            i += 2
            continue
        if arg.startswith(("--method=", "--method.name=")):
            name = arg.split("=", 1)[1]
            out.append(f"--method.name={name}")
        elif arg in ("--config", "--resume") and i + 1 < len(argv):
            path = Path(argv[i + 1]) / "config.yaml" if arg == "--resume" else Path(argv[i + 1])
            found = _method_in_file(path)
            name = found or name
            out += [arg, argv[i + 1]]
            i += 2
            continue
        else:
            out.append(arg)
        i += 1
    return name or DEFAULT_METHOD, out


def _method_in_file(path: Path) -> str | None:
    if not path.exists():
        raise ConfigError(
            "--config", f"file not found: {path}", "give the path of an existing YAML file, e.g. conf/default.yaml"
        )
    conf = OmegaConf.load(path)
    method = conf.get("method") if hasattr(conf, "get") else None
    if isinstance(method, str):
        return method
    if method is not None and method.get("name") is not None:
        return str(method.get("name"))
    return None


def _rewrite_resume(argv: list[str]) -> tuple[list[str], Path | None]:
    """``--resume DIR`` loads DIR/config.yaml first; later arguments still override it."""
    if "--resume" not in argv:
        return argv, None
    i = argv.index("--resume")
    if i + 1 >= len(argv):
        raise ConfigError("--resume", "needs a run directory", "e.g. --resume runs/fedavg-digits-s0-20260101-120000")
    run_dir = Path(argv[i + 1])
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(
            "--resume", f"{run_dir} has no config.yaml", "pass a directory written by `python -m pfl fit`"
        )
    rest = argv[:i] + argv[i + 2 :]
    return ["--config", str(run_dir / "config.yaml"), *rest], run_dir


def parse_fit_args(argv: list[str]) -> tuple[RunConfig, Namespace, ArgumentParser, Path | None]:
    argv, resume_dir = _rewrite_resume(list(argv))
    name, argv = _method_from_argv(argv)
    parser = build_fit_parser(name)
    try:
        ns = parser.parse_args(argv)
    except argparse.ArgumentError as err:
        raise ConfigError("arguments", _explain(str(err), parser)) from None
    method_args = ns.method.clone().as_dict()
    method_args.pop("name", None)
    method = method_class(name)(**method_args)
    rest = ns.clone()
    del rest["method"]
    init = parser.instantiate(rest)
    cfg = RunConfig(method=method, seed=init.seed, **{g: init[g] for g in GROUPS})
    validate(cfg)
    return cfg, ns, parser, resume_dir


def _explain(message: str, parser: ArgumentParser) -> str:
    if "unrecognized arguments" in message or "does not accept" in message or "No action for key" in message:
        groups = {
            g: sorted(k.split(".", 1)[1] for k in _keys(parser) if k.startswith(g + ".")) for g in ["method", *GROUPS]
        }
        listing = "; ".join(f"{g}: {', '.join(keys)}" for g, keys in groups.items())
        return f"{message.strip()}. Valid keys - {listing}"
    return message.strip()


def _keys(parser: ArgumentParser) -> list[str]:
    return [a.dest for a in parser._actions if a.dest not in ("help", "config", "print_config")]


def fit(argv: list[str]) -> dict[str, Any]:
    from pfl.experiment import run_experiment

    if "-h" in argv or "--help" in argv:
        name, _ = _method_from_argv([a for a in argv if a not in ("-h", "--help")])
        build_fit_parser(name).print_help()
        return {}
    cfg, ns, parser, resume_dir = parse_fit_args(argv)
    summary = run_experiment(cfg, parser.dump(ns), resume_dir=resume_dir)
    if rank_zero_only.rank != 0:  # the other ranks of a multi-process run stay quiet
        return summary
    shown = {k: v for k, v in summary["metrics"].items() if k.endswith((".mean", ".std")) or k == "gm.acc"}
    print(f"{summary['method']} on {summary['dataset']}: {summary['rounds']} rounds -> {summary['run_dir']}")
    for key, value in shown.items():
        print(f"  {key:<24} {value:.4f}")
    return summary


def list_methods() -> None:
    width = max(len(n) for n in METHODS)
    for name, cls in METHODS.items():
        print(f"{name:<{width}}  {cls.description}")


def sweep(argv: list[str]) -> None:
    from pfl.sweep import run_sweep

    parser = argparse.ArgumentParser(prog="python -m pfl sweep", description="Run a W&B sweep file locally.")
    parser.add_argument("file", help="sweep YAML, e.g. sweeps/fedprox_mu.yaml")
    parser.add_argument("--count", type=int, default=None, help="runs to draw (random) or keep (grid)")
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel")
    parser.add_argument("--root", type=Path, default=None, help="directory for the runs")
    args = parser.parse_args(argv)
    from pfl.metrics.report import report

    dirs = run_sweep(args.file, args.count, args.workers, args.root)
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "fit":
            fit(rest)
        elif command == "methods":
            list_methods()
        elif command == "sweep":
            sweep(rest)
        elif command == "reproduce":
            from pfl.reproduce import main as reproduce_main

            reproduce_main(rest)
        elif command == "data":
            from pfl.commands.data import main as data_main

            data_main(rest)
        elif command == "report":
            from pfl.commands.report import main as report_main

            return report_main(rest)
        else:
            raise ConfigError("command", f"unknown command {command!r}", f"choose one of {', '.join(COMMANDS)}")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
