"""Wide ResNet (Zagoruyko & Komodakis 2016) for CIFAR-size inputs; PLGU's CIFAR-100 model is WRN-28-10.

timm has no CIFAR wide ResNet (its ``wide_resnet50_2`` is the ImageNet bottleneck net), so it is built
here. WRN-d-k: a 16-channel 3x3 stem conv, three groups of n = (d-4)/6 pre-activation basic blocks of
16k, 32k, 64k channels (strides 1, 2, 2), norm-ReLU, global average pool, linear classifier. WRN-28-10
on 10 classes has 36,479,194 parameters (the paper's 36.5M).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pfl.errors import ConfigError
from pfl.models.config import ModelConfig, resolve_stem
from pfl.models.dropout import KeyedDropout
from pfl.models.norms import NormFactory, norm_factory
from pfl.models.registry import register


def _conv3x3(in_ch: int, out_ch: int, stride: int) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)


class WideBlock(nn.Module):
    """Pre-activation basic block: ``norm-ReLU-conv3x3(stride)-norm-ReLU-dropout-conv3x3`` plus the input,
    or a strided 1x1 conv of the activated input where the shape changes."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: NormFactory, dropout: float):
        super().__init__()
        self.norm1 = norm(in_ch)
        self.conv1 = _conv3x3(in_ch, out_ch, stride)
        self.norm2 = norm(out_ch)
        self.conv2 = _conv3x3(out_ch, out_ch, 1)
        self.dropout = KeyedDropout(dropout) if dropout > 0 else nn.Identity()  # each client's own masks
        self.shortcut = None
        if in_ch != out_ch or stride != 1:
            self.shortcut = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.norm1(x))
        skip = x if self.shortcut is None else self.shortcut(o)
        return self.conv2(self.dropout(F.relu(self.norm2(self.conv1(o))))) + skip


def wide_resnet(
    in_channels: int,
    num_classes: int,
    depth: int = 28,
    widen: int = 10,
    norm: NormFactory = nn.BatchNorm2d,
    dropout: float = 0.0,
    stem: str = "cifar",
) -> nn.Sequential:
    """``Sequential(body, Linear)``: body = stem, 3 groups of blocks, norm-ReLU, average pool, flatten.
    ``stem``: cifar = 3x3 stride-1 conv; imagenet = 7x7 stride-2 conv then a 3x3 stride-2 max-pool."""
    if depth < 10 or (depth - 4) % 6:
        raise ConfigError("model.depth", f"a wide ResNet has depth 6n+4 with n >= 1 (got {depth})", "e.g. 16 or 28")
    n = (depth - 4) // 6
    widths = [16, 16 * widen, 32 * widen, 64 * widen]
    if stem == "cifar":
        layers: list[nn.Module] = [_conv3x3(in_channels, widths[0], 1)]
    else:
        layers = [nn.Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False), nn.MaxPool2d(3, 2, 1)]
    in_ch = widths[0]
    for out_ch, stride in zip(widths[1:], (1, 2, 2), strict=True):
        blocks = [
            WideBlock(in_ch if i == 0 else out_ch, out_ch, stride if i == 0 else 1, norm, dropout) for i in range(n)
        ]
        layers.append(nn.Sequential(*blocks))
        in_ch = out_ch
    layers += [norm(in_ch), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    net = nn.Sequential(nn.Sequential(*layers), nn.Linear(in_ch, num_classes))
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)
    return net


@register(
    "wrn28_10",
    "Wide ResNet-28-10 (PLGU, CIFAR-100); model.depth/widen/dropout, model.norm/groups, model.stem",
    options=("norm", "groups", "stem", "depth", "widen", "dropout"),
)
def _wrn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ConfigError("model.name", f"wrn28_10 needs image inputs (C, H, W), got shape {input_shape}")
    norm = norm_factory(cfg.norm, cfg.groups)
    stem = resolve_stem(cfg.stem, input_shape)
    return wide_resnet(input_shape[0], num_classes, cfg.depth, cfg.widen, norm, cfg.dropout, stem)
