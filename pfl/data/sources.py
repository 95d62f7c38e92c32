"""Every data source behind one call: ``load_pool(cfg, rng)`` returns the sample pool and, for
naturally federated sources, the clients (and any split) that come with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pfl.data import bundled, disk
from pfl.data.leaf import load_leaf
from pfl.data.npz import load_npz_dir
from pfl.data.regression import regression_clients
from pfl.data.synthetic import fedprox_synthetic, page_synthetic
from pfl.errors import ConfigError

if TYPE_CHECKING:
    from pfl.data.config import DataConfig

BUNDLED = ("digits", "mnist5k", "synthetic", "shakespeare")
ON_DISK = ("mnist", "fmnist", "cifar10", "cifar100", "tiny_imagenet", "gtsrb")
LEAF = ("leaf_shakespeare", "femnist")
SOURCES = (*BUNDLED, *ON_DISK, *LEAF, "npz_dir", "synthetic_regression")
TEXT_SOURCES = ("shakespeare", "leaf_shakespeare")
NATURAL_SOURCES = ("synthetic", "shakespeare", *LEAF, "npz_dir", "synthetic_regression")


@dataclass
class Pool:
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    clients: list[np.ndarray] | None = None  # natural clients; None: partition the pool
    splits: list[tuple[np.ndarray, ...]] | None = None  # (train, test[, val]) given by the source
    global_test: np.ndarray | None = None  # given by the source
    new_clients: list[int] | None = None  # ids held out by the source
    names: list[str] | None = None
    ordered: bool = False  # a client's samples are consecutive text windows
    official_test: np.ndarray | None = None  # the source's own test split (centralised sources)


def _group(xs: list[np.ndarray], ys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    bounds = np.cumsum([0] + [len(v) for v in ys])
    return np.concatenate(xs), np.concatenate(ys), [np.arange(bounds[k], bounds[k + 1]) for k in range(len(ys))]


def _shakespeare(cfg: DataConfig, rng: np.random.Generator) -> Pool:
    s = cfg.shakespeare
    roles = bundled.shakespeare_roles(min_lines=s.min_lines)
    if cfg.num_clients > len(roles):
        raise ConfigError(
            "data.num_clients",
            f"only {len(roles)} roles have >= {s.min_lines} speeches",
            "lower data.num_clients or data.shakespeare.min_lines",
        )
    chosen = np.sort(rng.choice(len(roles), cfg.num_clients, replace=False))
    xs, ys, names = [], [], []
    for r in chosen:
        tokens = bundled.encode_text(roles[r][1])
        n_windows = max(len(tokens) - s.seq_len, 0)
        stride = max(1, -(-n_windows // s.max_samples)) if s.max_samples else 1
        x, y = bundled.char_windows(tokens, s.seq_len, stride)
        xs.append(x)
        ys.append(y)
        names.append(roles[r][0])
    x, y, clients = _group(xs, ys)
    return Pool(x, y, len(bundled.LEAF_LETTERS), clients, names=names, ordered=True)


def _synthetic(cfg: DataConfig, rng: np.random.Generator) -> Pool:
    s = cfg.synthetic
    if s.variant == "page":
        xs, ys = page_synthetic(cfg.num_clients, rng, s.dim, s.num_classes, s.samples)
    else:
        xs, ys = fedprox_synthetic(cfg.num_clients, s.alpha, s.beta, rng, s.dim, s.num_classes, s.iid)
    x, y, clients = _group(xs, ys)
    return Pool(x, y, s.num_classes, clients)


def load_pool(cfg: DataConfig, rng: np.random.Generator) -> Pool:
    if cfg.source == "digits":
        return Pool(*bundled.load_digits())
    if cfg.source == "mnist5k":
        return Pool(*bundled.load_mnist5k())
    if cfg.source == "synthetic":
        return _synthetic(cfg, rng)
    if cfg.source == "shakespeare":
        return _shakespeare(cfg, rng)
    if cfg.source == "synthetic_regression":
        x, y, clients = _group(*regression_clients(cfg.num_clients, cfg.regression, rng))
        return Pool(x, y, 1, clients)
    root = Path(str(cfg.root)).expanduser()
    if cfg.source in ON_DISK:
        x, y, num_classes, num_train = disk.load_standard(cfg.source, root, cfg.download, cfg.image_size)
        return Pool(x, y, num_classes, official_test=np.arange(num_train, len(y)))
    if cfg.source in LEAF:
        x, y, num_classes, names, splits = load_leaf(cfg.source, root)
        _check_count(cfg, len(splits), "users")
        keep = np.sort(rng.choice(len(splits), cfg.num_clients, replace=False))  # LEAF-style user sampling
        splits, names = [splits[k] for k in keep], [names[k] for k in keep]
        return Pool(x, y, num_classes, [np.concatenate(s) for s in splits], splits, names=names)
    x, y, num_classes, splits, global_test, new = load_npz_dir(root)
    if cfg.num_clients != len(splits):
        raise ConfigError(
            "data.num_clients",
            f"{root} holds {len(splits)} clients but data.num_clients = {cfg.num_clients}",
            f"set data.num_clients: {len(splits)}",
        )
    return Pool(x, y, num_classes, [np.concatenate(s) for s in splits], splits, global_test, new)


def _check_count(cfg: DataConfig, available: int, what: str) -> None:
    if cfg.num_clients > available:
        raise ConfigError(
            "data.num_clients", f"{cfg.source} has {available} {what}", f"set data.num_clients <= {available}"
        )
