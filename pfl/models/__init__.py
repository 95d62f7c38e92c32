"""Models chosen by name (docs/models.md).

``model.name`` is resolved in this order: a registered name (``available_models()``: the papers' small
models and wrn28_10), ``timm:<arch>`` (a timm backbone), else an import path ``pkg.module:builder`` or
``pkg.module.builder`` of your own builder or ``nn.Module`` class. Every built-in model is an
``nn.Sequential`` whose last module is its ``nn.Linear`` classifier.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from pfl.errors import ConfigError
from pfl.models import small, wrn  # noqa: F401  (registers the built-in models)
from pfl.models.config import NORMS, STEMS, ModelConfig, validate_model_config
from pfl.models.registry import TIMM_OPTIONS, Builder, available_models, check_options, lookup, register
from pfl.models.size import check_model_fits
from pfl.models.small import CharLSTM
from pfl.models.timm_backbones import timm_model
from pfl.models.user import import_model, is_import_path
from pfl.seeding import derive_seed
from pfl.suggest import did_you_mean

TIMM_PREFIX = "timm:"

__all__ = [
    "NORMS",
    "STEMS",
    "Builder",
    "CharLSTM",
    "ModelConfig",
    "available_models",
    "build_checked_model",
    "build_model",
    "check_model_builds",
    "check_model_config",
    "meta_model",
    "redrawn_params",
    "structure_model",
    "register",
    "validate_model_config",
]


def check_model_config(cfg: ModelConfig) -> None:
    """Everything about ``cfg`` that can be checked without building the model (for config validation):
    field values, and for a registered or timm name, that no optional field it ignores is set."""
    validate_model_config(cfg)
    name = cfg.name.strip()
    entry = lookup(name)
    if cfg.init_args and (entry is not None or name.startswith(TIMM_PREFIX)):
        raise ConfigError(
            "model.init_args",
            f"{name} is a built-in model: it reads the model.* fields, not init_args",
            "init_args are for your own model (an import path in model.name or model.class_path)",
        )
    if entry is not None:
        check_options(cfg, name, entry.options)
    elif name.startswith(TIMM_PREFIX):
        check_options(cfg, name, TIMM_OPTIONS)
    elif not is_import_path(name):
        raise ConfigError(
            "model.name",
            f"unknown model {name!r}",
            did_you_mean(name, available_models())
            or f"choose one of {', '.join(available_models())}, timm:<arch>, or an import path pkg.module:builder",
        )


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The network ``cfg`` names, for inputs of ``input_shape`` (one sample) and ``num_classes`` outputs.
    Parameters are initialised from torch's global RNG (the loop seeds it first). A built-in or timm
    model is first measured on the meta device and refused when it cannot fit in memory (``size``)."""
    check_model_config(cfg)
    check_model_builds(cfg, input_shape, num_classes)
    return build_checked_model(cfg, input_shape, num_classes)


def _builder(cfg: ModelConfig, shape: tuple[int, ...], num_classes: int) -> Callable[[], nn.Module] | None:
    """The built-in or timm model's builder; None for a builder of the user's (an import path)."""
    name = cfg.name.strip()
    entry = lookup(name)
    if entry is not None:
        return partial(entry.build, cfg, shape, num_classes)
    if name.startswith(TIMM_PREFIX):
        return partial(timm_model, name[len(TIMM_PREFIX) :], cfg, shape, num_classes)
    return None


def check_model_builds(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> None:
    """A built-in or timm model that cannot take ``input_shape`` or does not fit in memory is refused,
    from a build on the meta device (nothing allocated, no random number drawn). A user builder reads
    what it likes (it may count its calls or draw numbers): only its real build can tell."""
    shape = tuple(input_shape)
    build = _builder(cfg, shape, num_classes)
    if build is not None:
        check_model_fits(build, f"model {cfg.name.strip()} (input {shape}, {num_classes} classes)")


def meta_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module | None:
    """A built-in or timm model built on the meta device (its structure; nothing allocated, no random
    number drawn), or None: a user builder (called by the run, and by ``structure_model`` when a check needs
    its structure) or a model that cannot be built there."""
    build = _builder(cfg, tuple(input_shape), num_classes)
    if build is None:
        return None
    try:
        with torch.device("meta"):
            return build()
    except ConfigError:
        raise
    except Exception:  # a module that needs real tensors to build: its structure is known once built
        return None


def structure_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The network ``cfg`` names, for a check of its structure before the run builds it (``trainer.vectorize
    true``): ``meta_model``'s build where there is one, else a build on the meta device, or on the CPU for a
    model that cannot be built there. A user builder is called here once more than the run calls it, under
    a fork of torch's CPU generator, so the run's own build draws the same numbers."""
    net = meta_model(cfg, input_shape, num_classes)
    if net is not None:
        return net
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                return build_checked_model(cfg, input_shape, num_classes)
        except ConfigError:
            raise
        except Exception:  # it needs real tensors to build (e.g. it loads weights)
            return build_checked_model(cfg, input_shape, num_classes)


def build_checked_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``build_model`` of a ``cfg`` that ``check_model_config`` (a validated RunConfig) and
    ``check_model_builds`` (a run's plan) have passed."""
    shape = tuple(input_shape)
    build = _builder(cfg, shape, num_classes)
    return import_model(cfg.name.strip(), cfg, shape, num_classes) if build is None else build()


def redrawn_params(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, *keys: int | str) -> torch.Tensor:
    """The trainable parameters of another initialisation of the network ``cfg`` names: the model built
    once more, on the CPU as a run builds it, with torch's CPU generator seeded by ``keys`` (the global
    generator is restored after). Every entry comes from the build's own initialisers (each module's
    ``reset_parameters``, a builder's own init such as wrn28_10's Kaiming-normal convs or timm's), so it
    is an independent draw from the run's initial distribution. Flat in ``FlatModule``'s order."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(derive_seed(*keys))
        net = build_checked_model(cfg, input_shape, num_classes)
    return torch.cat([p.detach().reshape(-1) for p in net.parameters() if p.requires_grad])
