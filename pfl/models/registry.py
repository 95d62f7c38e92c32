"""Named model builders: ``@register(name, description)`` on ``(cfg, input_shape, num_classes) -> nn.Module``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from pfl.errors import require
from pfl.models.config import DEFAULTS, OPTIONAL_FIELDS, ModelConfig

Builder = Callable[[ModelConfig, tuple[int, ...], int], nn.Module]


@dataclass(frozen=True)
class Entry:
    build: Builder
    description: str
    options: tuple[str, ...]  # the optional ModelConfig fields this builder reads (config.OPTIONAL_FIELDS)


_REGISTRY: dict[str, Entry] = {}
# Besides registered names, these ModelConfig fields are honoured by the ``timm:`` backbones.
TIMM_OPTIONS = ("norm", "groups", "stem")


def register(name: str, description: str, options: tuple[str, ...] = ()) -> Callable[[Builder], Builder]:
    """Register ``fn`` under ``name``. ``options``: which of ``config.OPTIONAL_FIELDS`` it honours; a
    non-default value of any other optional field is a ConfigError for this model."""
    unknown = set(options) - set(OPTIONAL_FIELDS)
    if unknown:
        raise ValueError(f"register({name!r}): unknown options {sorted(unknown)}; choose from {OPTIONAL_FIELDS}")

    def wrap(fn: Builder) -> Builder:
        _REGISTRY[name] = Entry(fn, description, tuple(options))
        return fn

    return wrap


def available_models() -> dict[str, str]:
    return {name: entry.description for name, entry in _REGISTRY.items()}


def lookup(name: str) -> Entry | None:
    return _REGISTRY.get(name)


def check_options(cfg: ModelConfig, model: str, honoured: tuple[str, ...]) -> None:
    """Reject a non-default optional field that ``model`` would ignore."""
    for name in OPTIONAL_FIELDS:
        value = getattr(cfg, name)
        if name in honoured or value == DEFAULTS[name]:
            continue
        users = [n for n, e in _REGISTRY.items() if name in e.options]
        if name in TIMM_OPTIONS:
            users.append("timm:<arch>")
        require(
            False,
            f"model.{name}",
            f"model {model} does not use it (got {value!r})",
            f"it applies to {', '.join(users)}; leave it at {DEFAULTS[name]!r}",
        )
