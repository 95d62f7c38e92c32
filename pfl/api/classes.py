"""``pfl.fit(method=MyMethod)``, ``method=MyMethod(lam=0.3)``, ``model=MyNet``, ``model=MyNet(...)``: a class
or an instance as the config's Lightning form, ``{"class_path": "module.Class", "init_args": {...}}``.

A run folder's config.yaml names the class by its import path (so ``--resume``, sweeps and ``Run.model()``
find it again), so the class must be importable under that path: defined at the top level of a module, a
script or a notebook (``__main__``: found again only by that process), not inside a function. An instance
stands for its class and its constructor arguments, read back from its attributes of the same names (a
Method stores them so; a model must too): its weights are not used, the run initializes the model from its
seed.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from torch import nn

from pfl.errors import ConfigError
from pfl.methods import Method

# The arguments pfl gives a model class itself (pfl.models.user): not init_args.
MODEL_POSITIONAL = 2  # input_shape, num_classes


def class_form(field: str, value: Any) -> Any:
    """``value`` of the ``method`` or ``model`` argument in the config's form; anything else unchanged."""
    if field == "method":
        if isinstance(value, type) and issubclass(value, Method):
            return {"class_path": import_path(field, value)}
        if isinstance(value, Method):
            return {"class_path": import_path(field, type(value)), "init_args": _method_args(value)}
    if field == "model" and _is_module(value):
        cls = value if isinstance(value, type) else type(value)
        if cls.__module__.split(".")[0] == "torch":
            raise ConfigError(
                field,
                f"{cls.__qualname__} is torch's own layer, not a model built from (input_shape, num_classes)",
                "pass your own nn.Module subclass, or a registered model: model={'name': 'mlp'}",
            )
        if isinstance(value, type):
            return {"class_path": import_path(field, value)}
        return {"class_path": import_path(field, cls), "init_args": _model_args(value)}
    return value


def _is_module(value: Any) -> bool:
    return isinstance(value, nn.Module) or (isinstance(value, type) and issubclass(value, nn.Module))


def import_path(field: str, cls: type) -> str:
    """``module.Class`` that imports ``cls`` itself; a ConfigError naming ``field`` when it does not."""
    path = f"{cls.__module__}.{cls.__qualname__}"
    if "<locals>" in cls.__qualname__ or _imported(cls.__module__, cls.__qualname__) is not cls:
        raise ConfigError(
            field,
            f"{cls.__qualname__} cannot be imported as {path} (a run's config names it by its import path)",
            "define the class at the top level of a module, script or notebook",
        )
    return path


def _imported(module: str, qualname: str) -> Any:
    """What ``from module import qualname`` gives (None: nothing)."""
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


def _method_args(method: Method) -> dict[str, Any]:
    """``method.hparams()``; an argument it does not store under its name is a ConfigError, since the run,
    built from the class and these arguments, would take that argument's default instead."""
    unstored = method.unstored_options()
    if unstored:
        raise _not_stored("method", type(method), unstored[0])
    return method.hparams()


def _model_args(net: nn.Module) -> dict[str, Any]:
    """The constructor arguments of ``net``'s class beyond (input_shape, num_classes), from its attributes."""
    cls = type(net)
    params = list(inspect.signature(cls).parameters.values())  # a Python class: nn.Module's __init__ at least
    args: dict[str, Any] = {}
    for p in params[MODEL_POSITIONAL:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name not in vars(net):
            raise _not_stored("model", cls, p.name)
        args[p.name] = vars(net)[p.name]
    return args


def _not_stored(field: str, cls: type, name: str) -> ConfigError:
    """An instance of ``cls`` given for ``field`` that keeps no attribute ``name`` for its constructor argument:
    the run, built from the class and the arguments read back, could not take the value it was given."""
    return ConfigError(
        field,
        f"the {cls.__qualname__} instance does not store its argument {name!r} as an attribute",
        f'pass the class and its arguments: {field}={{"class_path": ..., "init_args": {{"{name}": ...}}}}, '
        f"or set self.{name} in its __init__",
    )
