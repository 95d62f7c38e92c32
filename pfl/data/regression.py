"""``synthetic_regression``: a naturally federated regression task, the embedded stand-in for FedORA's
agriculture data (leaf spectra -> a plant trait, clients = collection years).

Client k belongs to group g = k mod G. Its samples are x ~ N(μ_g, I_d) and y = xᵀ(w₀ + δ_g + ν_k) + b_g + ε:
w₀ is shared by everyone, δ_g and the feature mean μ_g are shared within a group (the part that makes
collaboration across groups harmful), ν_k is the client's own deviation and ε observation noise.
Targets are float32, so the framework trains with the MSE loss and reports MAE, R-MAE and PTR.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl.errors import require


@dataclass
class RegressionConfig:
    """Per-client linear-Gaussian regression: ``dim`` features, ``groups`` groups of clients,
    ``samples`` per client; standard deviations of the shared weights (``shared``), of each group's
    own weights (``specific``), of each client's deviation (``client``), of the group feature means
    (``shift``) and of the observation noise (``noise``); weight parts are scaled by 1/√dim so that
    xᵀw has the stated standard deviation."""

    dim: int = 10
    groups: int = 4
    samples: int = 60
    shared: float = 1.0
    specific: float = 1.0
    client: float = 0.1
    shift: float = 1.0
    noise: float = 0.5


def validate_regression(cfg: RegressionConfig) -> None:
    require(cfg.dim >= 1, "data.regression.dim", f"must be >= 1 (got {cfg.dim})")
    require(cfg.groups >= 1, "data.regression.groups", f"must be >= 1 (got {cfg.groups})")
    require(cfg.samples >= 4, "data.regression.samples", f"must be >= 4 (got {cfg.samples})")
    for name in ("shared", "specific", "client", "shift", "noise"):
        value = getattr(cfg, name)
        require(value >= 0, f"data.regression.{name}", f"a standard deviation must be >= 0 (got {value})")


def regression_clients(
    num_clients: int, cfg: RegressionConfig, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(features, targets) of each client, float32, grouped by client."""
    validate_regression(cfg)
    d, g = cfg.dim, cfg.groups
    scale = 1.0 / np.sqrt(d)
    w0 = rng.normal(0.0, cfg.shared * scale, d)
    delta = rng.normal(0.0, cfg.specific * scale, (g, d))
    bias = rng.normal(0.0, cfg.specific, g)
    mu = rng.normal(0.0, cfg.shift, (g, d))
    xs, ys = [], []
    for k in range(num_clients):
        grp = k % g
        w = w0 + delta[grp] + rng.normal(0.0, cfg.client * scale, d)
        x = mu[grp] + rng.normal(0.0, 1.0, (cfg.samples, d))
        y = x @ w + bias[grp] + rng.normal(0.0, cfg.noise, cfg.samples)
        xs.append(x.astype(np.float32))
        ys.append(y.astype(np.float32))
    return xs, ys
