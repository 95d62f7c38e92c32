"""Parsing ``fit`` arguments: jsonargparse in Lightning-CLI style.

``--config FILE.yaml`` (repeatable, OmegaConf interpolation) and dotted overrides
(``--method.mu 0.05 --trainer.rounds 3``). The method is chosen first (``--method.name ditto``,
``--method ditto``, or the import path of a user's Method subclass), so ``--help`` lists that
method's own options. ``key=value`` arguments (as Hydra and W&B sweep commands write them) are
read as ``--key value``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace
from omegaconf import OmegaConf

from pfl.config import (
    AttackConfig,
    ClientConfig,
    EvalConfig,
    RunConfig,
    ServerConfig,
    TrackingConfig,
    TrainerConfig,
    validate,
)
from pfl.data.settings import DataConfig
from pfl.errors import ConfigError
from pfl.methods import method_class, methods
from pfl.models import ModelConfig

DEFAULT_METHOD = "fedavg"
GROUPS: dict[str, type] = {
    "trainer": TrainerConfig,
    "server": ServerConfig,
    "client": ClientConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "eval": EvalConfig,
    "tracking": TrackingConfig,
    "attack": AttackConfig,
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
    parser.add_argument(
        "--method.name",
        type=str,
        default=DEFAULT_METHOD,
        help=f"one of: {', '.join(methods())}; or package.module.Class of your own Method subclass",
    )
    parser.add_class_arguments(cls, "method")
    for group, dc in GROUPS.items():
        parser.add_class_arguments(dc, group)
    return parser


def method_from_argv(argv: list[str]) -> tuple[str, list[str]]:
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


def hyphenate(argv: list[str]) -> list[str]:
    """``key=value`` (Hydra / W&B ``${args_no_hyphens}`` style) -> ``--key=value``."""
    out = []
    for arg in argv:
        head = arg.split("=", 1)[0]
        if "=" in arg and not arg.startswith("-") and head.replace(".", "").replace("_", "").isalnum():
            arg = f"--{arg}"
        out.append(arg)
    return out


def parse_fit_args(argv: list[str]) -> tuple[RunConfig, Namespace, ArgumentParser, Path | None]:
    argv, resume_dir = _rewrite_resume(hyphenate(list(argv)))
    name, argv = method_from_argv(argv)
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
