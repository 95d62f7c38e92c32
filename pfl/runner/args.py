"""Parsing ``fit`` arguments: jsonargparse in Lightning-CLI style.

``--config FILE.yaml`` (repeatable, OmegaConf interpolation) and dotted overrides
(``--method.mu 0.05 --trainer.rounds 3``). The method is chosen first (``--method.name ditto``,
``--method ditto``, or the import path of a user's Method subclass), so ``--help`` lists that
method's own options. ``key=value`` arguments (as Hydra and W&B sweep commands write them) are
read as ``--key value``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

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
from pfl.errors import ConfigError, require
from pfl.methods.building import build_method
from pfl.methods.registry import method_class, method_names
from pfl.models import ModelConfig
from pfl.runner.method_choice import (
    DEFAULT_METHOD,
    interpolation_error,
    load_yaml,
    method_from_argv,
    method_in_file,
    read_text,
)
from pfl.runner.registry_help import registry_help
from pfl.suggest import choice_fix, close_matches, offer

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


class FitParser(ArgumentParser):
    """jsonargparse's parser with its defaults worked out once (a fit parser reads no default config files).
    Every parse starts from them, and working them out again (each option's default copied and checked) was
    a fifth of a parse. They are worked out anew when an option is added or a default set."""

    def get_defaults(self, skip_validation: bool = False, **kwargs: Any) -> Namespace:
        defaults = [action.default for action in self._actions]
        ids = tuple(map(id, defaults))
        kept = self.__dict__.get("_kept_defaults")
        if kept is None or kept[0] != ids:  # kept[1] holds the defaults: a replaced one's id is not reused
            kept = self.__dict__["_kept_defaults"] = (ids, defaults, super().get_defaults(skip_validation, **kwargs))
        return kept[2].clone()


def build_fit_parser(method_name: str) -> ArgumentParser:
    cls = method_class(method_name)
    parser = FitParser(
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
        help=f"one of: {', '.join(method_names())}; or package.module.Class of your own Method subclass",
    )
    parser.add_class_arguments(cls, "method")
    for group, dc in GROUPS.items():
        parser.add_class_arguments(dc, group)
    registry_help(parser)
    # `--method X` is pfl's shorthand for --method.name X (method_from_argv), never jsonargparse's file of the group
    # (a method without options has no such group)
    shorthand = next((a for a in parser._actions if a.option_strings == ["--method"]), None)
    if shorthand is not None:
        shorthand.metavar = "NAME"
        shorthand.help = "--method.name NAME, or the class whole: '{class_path: pkg.mod.Class, init_args: {...}}'"
    return parser


def default_config(method_name: str) -> dict[str, Any] | None:
    """The config.yaml a run of ``method_name`` with every option at its default writes (None for a
    name this pfl cannot build, e.g. a user's method class that is not importable here)."""
    return copy.deepcopy(_default_config(method_name))  # the caller's own: the parser's is kept


@functools.cache
def _default_config(method_name: str) -> dict[str, Any] | None:
    try:
        parser = build_fit_parser(method_name)
    except ConfigError:
        return None
    defaults = parser.get_defaults()
    defaults["method.name"] = method_name  # the parser's own default is fedavg; a run records its method
    return yaml.safe_load(parser.dump(defaults))


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


def parse_fit_args(
    argv: list[str], parsers: dict[str, ArgumentParser] | None = None
) -> tuple[RunConfig, Namespace, ArgumentParser, Path | None]:
    """The run's configuration from ``argv``, validated. With ``--resume DIR`` the overrides are first
    checked against DIR/config.yaml (``check_resume_overrides``); nothing is written here. ``parsers``:
    each method's parser, built once and kept there (a caller parsing many runs in a row; building
    one costs as much as a parse)."""
    argv, resume_dir = _rewrite_resume(hyphenate(list(argv)))
    name, argv = method_from_argv(argv)
    predating: list[str] = []
    if resume_dir is not None:
        recorded = RecordedConfig.read(resume_dir)
        check_resume_method(recorded, name)  # name is the recorded method from here on
        predating = predating_args(recorded, name)
        argv = [*argv[:2], *predating, *argv[2:]]  # after --config DIR
    if parsers is None:
        parser = build_fit_parser(name)
    elif name in parsers:
        parser = parsers[name]
    else:
        parser = parsers[name] = build_fit_parser(name)
    ns = _parse(parser, argv)
    if resume_dir is not None:
        check_resume_overrides(recorded, ns, parser, predating)
    method_args = ns.method.clone().as_dict()
    method_args.pop("name", None)
    method = build_method(method_class(name), method_args)
    rest = ns.clone()
    del rest["method"]
    init = parser.instantiate(rest)
    cfg = RunConfig(method=method, seed=init.seed, **{g: init[g] for g in GROUPS})
    validate(cfg)
    return cfg, ns, parser, resume_dir


def _parse(parser: ArgumentParser, argv: list[str], field: str = "arguments") -> Namespace:
    try:
        return parser.parse_args(argv)
    except argparse.ArgumentError as err:
        explained = _explain(str(err), parser)
        raise (explained if field == "arguments" else ConfigError(field, str(explained))) from None
    except OmegaConfBaseException as err:  # a config file's ${...} that does not resolve
        raise interpolation_error(err) from None


# What a resume may change: how long it runs (trainer.rounds, checked against the rounds done once
# the checkpoint is read), when it evaluates and checkpoints, where it runs (device settings change
# results only by float rounding), what is reported from the evaluations, and where results go.
# Everything else (seed, method, client, server, data, model, precision, sampling, eval.s_test,
# eval.s_acc_others and eval.pm_source, which define metrics already in the history) would mix two
# experiments.
RESUME_ALLOWED = frozenset(
    {
        "trainer.rounds",
        "trainer.eval_every",
        "trainer.checkpoint_every",
        "trainer.progress",
        "trainer.threads",
        "trainer.accelerator",
        "trainer.devices",
        "trainer.processes_per_device",
        "trainer.num_nodes",
        "trainer.strategy",
        "eval.batch_size",
        "eval.target",
        "eval.select",
        "eval.new_client_epochs",
        "eval.reference",
        "tracking.wandb",
        "tracking.project",
        "tracking.root",
        "tracking.overwrite",
    }
)
_NOT_SETTINGS = ("config", "resume", "__path__")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if not prefix and key in _NOT_SETTINGS:
            continue
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass(frozen=True)
class RecordedConfig:
    """A run folder's config.yaml, read once by a resume: the method it names and, when the file uses
    Lightning's class_path form, its text in pfl's form (``method_in_file``), which every check then
    reads as the fit's own parse does."""

    path: Path
    method: str
    rewritten: str | None

    @classmethod
    def read(cls, run_dir: Path) -> RecordedConfig:
        path = run_dir / "config.yaml"
        found, rewritten = method_in_file(path)
        return cls(path, found or DEFAULT_METHOD, rewritten)

    def config_args(self) -> list[str]:
        """``--config`` as the parser reads this file."""
        return ["--config", self.rewritten or str(self.path)]

    def method_group(self) -> Any:
        """The file's ``method:`` group in pfl's form (None when it has none)."""
        return load_yaml(self.path, self.rewritten or read_text(self.path)).get("method")


def resume_changes(
    recorded: RecordedConfig, ns: Namespace, parser: ArgumentParser, predating: list[str]
) -> dict[str, tuple[Any, Any]]:
    """``{key: (recorded, now)}`` for every setting ``ns`` changes from the ``recorded`` config.yaml, read
    by ``parser``, the recorded method's (a resume keeps it: ``check_resume_method``), with ``predating``, its
    ``predating_args``."""
    recorded_args = [*recorded.config_args(), *predating]
    before = _flatten(_parse(parser, recorded_args, "--resume").as_dict())
    now = _flatten(ns.as_dict())
    keys = list(before) + [k for k in now if k not in before]
    return {k: (before.get(k), now.get(k)) for k in keys if before.get(k) != now.get(k)}


def predating_args(recorded: RecordedConfig, name: str) -> list[str]:
    """``--method.OPTION=VALUE`` for each of method ``name``'s ``predating_options`` that the ``recorded``
    config.yaml lacks: the run was trained before the option existed, under the rule that value gives."""
    predating = method_class(name).predating_options
    if not predating:
        return []
    method = recorded.method_group()
    given = set(method) if isinstance(method, DictConfig) else set()
    return [f"--method.{key}={value}" for key, value in predating.items() if key not in given]


def recorded_defaults(method_name: str) -> dict[str, Any] | None:
    """What a run of ``method_name`` that lacks an option in its config.yaml ran with: ``default_config``,
    except the ``predating_options`` (an option whose default changed after runs were recorded)."""
    config = default_config(method_name)
    if config is None:
        return None
    config["method"].update(method_class(method_name).predating_options)
    return config


def check_resume_method(recorded: RecordedConfig, name: str) -> None:
    """Refuse a resume that names another method than the recorded one: its options would be parsed
    against the recorded method's and fail on one of them, which misleads."""
    if name != recorded.method:
        raise ConfigError(
            "--resume",
            f"{recorded.path.parent} was recorded with method {recorded.method}; a resume may not change the "
            f"method (got {name})",
            f"resume without --method.name, or start a new run (another --tracking.name) to train {name}",
        )


def check_resume_overrides(
    recorded: RecordedConfig, ns: Namespace, parser: ArgumentParser, predating: list[str]
) -> None:
    """Refuse a resume whose overrides change what the recorded run is (``RESUME_ALLOWED``); ``parser`` and
    ``predating`` read the recorded config.yaml (``resume_changes``)."""
    run_dir = recorded.path.parent
    refused = {k: v for k, v in resume_changes(recorded, ns, parser, predating).items() if k not in RESUME_ALLOWED}
    if refused:
        listing = ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in refused.items())
        raise ConfigError(
            "--resume",
            f"{run_dir} was recorded with other settings; a resume may not change {listing}",
            "start a new run (another --tracking.name) for a different setting; a resume may change only "
            + ", ".join(sorted(RESUME_ALLOWED)),
        )


def check_resume_progress(run_dir: Path, rounds_done: int, rounds: int) -> bool:
    """Refuse fewer rounds than ``run_dir`` has done; True when it has already finished ``rounds``
    (its summary.json reports them), i.e. there is nothing left to do."""
    require(
        rounds >= rounds_done,
        "trainer.rounds",
        f"{rounds} is fewer than the {rounds_done} rounds {run_dir} has already done",
        f"resume with --trainer.rounds {rounds_done} or more; a run is never cut back",
    )
    if rounds != rounds_done:
        return False
    summary = _finished_summary(run_dir)  # None: killed between its last checkpoint and its summary
    return summary is not None and summary.get("rounds") == rounds_done


def check_resume_without_checkpoint(run_dir: Path, rounds: int) -> bool:
    """A resume of a folder with no checkpoint (``trainer.checkpoint_every: 0``, or killed before its
    first): True when its summary already reports ``rounds`` (nothing left to do); a finished run of
    other rounds is refused, since nothing can continue it and retraining would replace its results;
    False (no summary) starts the run from round 0."""
    summary = _finished_summary(run_dir)
    if summary is None:
        return False
    done = summary.get("rounds")
    require(
        done == rounds,
        str(run_dir),
        f"finished {done} rounds but holds no checkpoint to continue from (trainer.checkpoint_every: 0 writes none)",
        "start a new run with the rounds you want (another --tracking.name)",
    )
    return True


def _finished_summary(run_dir: Path) -> dict | None:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _explain(message: str, parser: ArgumentParser) -> ConfigError:
    """jsonargparse's refusal as one line naming the key: an unknown option or choice with the closest
    known one (``pfl.suggest``); the full list of options is ``--help``'s."""
    message = " ".join(message.split())
    unknown = _unknown_keys(message)
    if unknown:
        keys = _keys(parser)
        fixes = [_key_fix(key, keys) for key in unknown]
        if len(unknown) == 1:
            return ConfigError(unknown[0], "unrecognized option", fixes[0])
        listing = ", ".join(f"{key} ({fix})" for key, fix in zip(unknown, fixes, strict=True))
        return ConfigError("arguments", f"unrecognized options {listing}")
    choice = _LITERAL.fullmatch(message)
    if choice is not None:
        key, options, value = choice.group("key", "options", "value")
        allowed = [str(o) for o in ast.literal_eval(f"[{options}]")]
        return ConfigError(key, f"unknown value {value!r}", choice_fix(value, allowed))
    typed = _TYPE.fullmatch(message) or _UNION.fullmatch(message)
    if typed is not None:  # a value of the wrong type, in words rather than Python's class reprs
        kinds = [_KINDS.get(kind, kind) for kind in re.findall(r"<class '(\w+)'>", typed.group("types"))]
        return ConfigError(typed.group("key"), f"expected {' or '.join(kinds)}, got {typed.group('value')!r}")
    missing = _NO_VALUE.fullmatch(message)
    if missing is not None:  # argparse reads a value starting with '-' (other than a number) as an option
        key = missing.group("key")
        return ConfigError(key, "has no value", f"give one after it; a value starting with '-' goes as --{key}=VALUE")
    other = _OTHER_KEY.fullmatch(message)
    if other is not None:  # e.g. a value of the wrong type
        return ConfigError(other.group("key"), other.group("problem"))
    return ConfigError("arguments", message)


# jsonargparse's wording for an option no group has, and for a value outside a Literal's
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (?P<args>.*)")
_NOT_ACCEPTED = re.compile(r"Group '(?P<group>[^']+)' does not accept option '(?P<key>[^']+)'|Option '(?P<full>[^']+)'")
_LITERAL = re.compile(
    r'Parser key "(?P<key>[^"]+)": Expected a typing\.Literal\[(?P<options>.*)\]\. Got value: (?P<value>.*)'
)
# jsonargparse's wording for a value of the wrong type (one type, or an Optional's types) and argparse's
# for an option given without a value
_TYPE = re.compile(r'Parser key "(?P<key>[^"]+)": Expected a (?P<types><class \'\w+\'>)\. Got value: (?P<value>.*)')
_UNION = re.compile(
    r'Parser key "(?P<key>[^"]+)": Does not validate against any of the Union subtypes '
    r"Subtypes: \[(?P<types>(?:<class '\w+'>(?:, )?)+)\] .* Given value: (?P<value>.*)"
)
_KINDS = {
    "int": "a whole number",
    "float": "a finite number",
    "bool": "true or false",
    "str": "text",
    "list": "a list in brackets (e.g. [1,2])",
    "dict": "a mapping",
    "NoneType": "null",
}
_NO_VALUE = re.compile(r"argument --(?P<key>[\w.]+): expected one argument")
_OTHER_KEY = re.compile(r'Parser key "(?P<key>[^"]+)": (?P<problem>.*)')
_SEE_HELP = "python -m pfl fit --help lists every option"


def _unknown_keys(message: str) -> list[str]:
    """The keys an "unknown option" refusal names, dotted as in a config (``trainer.roudns``)."""
    found = _UNRECOGNIZED.search(message)
    if found is not None:
        args = found.group("args").split()
        return [a.lstrip("-").split("=", 1)[0] for a in args if a.startswith("--")]
    found = _NOT_ACCEPTED.search(message)
    if found is not None:
        return [found.group("full") or f"{found.group('group')}.{found.group('key')}"]
    return []


def _key_fix(key: str, keys: list[str]) -> str:
    """The closest option of the key's own group (``trainer.roudns`` -> ``trainer.rounds``); else of any
    group (``trainer.lr`` -> ``client.lr``); else where every option is listed."""
    group, _, leaf = key.rpartition(".")
    by_leaf: dict[str, list[str]] = {}
    for known in keys:
        by_leaf.setdefault(known.rpartition(".")[2], []).append(known)
    own = [known.rpartition(".")[2] for known in keys if known.rpartition(".")[0] == group]
    close = [f"{group}.{name}" if group else name for name in close_matches(leaf, own, n=1)]
    if not close:
        close = [known for name in close_matches(leaf, by_leaf, n=1) for known in by_leaf[name]]
    return offer(close) or _SEE_HELP


def _keys(parser: ArgumentParser) -> list[str]:
    """Every option's dotted key (the groups themselves, such as ``trainer``, are not options)."""
    dests = [a.dest for a in parser._actions if a.dest not in ("help", "config", "print_config")]
    return [d for d in dests if not any(other.startswith(f"{d}.") for other in dests)]
