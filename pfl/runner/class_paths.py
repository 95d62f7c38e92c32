"""Lightning's ``class_path`` / ``init_args`` form of ``method:`` and ``model:``, read as pfl's own form.

``method: {class_path: pkg.mod.Class, init_args: {lam: 0.3}}`` is ``method: {name: ..., lam: 0.3}``: the
class's registered name when it has one (so a run is grouped and resumed like its short-form twin), else
its import path. ``model: {class_path: pkg.mod.Net, init_args: {...}}`` is ``model: {name: pkg.mod.Net,
init_args: {...}}`` (``model.init_args`` are your own model's keyword arguments). On the command line:
``--method.class_path X --method.init_args.lam 0.3``, or a mapping given whole:
``--method '{class_path: X, init_args: {lam: 0.3}}'``, ``--method.init_args '{lam: 0.3}'``. The rewrite
happens before parsing, so config.yaml and ``--print_config`` hold the short form, which ``--resume``
reads back.
"""

from __future__ import annotations

import yaml
from omegaconf import DictConfig, OmegaConf

from pfl.errors import ConfigError, require
from pfl.methods import class_path, method_class
from pfl.runner.options import option_args

CLASS_PATH, INIT_ARGS = "class_path", "init_args"
# Options that may hold a whole mapping (Lightning: ``--model '{class_path: ..., init_args: ...}'``).
MAPPING_OPTIONS = ("--method", "--model", f"--method.{INIT_ARGS}")


def method_name(path: str) -> str:
    """How the parser names the Method subclass at import path ``path`` (ConfigError naming method.class_path)."""
    try:
        return class_path(method_class(str(path)))
    except ConfigError as err:
        raise ConfigError(f"method.{CLASS_PATH}", err.problem, err.fix) from None


def expand_arg(arg: str, value: str | None) -> tuple[list[str], int] | None:
    """A mapping given whole to ``--method``, ``--model`` or ``--method.init_args`` as one option per key,
    and how many arguments it replaces; None for anything else (a plain ``--method NAME`` included)."""
    option, eq, inline = arg.partition("=")
    text = inline if eq else value
    if option not in MAPPING_OPTIONS or text is None or not text.lstrip().startswith("{"):
        return None
    try:
        tree = yaml.safe_load(text)  # YAML text that starts with "{" is a flow mapping or an error
    except yaml.YAMLError:
        return None  # the parser reports the value
    return option_args(tree, option[2:] + "."), 1 if eq else 2


def rewrite_arg(arg: str, value: str | None) -> tuple[str, str | None] | None:
    """``(option, value)`` of one class_path-form option in pfl's form (``value`` None: it was written
    ``--option=value``, which ``arg`` then holds); None for any other option."""
    option, eq, inline = arg.partition("=")
    if eq:
        value = inline
    if option == f"--method.{CLASS_PATH}" and value is not None:
        option, value = "--method.name", method_name(value)
    elif option.startswith(f"--method.{INIT_ARGS}."):
        option = "--method." + option[len(f"--method.{INIT_ARGS}.") :]
    elif option == f"--model.{CLASS_PATH}":
        option = "--model.name"
    else:
        return None
    return (f"{option}={value}", None) if eq else (option, value)


def rewrite_config(conf: DictConfig) -> DictConfig | None:
    """``conf`` (a config file) with its class_path-form groups in pfl's form; None when it has none."""
    changed = False
    method = conf.get("method")
    if isinstance(method, DictConfig) and (CLASS_PATH in method or INIT_ARGS in method):
        conf.method = _method_group(method)
        changed = True
    model = conf.get("model")
    if isinstance(model, DictConfig) and CLASS_PATH in model:
        require(
            "name" not in model,
            "model.class_path",
            "is given together with model.name",
            "give one of them: model.class_path (with model.init_args) or model.name",
        )
        group = OmegaConf.to_container(model)
        conf.model = {"name": group.pop(CLASS_PATH), **group}
        changed = True
    return conf if changed else None


def _method_group(method: DictConfig) -> dict:
    group = OmegaConf.to_container(method)
    require(
        not (CLASS_PATH in group and "name" in group),
        "method.class_path",
        "is given together with method.name",
        "give one of them: method.class_path (with method.init_args) or method.name",
    )
    init_args = group.pop(INIT_ARGS, None) or {}
    require(
        isinstance(init_args, dict),
        "method.init_args",
        f"must be a mapping of the method's arguments, got {init_args!r}",
        "e.g. init_args: {lam: 0.3}",
    )
    both = sorted(set(init_args) & set(group))
    require(
        not both, f"method.{INIT_ARGS}.{both[0] if both else ''}", "is also given outside init_args", "give it once"
    )
    if CLASS_PATH in group:
        group["name"] = method_name(group.pop(CLASS_PATH))
    return {**group, **init_args}
