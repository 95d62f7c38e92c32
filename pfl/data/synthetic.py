"""Synthetic(α, β) after FedProx/LEAF: per-client logistic models and per-client feature means.

α controls how much the clients' labelling functions differ, β how much their inputs differ.
Returns samples grouped by client: the partition is natural, not imposed.
"""

from __future__ import annotations

import numpy as np


def fedprox_synthetic(
    num_clients: int,
    alpha: float,
    beta: float,
    rng: np.random.Generator,
    dim: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    min_samples: int = 50,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    sizes = rng.lognormal(4, 2, num_clients).astype(int) + min_samples
    sizes = np.minimum(sizes, 2000)  # the log-normal tail would otherwise dominate the pool
    cov = np.diag(np.arange(1, dim + 1, dtype=np.float64) ** -1.2)
    mean_w = rng.normal(0, alpha, num_clients)
    shift = rng.normal(0, beta, num_clients)
    shared_w = rng.normal(0, 1, (dim, num_classes))
    shared_b = rng.normal(0, 1, num_classes)
    xs, ys = [], []
    for k in range(num_clients):
        mean_x = np.zeros(dim) if iid else rng.normal(shift[k], 1, dim)
        w = shared_w if iid else rng.normal(mean_w[k], 1, (dim, num_classes))
        b = shared_b if iid else rng.normal(mean_w[k], 1, num_classes)
        x = rng.multivariate_normal(mean_x, cov, sizes[k])
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w + b, axis=1).astype(np.int64))
    return xs, ys


def page_synthetic(
    num_clients: int,
    rng: np.random.Generator,
    dim: int = 30,
    num_classes: int = 30,
    samples: int = 375,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """PAGE's variant: one shared labelling function y = argmax(xW + b), (W, b) ~ N(0, 1), and a
    per-client mean shift B_i ~ N(0, 1): x ~ N(B_i, diag(j^-1.2)). ``samples`` per client."""
    std = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt of the diagonal covariance
    w = rng.normal(0, 1, (dim, num_classes))
    b = rng.normal(0, 1, num_classes)
    xs, ys = [], []
    for _ in range(num_clients):
        shift = rng.normal(0, 1)
        x = shift + std * rng.normal(0, 1, (samples, dim))
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ w + b, axis=1).astype(np.int64))
    return xs, ys
