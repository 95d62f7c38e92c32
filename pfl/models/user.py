"""Your own model without editing pfl: ``model.name: mypkg.module:builder`` or ``mypkg.module.builder``.

The object found there is either a builder ``(cfg: ModelConfig, input_shape, num_classes) -> nn.Module``
or an ``nn.Module`` subclass constructed as ``Class(input_shape, num_classes)``; either also receives
``model.init_args`` as keyword arguments (Lightning's ``model: {class_path: ..., init_args: ...}``). The module must be
importable (installed, or on ``PYTHONPATH``). For head-based methods make it an ``nn.Sequential`` ending
in its ``nn.Linear`` classifier (docs/models.md).
"""

from __future__ import annotations

import importlib
import inspect

from torch import nn

from pfl.errors import ConfigError
from pfl.models.config import DEFAULTS, OPTIONAL_FIELDS, ModelConfig
from pfl.registry import import_fix


def is_import_path(name: str) -> bool:
    return ":" in name or "." in name


def split_import_path(name: str) -> tuple[str, str]:
    """``pkg.mod:attr.sub`` -> (``pkg.mod``, ``attr.sub``); ``pkg.mod.attr`` -> (``pkg.mod``, ``attr``)."""
    if ":" in name:
        module, _, attr = name.partition(":")
    else:
        module, _, attr = name.rpartition(".")
    if not module or not attr:
        raise ConfigError(
            "model.name", f"{name!r} is not an import path", "write pkg.module:builder or pkg.module.builder"
        )
    return module, attr


def import_model(name: str, cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    module_name, attr = split_import_path(name)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            "model.name",
            f"cannot import module {module_name!r} for model {name!r}: {err}",
            "install it or put its directory on PYTHONPATH, or choose a registered model",
        ) from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                "model.name",
                f"module {module_name!r} has no {attr!r} (model {name!r})",
                import_fix(module_name, "check the name after the module path"),
            )
        obj = getattr(obj, part)
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        args: tuple = (input_shape, num_classes)
        _check_unread_fields(cfg, name)
    elif callable(obj):
        args = (cfg, input_shape, num_classes)
    else:
        raise ConfigError(
            "model.name",
            f"{name!r} is a {type(obj).__name__}, not a model builder or nn.Module class",
            "point it at a function (cfg, input_shape, num_classes) -> nn.Module or an nn.Module subclass",
        )
    _check_init_args(obj, name, args, cfg.init_args)
    net = obj(*args, **cfg.init_args)
    if not isinstance(net, nn.Module):
        raise ConfigError(
            "model.name", f"{name!r} returned a {type(net).__name__}, not an nn.Module", "return the network"
        )
    return net


def _check_unread_fields(cfg: ModelConfig, name: str) -> None:
    """A class gets ``(input_shape, num_classes, **init_args)``, never ``cfg``: an optional ``model.*``
    field set for it (``model.dropout: 0.3``) would be ignored, so it is refused as a registered model
    that does not read it is (``check_options``)."""
    for field in OPTIONAL_FIELDS:
        value = getattr(cfg, field)
        if value != DEFAULTS[field]:
            raise ConfigError(
                f"model.{field}",
                f"{name} is a class, built as {name}(input_shape, num_classes, **model.init_args), which does not "
                f"read model.{field} (got {value!r})",
                f"pass your model's own argument in model.init_args (--model.init_args.{field} ...), or leave "
                f"model.{field} at {DEFAULTS[field]!r}; a builder function (cfg, input_shape, num_classes) reads "
                "the model.* fields",
            )


def _check_init_args(obj: object, name: str, args: tuple, init_args: dict) -> None:
    """A keyword argument the model does not take is a ConfigError naming it, not a TypeError mid-build."""
    if not init_args:
        return
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # no introspectable signature (some builtins): let the call decide
        return
    try:
        signature.bind(*args, **init_args)
    except TypeError as err:
        raise ConfigError(
            "model.init_args",
            f"{name} cannot be called with init_args {init_args}: {err}",
            f"give only the keyword arguments of {name}{signature}",
        ) from None
