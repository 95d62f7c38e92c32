"""Normalisation choices for the backbones (``model.norm``): BatchNorm, GroupNorm or none.

GroupNorm is what federated papers use instead of BatchNorm on non-IID clients (Hsieh et al. 2020,
"The Non-IID Data Quagmire"; PLGU's ResNets "with group [norm]"): its statistics are per sample, so
there are no running averages for the server to average. The public FL code (the ``resnet18_gn`` of
FedDyn/FedSAM-style code bases) uses ``nn.GroupNorm(num_groups=2, C)``, hence ``model.groups: 2``;
32 is Wu & He's ImageNet default.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from pfl.errors import ConfigError

NormFactory = Callable[[int], nn.Module]
NORM_TYPES = (_BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)


def norm_factory(kind: str, groups: int) -> NormFactory:
    """channels -> norm module: ``batch`` BatchNorm2d, ``group`` GroupNorm(groups, C), ``none`` Identity."""
    if kind == "batch":
        return nn.BatchNorm2d
    if kind == "none":
        return lambda channels: nn.Identity()
    if kind == "group":
        return lambda channels: group_norm(groups, channels)
    raise ConfigError("model.norm", f"unknown norm {kind!r}", "choose one of batch, group, none")


def group_norm(groups: int, channels: int) -> nn.GroupNorm:
    if channels % groups != 0:
        raise ConfigError(
            "model.groups",
            f"{groups} groups do not divide a layer of {channels} channels",
            "choose a divisor of every layer width (2 divides all ResNet/WRN widths)",
        )
    return nn.GroupNorm(groups, channels)


def replace_batchnorm(module: nn.Module, factory: NormFactory) -> int:
    """Swap every BatchNorm in ``module`` for ``factory(C)`` in place; returns how many were swapped.

    The new norm takes over the BatchNorm's affine parameters when it has them, so initialisations such
    as timm's zero-initialised last norm of each residual block survive. timm's fused BatchNormAct2d
    (norm, dropout, activation in one module) keeps its dropout and activation after the new norm.
    """
    swapped = 0
    for name, child in list(module.named_children()):
        if isinstance(child, _BatchNorm):
            new = factory(child.num_features)
            if getattr(new, "weight", None) is not None and child.affine:
                new.weight.data.copy_(child.weight.data)
                new.bias.data.copy_(child.bias.data)
            extras = [
                m for m in (getattr(child, "drop", None), getattr(child, "act", None)) if isinstance(m, nn.Module)
            ]
            setattr(module, name, nn.Sequential(new, *extras) if extras else new)
            swapped += 1
        else:
            swapped += replace_batchnorm(child, factory)
    return swapped


def norm_layers(module: nn.Module) -> list[nn.Module]:
    """Every normalisation module (BatchNorm, GroupNorm, LayerNorm, InstanceNorm) inside ``module``."""
    return [m for m in module.modules() if isinstance(m, NORM_TYPES)]
