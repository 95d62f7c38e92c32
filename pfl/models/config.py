"""The ``model:`` config group and its validation."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from pfl.errors import require

NORMS = ("batch", "group", "none")
STEMS = ("auto", "cifar", "imagenet")
CIFAR_STEM_MAX_SIDE = 64  # stem: auto picks the CIFAR stem for inputs at most this many pixels a side


@dataclass
class ModelConfig:
    """The network. ``name`` is a registered model (``pfl.models.available_models()``; docs/models.md),
    ``timm:<arch>`` for a timm backbone, or an import path ``pkg.module:builder`` / ``pkg.module.Class``.

    Args:
        name: registered model, ``timm:<arch>``, or ``pkg.module:builder`` / ``pkg.module.builder``.
        hidden: mlp widths; char_lstm LSTM widths.
        channels: cnn / cnn_bn conv widths, one conv-pool block each.
        fc: cnn / cnn_bn hidden FC width.
        kernel: cnn / cnn_bn conv kernel size.
        padding: cnn / cnn_bn conv padding.
        embed: char_lstm embedding width (LEAF: 8).
        norm: backbones (wrn28_10, timm:*): batch | group (GroupNorm, as PLGU) | none (no norm).
        groups: GroupNorm groups when norm is group (2, as the public FL code's resnet18_gn).
        stem: backbones: auto | cifar (3x3 stride-1 conv, no max-pool) | imagenet (7x7 stride-2 conv +
            max-pool); auto = cifar for inputs of at most 64 px a side.
        depth: wrn28_10 depth, 6n+4 (28: 4 blocks per group).
        widen: wrn28_10 widening factor k (10).
        dropout: wrn28_10 dropout between the two convs of a block (WRN paper: 0.3 on CIFAR; 0 = off).
        init_args: keyword arguments of your own model class or builder (name an import path), e.g.
            ``{width: 64}``; Lightning's ``model: {class_path: pkg.mod.Net, init_args: {...}}`` sets them.
    """

    name: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 128])
    channels: list[int] = field(default_factory=lambda: [32, 64])
    fc: int = 512
    kernel: int = 5
    padding: int = 2
    embed: int = 8  # char_lstm: embedding width (LEAF: 8)
    norm: str = "batch"  # backbones: batch | group | none
    groups: int = 2  # GroupNorm groups (norm: group)
    stem: str = "auto"  # backbones: auto | cifar | imagenet
    depth: int = 28  # wrn28_10: 6n+4
    widen: int = 10  # wrn28_10: widening factor
    dropout: float = 0.0  # wrn28_10: dropout inside each block
    init_args: dict[str, Any] = field(default_factory=dict)  # your own model's keyword arguments


# Fields only some builders read: a builder declares the ones it honours (``register(..., options=...)``)
# and any other builder rejects a non-default value instead of silently ignoring it.
OPTIONAL_FIELDS = ("norm", "groups", "stem", "depth", "widen", "dropout")
DEFAULTS = {f.name: f.default for f in fields(ModelConfig) if f.name in OPTIONAL_FIELDS}


def validate_model_config(cfg: ModelConfig) -> None:
    """Raise ConfigError naming the first invalid field (values only; the model decides what it honours)."""
    require(isinstance(cfg.name, str) and cfg.name.strip() != "", "model.name", "is empty", "e.g. mlp or timm:resnet18")
    for name, example in (("hidden", "[128, 128]"), ("channels", "[32, 64]")):
        widths = getattr(cfg, name)
        require(  # a 0 width trains a model that cannot learn; a negative one fails deep inside torch
            all(w >= 1 for w in widths), f"model.{name}", f"every width must be >= 1 (got {widths})", f"e.g. {example}"
        )
    for name in ("fc", "kernel", "embed"):
        require(getattr(cfg, name) >= 1, f"model.{name}", f"must be >= 1 (got {getattr(cfg, name)})")
    require(cfg.padding >= 0, "model.padding", f"must be >= 0 (got {cfg.padding})")
    require(cfg.norm in NORMS, "model.norm", f"unknown norm {cfg.norm!r}", f"choose one of {', '.join(NORMS)}")
    require(cfg.stem in STEMS, "model.stem", f"unknown stem {cfg.stem!r}", f"choose one of {', '.join(STEMS)}")
    require(cfg.groups >= 1, "model.groups", f"must be >= 1 (got {cfg.groups})")
    require(
        cfg.depth >= 10 and (cfg.depth - 4) % 6 == 0,
        "model.depth",
        f"a wide ResNet has depth 6n+4 with n >= 1 (got {cfg.depth})",
        "e.g. 10, 16, 22, 28, 40",
    )
    require(cfg.widen >= 1, "model.widen", f"must be >= 1 (got {cfg.widen})")
    require(0 <= cfg.dropout < 1, "model.dropout", f"must be in [0, 1) (got {cfg.dropout})")
    require(
        isinstance(cfg.init_args, dict) and all(isinstance(k, str) for k in cfg.init_args),
        "model.init_args",
        f"must be a mapping of keyword arguments, got {cfg.init_args!r}",
        "e.g. init_args: {width: 64}",
    )
    require(cfg.norm == "group" or cfg.groups == DEFAULTS["groups"], "model.groups", "is only used with norm: group")


def resolve_stem(stem: str, input_shape: tuple[int, ...]) -> str:
    """``cifar`` or ``imagenet``: ``auto`` picks cifar for inputs of at most 64 px a side (CIFAR, GTSRB,
    Tiny-ImageNet), where a 7x7 stride-2 conv and a max-pool would throw away 15/16 of the pixels."""
    if stem != "auto":
        return stem
    return "cifar" if max(input_shape[1:]) <= CIFAR_STEM_MAX_SIDE else "imagenet"
