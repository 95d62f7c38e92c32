"""Feature shift by rotation (FedORA's rotated MNIST/FMNIST): client groups see the images at
different angles. Rotation happens once, in place in the pool, when the federation is built."""

from __future__ import annotations

import numpy as np
import torch

from pfl.errors import ConfigError


def group_angles(groups: int) -> list[float]:
    """``groups`` angles spread evenly over 360° (group 0 is upright)."""
    return [360.0 * g / groups for g in range(groups)]


def rotate_images(x: np.ndarray, angle: float) -> np.ndarray:
    """Rotate images (N, C, H, W) counter-clockwise by ``angle`` degrees.

    Multiples of 90° on square images are exact (``rot90``, no interpolation); other angles use
    bilinear interpolation with zero fill (the corners leave the frame).
    """
    if x.ndim != 4:
        raise ConfigError(
            "data.rotation_groups", f"rotation needs images (N, C, H, W), got shape {x.shape}", "set it to 0"
        )
    angle = angle % 360
    quarter, rest = divmod(angle, 90)
    if rest == 0 and (x.shape[2] == x.shape[3] or quarter % 2 == 0):
        return np.ascontiguousarray(np.rot90(x, int(quarter), axes=(2, 3)))
    from torchvision.transforms.functional import InterpolationMode, rotate

    out = rotate(torch.from_numpy(np.ascontiguousarray(x)), angle, interpolation=InterpolationMode.BILINEAR)
    return out.numpy()


def rotate_groups(x: np.ndarray, members: list[np.ndarray], groups: int) -> list[float]:
    """Rotate in place the samples ``members[k]`` of client k by the angle of group ``k mod groups``.

    Each sample belongs to one client, so rotating in place stores every (rotated) sample once.
    Returns the angle of each client.
    """
    angles = group_angles(groups)
    per_client = [angles[k % groups] for k in range(len(members))]
    for idx, angle in zip(members, per_client, strict=True):
        if angle != 0 and len(idx):
            x[idx] = rotate_images(x[idx], angle)
    return per_client
