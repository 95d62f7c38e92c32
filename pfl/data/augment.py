"""Batched image augmentation on the device: random crop with zero padding, horizontal flip.

The standard CIFAR recipe (pad 4, random 32x32 crop, flip with probability 1/2) as one gather over
the whole batch, so it costs a few kernels instead of a Python loop over samples or a DataLoader
worker pool. Every random draw comes from the ``torch.Generator`` passed in:
keyed by (seed, round, client) the augmented batches repeat exactly, across processes and resumes.

Output pixel ``(b, c, i, j)`` is ``padded[b, c, i + dy_b, j' + dx_b]`` with ``j' = W-1-j`` for flipped
samples and ``j`` otherwise, where ``padded`` is ``x`` with ``p`` zero pixels on each side and
``dy_b, dx_b`` are uniform on ``{0, ..., 2p}`` (``dy = dx = p``: the original position).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pfl.errors import ConfigError

KINDS = ("none", "cifar", "flip")


@dataclass(frozen=True)
class Draw:
    """One batch's random choices: crop offsets into the padded image (B,) and flip flags (B,)."""

    dy: Tensor
    dx: Tensor
    flip: Tensor


@dataclass(frozen=True)
class Augment:
    """``Augment(crop_padding, flip)(x, generator)``: random crop after zero padding, random h-flip."""

    crop_padding: int = 4
    flip: bool = True

    def __post_init__(self):
        if self.crop_padding < 0:
            raise ConfigError("data.augment", f"crop padding must be >= 0 (got {self.crop_padding})")

    def __call__(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """A new augmented batch; ``x`` (B, C, H, W) is not modified."""
        return crop_flip(x, self.crop_padding, self.draw(len(x), generator, x.device))

    def draw(self, batch: int, generator: torch.Generator, device: torch.device | str = "cpu") -> Draw:
        """The random choices for ``batch`` samples, drawn on the generator's device (offsets first,
        then flips; a disabled part draws nothing)."""
        p, gdev = self.crop_padding, generator.device
        if p > 0:
            dy = torch.randint(0, 2 * p + 1, (batch,), generator=generator, device=gdev)
            dx = torch.randint(0, 2 * p + 1, (batch,), generator=generator, device=gdev)
        else:
            dy = dx = torch.zeros(batch, dtype=torch.long, device=gdev)
        if self.flip:
            flip = torch.rand(batch, generator=generator, device=gdev) < 0.5
        else:
            flip = torch.zeros(batch, dtype=torch.bool, device=gdev)
        return Draw(dy.to(device), dx.to(device), flip.to(device))

    def check_input_shape(self, input_shape: tuple[int, ...]) -> None:
        """ConfigError unless samples are images (C, H, W): call before training."""
        if len(input_shape) != 3:
            raise ConfigError(
                "data.augment",
                f"crop and flip need image samples (C, H, W), got shape {tuple(input_shape)}",
                "use augment: none for this data source",
            )


def crop_flip(x: Tensor, padding: int, draw: Draw) -> Tensor:
    """Crop each sample at ``(draw.dy, draw.dx)`` of its ``padding``-zero-padded copy, mirror the samples
    with ``draw.flip``. One ``gather`` over the flattened padded planes with a per-sample (H*W) index
    shared by the channels: 3-6x faster on CPU than 4-way advanced indexing or two gathers."""
    if x.dim() != 4:
        raise ValueError(f"expected a batch of images (B, C, H, W), got shape {tuple(x.shape)}")
    b, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding)) if padding > 0 else x
    wp = w + 2 * padding
    rows = draw.dy[:, None] + torch.arange(h, device=x.device)  # (B, H)
    cols = torch.arange(w, device=x.device).expand(b, w)
    cols = torch.where(draw.flip[:, None], w - 1 - cols, cols) + draw.dx[:, None]  # (B, W)
    index = (rows[:, :, None] * wp + cols[:, None, :]).reshape(b, 1, h * w).expand(b, c, h * w)
    return padded.reshape(b, c, -1).gather(2, index).reshape(b, c, h, w)


def from_config(kind: str) -> Augment | None:
    """``none`` -> None (no augmentation), ``cifar`` -> pad 4, random crop, flip; ``flip`` -> flip only."""
    if kind == "none":
        return None
    if kind == "cifar":
        return Augment(crop_padding=4, flip=True)
    if kind == "flip":
        return Augment(crop_padding=0, flip=True)
    raise ConfigError("data.augment", f"unknown augmentation {kind!r}", f"choose one of {', '.join(KINDS)}")
