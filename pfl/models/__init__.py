"""Model registry: small paper models chosen by name."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from pfl.errors import ConfigError


@dataclass
class ModelConfig:
    name: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128, 128])
    channels: list[int] = field(default_factory=lambda: [32, 64])
    fc: int = 512
    kernel: int = 5
    padding: int = 2
    embed: int = 8  # char_lstm: embedding width (LEAF: 8)


Builder = Callable[[ModelConfig, tuple[int, ...], int], nn.Module]
_REGISTRY: dict[str, tuple[Builder, str]] = {}


def register(name: str, description: str) -> Callable[[Builder], Builder]:
    def wrap(fn: Builder) -> Builder:
        _REGISTRY[name] = (fn, description)
        return fn

    return wrap


def available_models() -> dict[str, str]:
    return {name: desc for name, (_, desc) in _REGISTRY.items()}


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if cfg.name not in _REGISTRY:
        raise ConfigError("model.name", f"unknown model {cfg.name!r}", f"choose one of {', '.join(_REGISTRY)}")
    return _REGISTRY[cfg.name][0](cfg, input_shape, num_classes)


@register("logreg", "multinomial logistic regression on the flattened input")
def _logreg(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register("mlp", "fully connected ReLU network, widths from model.hidden (FedORA: 128-128)")
def _mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in cfg.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


@register("cnn", "FedAvg-CNN: conv-pool blocks (model.channels) then FC model.fc (PGFed: 32/64 5x5, FC 512)")
def _cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ConfigError(
            "model.name", f"cnn needs image inputs (C, H, W), got shape {input_shape}", "use mlp or logreg"
        )
    blocks: list[nn.Module] = []
    in_ch = input_shape[0]
    for ch in cfg.channels:
        blocks += [nn.Conv2d(in_ch, ch, cfg.kernel, padding=cfg.padding), nn.ReLU(), nn.MaxPool2d(2)]
        in_ch = ch
    features = nn.Sequential(*blocks, nn.Flatten())
    with torch.no_grad():
        try:
            width = features(torch.zeros(1, *input_shape)).shape[1]
        except RuntimeError as err:
            raise ConfigError(
                "model.channels",
                f"input {input_shape} is too small for {len(cfg.channels)} conv-pool blocks",
                "use fewer model.channels or model.padding",
            ) from err
    return nn.Sequential(features, nn.Linear(width, cfg.fc), nn.ReLU(), nn.Linear(cfg.fc, num_classes))


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: embed each character, stacked LSTM, predict the next character from
    the last step's output. Inputs are int64 token windows (N, T)."""

    def __init__(self, vocab: int, embed: int, hidden: list[int]):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        widths = [embed, *hidden]
        self.lstms = nn.ModuleList(nn.LSTM(widths[i], widths[i + 1], batch_first=True) for i in range(len(hidden)))
        self.head = nn.Linear(hidden[-1], vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.long())
        # oneDNN's CPU LSTM kernel is ~500x slower than ATen's on small batches (torch 2.15): skip it.
        mkldnn, before = torch.backends.mkldnn, torch.backends.mkldnn.enabled
        mkldnn.enabled = before and h.device.type != "cpu"
        try:
            for lstm in self.lstms:
                h, _ = lstm(h)
        finally:
            mkldnn.enabled = before
        return self.head(h[:, -1])


@register("char_lstm", "next-character LSTM (LEAF Shakespeare: embed model.embed=8, LSTM widths model.hidden)")
def _char_lstm(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 1:
        raise ConfigError(
            "model.name", f"char_lstm needs token windows (T,), got shape {input_shape}", "use a text data.source"
        )
    if not cfg.hidden:
        raise ConfigError("model.hidden", "char_lstm needs at least one LSTM width", "e.g. [256, 256]")
    return CharLSTM(num_classes, cfg.embed, cfg.hidden)
