"""Which method a ``fit`` command line chooses, read without building its parser (``--help`` needs only
the name, and the parser's modules import torch): ``--method NAME``, ``--method.name NAME``, the method
a ``--config`` file or a ``--resume`` folder's config.yaml names, or Lightning's class_path form of any
of them (``pfl.runner.class_paths``)."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pfl.errors import ConfigError, yaml_problem
from pfl.runner.class_paths import expand_arg, rewrite_arg, rewrite_config
from pfl.runner.config_files import resolve_config

DEFAULT_METHOD = "fedavg"


def method_from_argv(argv: list[str]) -> tuple[str, list[str]]:
    """Find the chosen method (argv wins over config files, later over earlier), rewrite the
    ``--method NAME`` shorthand to ``--method.name NAME``, and Lightning's class_path / init_args form
    (options and config files) to pfl's own (``pfl.runner.class_paths``)."""
    name, out, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        expanded = expand_arg(arg, value)
        if expanded is not None:  # its options are read in turn (a class_path among them rewritten)
            options, used = expanded
            argv = [*argv[:i], *options, *argv[i + used :]]
            continue
        rewritten = rewrite_arg(arg, value)
        if rewritten is not None:
            arg, value = rewritten
            if arg.startswith("--method.name"):
                name = value if value is not None else arg.split("=", 1)[1]
            out += [arg] if value is None else [arg, value]
            i += 1 if value is None else 2
            continue
        if arg in ("--method", "--method.name") and value is not None:
            name = value
            out += ["--method.name", name]
            i += 2
            continue
        if arg.startswith(("--method=", "--method.name=")):
            name = arg.split("=", 1)[1]
            out.append(f"--method.name={name}")
        elif arg.startswith("--config="):  # read as --config VALUE
            argv = [*argv[:i], "--config", arg.split("=", 1)[1], *argv[i + 1 :]]
            continue
        elif arg == "--resume" and value is not None:
            name = method_in_file(Path(value) / "config.yaml")[0] or name
            out += [arg, value]
            i += 2
            continue
        elif arg == "--config" and value is not None:
            path = resolve_config(value)
            found, text = method_in_file(path)
            name = found or name
            given = value if Path(value).expanduser().exists() else str(path)  # a shipped config: its full path
            out += [arg, given if text is None else text]
            i += 2
            continue
        else:
            out.append(arg)
        i += 1
    return name or DEFAULT_METHOD, out


def method_in_file(path: Path) -> tuple[str | None, str | None]:
    """The method a config file names (None: none), and the file's text in pfl's own form when it
    uses Lightning's class_path form (else None: the file is read as it is)."""
    if not path.exists():
        raise ConfigError(
            "--config", f"file not found: {path}", "give the path of an existing YAML file, e.g. conf/default.yaml"
        )
    text = read_text(path)
    if "${" in text:  # what it names may depend on the environment (${oc.env:...}): read every time
        return _method_in_text(path, text)
    return _method_in_plain_text(path, text)


def _method_in_text(path: Path, text: str) -> tuple[str | None, str | None]:
    conf = load_yaml(path, text)
    try:
        rewritten = rewrite_config(conf)
        method = conf.get("method")
        text = None if rewritten is None else OmegaConf.to_yaml(rewritten)
        if isinstance(method, str):
            return method, text
        if method is not None and method.get("name") is not None:
            return str(method.get("name")), text
    except OmegaConfBaseException as err:
        raise interpolation_error(err, "method") from None
    return None, text


# A file without interpolations names the same method whenever its text is the same: kept, since a suite or
# sweep parses the same few files hundreds of times, and loading one is a tenth of a parse.
_method_in_plain_text = functools.lru_cache(maxsize=256)(_method_in_text)

EXAMPLE = "trainer: {rounds: 5}"  # a config file's smallest useful content, on one line


def read_text(path: Path) -> str:
    """A config file's text; one that is not a readable text file is a one-line ConfigError."""
    if not path.is_file():
        raise ConfigError("--config", f"{path} is not a file", "give the path of a YAML file, e.g. conf/default.yaml")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("--config", f"cannot read {path}: {err}") from None


def load_yaml(path: Path, text: str) -> DictConfig:
    """Config file ``path`` (its ``text``) as a mapping; one that is not (bad YAML syntax, a list, empty) is
    a one-line ConfigError."""
    try:
        conf = OmegaConf.load(io.StringIO(text))
    except yaml.YAMLError as err:
        raise ConfigError("--config", f"{path} is not valid YAML{yaml_problem(err)}", "fix the file's syntax") from None
    except OmegaConfBaseException as err:
        raise ConfigError("--config", f"{path} cannot be read as a config: {str(err).splitlines()[0]}") from None
    if not isinstance(conf, DictConfig):
        raise ConfigError("--config", f"{path} holds a YAML list, not a mapping of groups", f"e.g. {EXAMPLE}")
    if not isinstance(yaml.safe_load(text), dict | None):  # OmegaConf makes `text` into {text: None}
        raise ConfigError("--config", f"{path} holds plain text, not a mapping of groups", f"e.g. {EXAMPLE}")
    if len(conf) == 0:  # parsed on, it would be refused as "Unexpected config:" without the file's name
        raise ConfigError(
            "--config", f"{path} holds no settings (it is empty or only comments)", f"add some, e.g. {EXAMPLE}"
        )
    return conf


def interpolation_error(err: OmegaConfBaseException, key: str = "--config") -> ConfigError:
    """OmegaConf's multi-line resolution error as one line naming the key and the fix."""
    problem = str(getattr(err, "msg", None) or err).splitlines()[0]
    if "Environment variable" in problem:
        fix = "set the variable, or give a default: ${oc.env:NAME,default}"
    elif "Recursive" in problem:
        fix = "a key cannot refer to itself, directly or through other keys; write its value"
    elif "Unsupported interpolation type" in problem:
        fix = "config files can use ${group.key} and OmegaConf's own resolvers (oc.env, oc.select...); write the value"
    elif "not found" in problem:
        fix = "refer to a key that exists, e.g. ${trainer.rounds}, or write the value"
    else:
        fix = "fix the ${...} interpolation or write the value"
    field = getattr(err, "full_key", None) or key
    return ConfigError(str(field), f"cannot resolve its ${{...}} interpolation in a --config file: {problem}", fix)
