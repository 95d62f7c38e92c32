"""The papers' small models. Each ends in its ``nn.Linear`` classifier, registered last, so "head = last
layer" holds for FedPer/FedRep/LG-FedAvg (``FlatModule.tail_slice``) and FedRoD (``split_head``): the image
models are ``nn.Sequential``, the char-LSTM exposes ``features(x)`` and ``head``."""

from __future__ import annotations

import math

import torch
from torch import nn

from pfl.errors import ConfigError
from pfl.models.config import ModelConfig
from pfl.models.registry import register


def _require_image(name: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 3:
        raise ConfigError(
            "model.name", f"{name} needs image inputs (C, H, W), got shape {input_shape}", "use mlp or logreg"
        )


def conv_features(
    input_shape: tuple[int, ...],
    channels: list[int],
    kernel: int,
    padding: int,
    batchnorm: bool = False,
) -> nn.Sequential:
    """Conv(k, padding) [-> BatchNorm] -> ReLU -> MaxPool(2) per entry of ``channels``, then Flatten.
    With BatchNorm the conv has no bias: BN's shift makes it redundant."""
    blocks: list[nn.Module] = []
    in_ch = input_shape[0]
    for ch in channels:
        blocks.append(nn.Conv2d(in_ch, ch, kernel, padding=padding, bias=not batchnorm))
        if batchnorm:
            blocks.append(nn.BatchNorm2d(ch))
        blocks += [nn.ReLU(), nn.MaxPool2d(2)]
        in_ch = ch
    return nn.Sequential(*blocks, nn.Flatten())


def feature_width(features: nn.Module, input_shape: tuple[int, ...], field: str, fix: str) -> int:
    """Width of ``features``' flat output, found by a forward pass in eval mode (BN running stats are
    left untouched); a too-small input is a ConfigError on ``field``."""
    was_training = features.training
    features.eval()
    try:
        with torch.no_grad():
            return features(torch.zeros(1, *input_shape)).reshape(1, -1).shape[1]
    except RuntimeError as err:
        raise ConfigError(field, f"input {input_shape} is too small for this model ({err})", fix) from err
    finally:
        features.train(was_training)


def classifier(features: nn.Module, width: int, hidden: list[int], num_classes: int) -> nn.Sequential:
    """``Sequential(features, Linear, ReLU, ..., Linear)``: FC layers of widths ``hidden`` then the head."""
    layers: list[nn.Module] = [features]
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _conv_net(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: list[int],
    kernel: int,
    padding: int,
    hidden: list[int],
    batchnorm: bool = False,
    field: str = "model.name",
    fix: str = "use inputs of at least 32x32 or the cnn model",
) -> nn.Sequential:
    _require_image(name, input_shape)
    features = conv_features(input_shape, channels, kernel, padding, batchnorm)
    width = feature_width(features, input_shape, field, fix)
    return classifier(features, width, hidden, num_classes)


def _fedavg_cnn(
    name: str, cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, batchnorm: bool
) -> nn.Sequential:
    return _conv_net(
        name,
        input_shape,
        num_classes,
        cfg.channels,
        cfg.kernel,
        cfg.padding,
        [cfg.fc],
        batchnorm,
        field="model.channels",
        fix="use fewer model.channels or more model.padding",
    )


@register("logreg", "multinomial logistic regression on the flattened input")
def _logreg(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register("mlp", "fully connected ReLU network, widths from model.hidden (FedORA: 128-128)")
def _mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return classifier(nn.Flatten(), math.prod(input_shape), cfg.hidden, num_classes)


@register("cnn", "FedAvg-CNN: conv-pool blocks (model.channels) then FC model.fc (PGFed: 32/64 5x5, FC 512)")
def _cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _fedavg_cnn("cnn", cfg, input_shape, num_classes, batchnorm=False)


@register("cnn_bn", "FedAvg-CNN with BatchNorm after each conv (model.channels, model.fc); BN stats are buffers")
def _cnn_bn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return _fedavg_cnn("cnn_bn", cfg, input_shape, num_classes, batchnorm=True)


@register("fedpg_cnn", "FedPG's CIFAR CNN: conv 64 5x5, pool, conv 64 5x5, pool, FC 384, FC 192, FC classes")
def _fedpg_cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    # Unpadded 5x5 convs and 2x2 max-pools (32 -> 28 -> 14 -> 10 -> 5: 64*5*5 = 1600 features), as in
    # the pFL code bases FedPG follows (LG-FedAvg / FedRep "CNNCifar").
    return _conv_net("fedpg_cnn", input_shape, num_classes, [64, 64], 5, 0, [384, 192])


@register("lenet5", "LeNet-5: conv 6 5x5, pool, conv 16 5x5, pool, FC 120, FC 84, FC classes (ReLU, max-pool)")
def _lenet5(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    # The modern LeNet-5 (ReLU and max-pooling instead of tanh and trainable subsampling, a full C3
    # connection table): 32x32 -> 16*5*5 features; 28x28 MNIST -> 16*4*4 (no zero-padding to 32).
    return _conv_net("lenet5", input_shape, num_classes, [6, 16], 5, 0, [120, 84])


@register("fedora_cnn", "FedORA's 5-layer CNN (CIFAR-10, GTSRB): conv 16 5x5, pool, conv 32 5x5, pool, FC 120, 84")
def _fedora_cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    # The paper says only "a 5-layer CNN"; the authors' code (models/networks.py, CNN with n_kernels=16,
    # after pFedHN) is 2 unpadded 5x5 convs of 16 and 32 channels with 2x2 max-pools and FC 120-84-classes.
    return _conv_net("fedora_cnn", input_shape, num_classes, [16, 32], 5, 0, [120, 84])


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
        return self.head(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The last step's LSTM output: what the linear head classifies (FedRoD's split)."""
        h = self.embed(x.long())
        # oneDNN's CPU LSTM kernel is ~500x slower than ATen's on small batches (torch 2.15): skip it.
        mkldnn, before = torch.backends.mkldnn, torch.backends.mkldnn.enabled
        mkldnn.enabled = before and h.device.type != "cpu"
        try:
            for lstm in self.lstms:
                h, _ = lstm(h)
        finally:
            mkldnn.enabled = before
        return h[:, -1]


@register("char_lstm", "next-character LSTM (LEAF Shakespeare: embed model.embed=8, LSTM widths model.hidden)")
def _char_lstm(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 1:
        raise ConfigError(
            "model.name", f"char_lstm needs token windows (T,), got shape {input_shape}", "use a text data.source"
        )
    if not cfg.hidden:
        raise ConfigError("model.hidden", "char_lstm needs at least one LSTM width", "e.g. [256, 256]")
    return CharLSTM(num_classes, cfg.embed, cfg.hidden)
