"""timm backbones by name: ``model.name: timm:<arch>`` (timm:resnet18, timm:resnet50, ...).

The network is ``Sequential(body, Linear)``: ``body`` is ``timm.create_model(arch, pretrained=False,
num_classes=0, in_chans=C)`` (global pool and flatten included, timm's classifier removed) and the
``nn.Linear`` is the head, so "head = last layer" holds for every head-based method (FedPer/FedRep/LG
take the last layer slice, FedRoD splits the Sequential). Never pretrained: runs are offline.

``model.norm: group|none`` swaps every BatchNorm of the body for GroupNorm / nothing after creation
(``norms.replace_batchnorm``). Swapping instead of passing timm's ``norm_layer`` works for every timm
conv net alike; timm's ``get_norm_layer`` also drops a ``functools.partial``'s positional arguments,
and ``norm_layer`` means LayerNorm in transformers. For a ResNet the two give the same modules.

``model.stem: cifar`` (auto: inputs <= 64 px) is implemented for timm's ResNet family (resnet*, resnext*,
seresnet*, wide_resnet*, the deep-stem ``*d`` variants): a 3x3 stride-1 first conv and no max-pool.
"""

from __future__ import annotations

from torch import nn

from pfl.errors import ConfigError, require
from pfl.models.config import ModelConfig, resolve_stem
from pfl.models.norms import norm_factory, replace_batchnorm
from pfl.models.small import feature_width


def timm_model(arch: str, cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    import timm  # imported on use: it adds seconds to every ``import pfl``

    require(len(input_shape) == 3, "model.name", f"timm:{arch} needs image inputs (C, H, W), got {input_shape}")
    if not timm.is_model(arch):
        near = timm.list_models(f"*{arch}*")[:8]
        raise ConfigError(
            "model.name",
            f"timm has no model {arch!r}",
            f"close names: {', '.join(near)}" if near else "see timm.list_models(), e.g. timm:resnet18",
        )
    body = timm.create_model(arch, pretrained=False, num_classes=0, in_chans=input_shape[0])
    stem = cfg.stem
    if stem == "auto":
        stem = resolve_stem(stem, input_shape) if has_cifar_stem(body) else "imagenet"
    if stem == "cifar":
        set_cifar_stem(body, arch)
    if cfg.norm != "batch":
        swapped = replace_batchnorm(body, norm_factory(cfg.norm, cfg.groups))
        require(
            swapped > 0 or cfg.norm == "none",
            "model.norm",
            f"timm:{arch} has no BatchNorm to replace with GroupNorm",
            "use norm: batch to keep the architecture's own normalisation",
        )
    width = feature_width(body, input_shape, "model.name", "use a larger data.image_size or another architecture")
    return nn.Sequential(body, nn.Linear(width, num_classes))


def has_cifar_stem(body: nn.Module) -> bool:
    from timm.models.resnet import ResNet

    return isinstance(body, ResNet)


def set_cifar_stem(body: nn.Module, arch: str) -> None:
    """CIFAR stem in place: the first conv becomes 3x3 stride 1 (a deep stem keeps its 3x3 convs and
    loses the stride), the max-pool goes."""
    if not has_cifar_stem(body):
        raise ConfigError(
            "model.stem",
            f"the cifar stem is implemented for timm's ResNet family, not timm:{arch}",
            "use stem: imagenet (auto falls back to it)",
        )
    conv = body.conv1
    if isinstance(conv, nn.Conv2d):
        new = nn.Conv2d(conv.in_channels, conv.out_channels, 3, stride=1, padding=1, bias=conv.bias is not None)
        nn.init.kaiming_normal_(new.weight, mode="fan_out", nonlinearity="relu")  # timm's ResNet init
        body.conv1 = new
    else:  # deep stem: Sequential of 3x3 convs, the first one strided
        first = next(m for m in conv.modules() if isinstance(m, nn.Conv2d))
        first.stride = (1, 1)
    body.maxpool = nn.Identity()
