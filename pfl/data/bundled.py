"""Real data that ships inside installed packages (no download)."""

from __future__ import annotations

import numpy as np


def load_digits() -> tuple[np.ndarray, np.ndarray, int]:
    """scikit-learn's 1 797 handwritten digits, 8x8 grey images scaled to [0, 1], shape (N, 1, 8, 8)."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None]
    return x, bunch.target.astype(np.int64), 10
