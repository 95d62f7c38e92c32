"""Data configuration and the one function that turns it into a FederatedData."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pfl.data import bundled
from pfl.data.federated import ClientSplit, FederatedData
from pfl.data.partition import dirichlet_partition, iid_partition, split_indices
from pfl.data.synthetic import fedprox_synthetic
from pfl.errors import ConfigError, require
from pfl.seeding import numpy_rng

SOURCES = ("digits", "synthetic")
PARTITIONS = ("iid", "dirichlet")


@dataclass
class SyntheticConfig:
    """FedProx/LEAF Synthetic(α, β): α = model heterogeneity, β = feature heterogeneity."""

    alpha: float = 0.5
    beta: float = 0.5
    dim: int = 60
    num_classes: int = 10
    iid: bool = False


@dataclass
class DataConfig:
    source: str = "digits"
    num_clients: int = 20
    partition: str = "dirichlet"
    alpha: float = 0.5
    min_samples: int = 20
    test_frac: float = 0.25
    val_frac: float = 0.0
    global_test_frac: float = 0.1
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


def validate_data_config(cfg: DataConfig) -> None:
    require(
        cfg.source in SOURCES, "data.source", f"unknown source {cfg.source!r}", f"choose one of {', '.join(SOURCES)}"
    )
    require(
        cfg.partition in PARTITIONS,
        "data.partition",
        f"unknown partition {cfg.partition!r}",
        f"choose one of {', '.join(PARTITIONS)}",
    )
    require(cfg.num_clients >= 1, "data.num_clients", f"must be >= 1 (got {cfg.num_clients})")
    require(cfg.alpha > 0, "data.alpha", f"Dirichlet concentration must be > 0 (got {cfg.alpha})")
    require(cfg.min_samples >= 1, "data.min_samples", f"must be >= 1 (got {cfg.min_samples})")
    for name in ("test_frac", "val_frac", "global_test_frac"):
        value = getattr(cfg, name)
        require(0 <= value < 1, f"data.{name}", f"must be in [0, 1) (got {value})")
    require(
        cfg.test_frac + cfg.val_frac < 1,
        "data.test_frac",
        f"test_frac + val_frac = {cfg.test_frac + cfg.val_frac} leaves no training data",
        "keep their sum below 1",
    )


def build_data(cfg: DataConfig, seed: int) -> FederatedData:
    """Build the federation for ``cfg``; the same (cfg, seed) always gives the same partition."""
    validate_data_config(cfg)
    rng = numpy_rng(seed, "data")
    if cfg.source == "synthetic":
        s = cfg.synthetic
        xs, ys = fedprox_synthetic(cfg.num_clients, s.alpha, s.beta, rng, s.dim, s.num_classes, s.iid)
        x, y = np.concatenate(xs), np.concatenate(ys)
        bounds = np.cumsum([0] + [len(v) for v in ys])
        parts = [np.arange(bounds[k], bounds[k + 1]) for k in range(cfg.num_clients)]
        # Naturally federated: each client gives a share of its samples to the server's test pool.
        held = [split_indices(p, (1 - cfg.global_test_frac, cfg.global_test_frac), rng) for p in parts]
        parts = [h[0] for h in held]
        global_test = np.sort(np.concatenate([h[1] for h in held]))
        num_classes = s.num_classes
    else:
        x, y, num_classes = bundled.load_digits()
        pool, global_test = split_indices(np.arange(len(y)), (1 - cfg.global_test_frac, cfg.global_test_frac), rng)
        if cfg.partition == "iid":
            parts = [pool[p] for p in iid_partition(len(pool), cfg.num_clients, rng)]
        else:
            local = dirichlet_partition(y[pool], cfg.num_clients, cfg.alpha, rng, cfg.min_samples)
            parts = [pool[p] for p in local]
    clients = []
    for k, part in enumerate(parts):
        train, test, val = split_indices(part, (1 - cfg.test_frac - cfg.val_frac, cfg.test_frac, cfg.val_frac), rng)
        if len(train) == 0 or len(test) == 0:
            raise ConfigError(
                "data.num_clients",
                f"client {k} got {len(part)} samples, too few for a train and a test split",
                "use fewer clients or raise data.min_samples",
            )
        clients.append(ClientSplit(*(torch.from_numpy(a) for a in (train, test, val))))
    return FederatedData(
        name=cfg.source,
        x=torch.from_numpy(np.ascontiguousarray(x)),
        y=torch.from_numpy(np.ascontiguousarray(y)),
        num_classes=num_classes,
        clients=clients,
        global_test=torch.from_numpy(global_test),
    )
