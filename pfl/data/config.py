"""Data configuration and the one function that turns it into a FederatedData.

The pipeline: load a pool (``sources``); for a centralised pool, hold out the server's global test
set, carve out one big client, then partition labels (IID / Dirichlet / Pat-k) with optional
log-normal quantity skew; naturally federated sources keep their clients. Then cap client sizes,
split each client into train/test/val, rotate client groups (feature shift) and hold out new clients.
Every step draws from one generator keyed by the seed, so the same (cfg, seed) gives the same split.
"""

from __future__ import annotations

import numpy as np
import torch

from pfl.data.augment import KINDS as AUGMENTATIONS
from pfl.data.ecosystem import check_ecosystem_config, dataset_label, is_ecosystem
from pfl.data.federated import ClientSplit, FederatedData
from pfl.data.partition import (
    contiguous_split,
    dirichlet_partition,
    iid_partition,
    lognormal_weights,
    pathological_partition,
    sized_partition,
    split_indices,
)
from pfl.data.rotation import rotate_groups
from pfl.data.settings import CLIENT_TESTS, PARTITIONS, SYNTHETIC_VARIANTS, DataConfig
from pfl.data.sources import SOURCES, Pool, load_pool, source_entry
from pfl.errors import ConfigError, require
from pfl.registry import require_choice
from pfl.seeding import numpy_rng


def validate_data_config(cfg: DataConfig) -> None:
    if is_ecosystem(cfg.source):
        check_ecosystem_config(cfg)
    source = source_entry(cfg.source)  # a ConfigError for a name no registry holds
    require_choice(cfg.partition, PARTITIONS, "data.partition")
    require_choice(cfg.synthetic.variant, SYNTHETIC_VARIANTS, "data.synthetic.variant")
    require_choice(cfg.augment, AUGMENTATIONS, "data.augment", "augmentation")
    require(cfg.num_clients >= 1, "data.num_clients", f"must be >= 1 (got {cfg.num_clients})")
    require(cfg.alpha > 0, "data.alpha", f"Dirichlet concentration must be > 0 (got {cfg.alpha})")
    require(cfg.min_samples >= 1, "data.min_samples", f"must be >= 1 (got {cfg.min_samples})")
    require(cfg.classes_per_client >= 1, "data.classes_per_client", f"must be >= 1 (got {cfg.classes_per_client})")
    require(cfg.quantity_sigma >= 0, "data.quantity_sigma", f"must be >= 0 (got {cfg.quantity_sigma})")
    require(cfg.rotation_groups >= 0, "data.rotation_groups", f"must be >= 0 (got {cfg.rotation_groups})")
    for name in ("test_frac", "val_frac", "global_test_frac", "big_client_frac", "new_clients"):
        value = getattr(cfg, name)
        require(0 <= value < 1, f"data.{name}", f"must be in [0, 1) (got {value})")
    require(
        cfg.test_frac + cfg.val_frac < 1,
        "data.test_frac",
        f"test_frac + val_frac = {cfg.test_frac + cfg.val_frac} leaves no training data",
        "keep their sum below 1",
    )
    require(cfg.client_test in CLIENT_TESTS, "data.client_test", f"unknown {cfg.client_test!r}", f"use {CLIENT_TESTS}")
    if cfg.client_test == "pool":
        require(cfg.test_frac == 0, "data.test_frac", "client_test: pool draws the test sets", "set it to 0")
        require(
            cfg.global_test_frac > 0 and not source.natural,
            "data.client_test",
            "pool draws each client's test set from a global test set cut from a centralised source",
            "set data.global_test_frac > 0 with a source such as mnist5k, or client_test: split",
        )
        require(cfg.rotation_groups == 0, "data.client_test", "pool shares test samples across rotated clients",
                "set data.rotation_groups 0 or client_test: split")  # fmt: skip
    if cfg.max_client_samples is not None:
        require(cfg.max_client_samples >= 2, "data.max_client_samples", f"must be >= 2 (got {cfg.max_client_samples})")
    n_new = round(cfg.new_clients * cfg.num_clients)
    require(
        n_new < cfg.num_clients,
        "data.new_clients",
        f"holds out {n_new} of {cfg.num_clients} clients, leaving none to train",
        "lower data.new_clients",
    )
    if cfg.big_client_frac > 0:
        require(cfg.num_clients >= 2, "data.big_client_frac", "needs data.num_clients >= 2")
        require(
            not source.natural,
            "data.big_client_frac",
            f"{cfg.source} is naturally federated",
            "use a centralised source (digits, mnist5k, mnist, cifar10, ...)",
        )
    if cfg.rotation_groups > 0:
        require(
            source.rotatable,
            "data.rotation_groups",
            f"{cfg.source} has no images to rotate",
            "set it to 0 or use an image source",
        )
    if source.needs_root:
        require(cfg.root is not None, "data.root", f"{cfg.source} is read from disk", "set data.root to its directory")
    if cfg.official_test:
        require(
            source.official_test,
            "data.official_test",
            f"{cfg.source} has no official test split",
            f"use one of {', '.join(n for n, e in SOURCES.entries().items() if e.official_test)} "
            "or data.global_test_frac",
        )
    if cfg.image_size is not None:
        require(cfg.image_size >= 1, "data.image_size", f"must be >= 1 (got {cfg.image_size})")
    s = cfg.synthetic
    require(s.dim >= 1 and s.num_classes >= 2, "data.synthetic", "needs dim >= 1 and num_classes >= 2")
    require(s.samples >= 2, "data.synthetic.samples", f"must be >= 2 (got {s.samples})")
    sh = cfg.shakespeare
    require(sh.seq_len >= 1, "data.shakespeare.seq_len", f"must be >= 1 (got {sh.seq_len})")
    require(sh.min_lines >= 1, "data.shakespeare.min_lines", f"must be >= 1 (got {sh.min_lines})")
    require(sh.max_samples >= 0, "data.shakespeare.max_samples", f"must be >= 0 (got {sh.max_samples})")


def _partition(cfg: DataConfig, y: np.ndarray, pool: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``pool`` (indices into y) over the clients, one big client first when asked."""
    parts: list[np.ndarray] = []
    n_clients = cfg.num_clients
    if cfg.big_client_frac > 0:
        rest, big = split_indices(pool, (1 - cfg.big_client_frac, cfg.big_client_frac), rng)
        parts, pool, n_clients = [big], rest, n_clients - 1
    weights = lognormal_weights(n_clients, cfg.quantity_sigma, rng) if cfg.quantity_sigma > 0 else None
    if cfg.partition == "iid":
        local = (
            iid_partition(len(pool), n_clients, rng)
            if weights is None
            else sized_partition(len(pool), weights, rng, cfg.min_samples)
        )
    elif cfg.partition == "dirichlet":
        local = dirichlet_partition(y[pool], n_clients, cfg.alpha, rng, cfg.min_samples, weights=weights)
    else:
        local = pathological_partition(y[pool], n_clients, cfg.classes_per_client, rng, weights)
    return parts + [pool[p] for p in local]


def _natural_global_test(cfg: DataConfig, pool: Pool, rng: np.random.Generator) -> tuple[list, np.ndarray]:
    """Naturally federated: each client gives a share of its samples to the server's test pool."""
    assert pool.clients is not None
    if pool.ordered:
        held = [contiguous_split(p, (1 - cfg.global_test_frac, cfg.global_test_frac)) for p in pool.clients]
    else:
        held = [split_indices(p, (1 - cfg.global_test_frac, cfg.global_test_frac), rng) for p in pool.clients]
    return [h[0] for h in held], np.sort(np.concatenate([h[1] for h in held]))


def _client_splits(cfg: DataConfig, pool: Pool, parts: list[np.ndarray], rng: np.random.Generator) -> list[tuple]:
    fractions = (1 - cfg.test_frac - cfg.val_frac, cfg.test_frac, cfg.val_frac)
    splits = []
    for k, part in enumerate(parts):
        big = k == 0 and cfg.big_client_frac > 0  # the cap shapes the others; the big client stays big
        if cfg.max_client_samples is not None and len(part) > cfg.max_client_samples and not big:
            part = np.sort(rng.choice(part, cfg.max_client_samples, replace=False))
        if pool.ordered:
            train, test, val = contiguous_split(part, fractions)
        else:
            train, test, val = split_indices(part, fractions, rng)
        if len(train) == 0 or (len(test) == 0 and cfg.client_test == "split"):
            raise ConfigError(
                "data.num_clients",
                f"client {k} got {len(part)} samples, too few for a train and a test split",
                "use fewer clients or raise data.min_samples",
            )
        splits.append((train, test, val))
    return splits


def label_matched(y: np.ndarray, train: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """The samples of ``pool`` whose label occurs in ``train`` (a client's test set of its own classes)."""
    return pool[np.isin(y[pool], np.unique(y[train]))]


def build_data(cfg: DataConfig, seed: int) -> FederatedData:
    """Build the federation for ``cfg``; the same (cfg, seed) always gives the same partition."""
    validate_data_config(cfg)
    rng = numpy_rng(seed, "data")
    pool = load_pool(cfg, rng)
    x, y = pool.x, pool.y
    if pool.splits is not None:  # the source fixed every client's split (LEAF, npz)
        splits = [tuple(s) + (np.zeros(0, dtype=np.int64),) * (3 - len(s)) for s in pool.splits]
        global_test = pool.global_test if pool.global_test is not None else np.zeros(0, dtype=np.int64)
    else:
        if pool.clients is not None:
            parts, global_test = _natural_global_test(cfg, pool, rng)
        elif cfg.official_test:
            assert pool.official_test is not None
            if len(pool.official_test) == 0:
                raise ConfigError("data.official_test", f"no official test files under {cfg.root}", "set it false")
            global_test = pool.official_test
            parts = _partition(cfg, y, np.arange(global_test[0]), rng)
        else:
            everything = np.arange(len(y))
            rest, global_test = split_indices(everything, (1 - cfg.global_test_frac, cfg.global_test_frac), rng)
            parts = _partition(cfg, y, rest, rng)
        splits = _client_splits(cfg, pool, parts, rng)
        if cfg.client_test == "pool":
            splits = [(train, label_matched(y, train, global_test), val) for train, _, val in splits]
    if cfg.rotation_groups > 0:
        x = np.array(x, copy=True) if not x.flags.writeable else x
        rotate_groups(x, [np.concatenate(s) for s in splits], cfg.rotation_groups)
        # The server's test set mixes all groups: its i-th sample goes to group i mod G.
        g = cfg.rotation_groups
        rotate_groups(x, [global_test[i::g] for i in range(g)], g)
    if pool.new_clients is not None:
        new_ids = set(pool.new_clients)
    else:
        new_ids = set(rng.choice(len(splits), round(cfg.new_clients * len(splits)), replace=False).tolist())
    names = pool.names or []

    def as_split(s: tuple) -> ClientSplit:
        return ClientSplit(*(torch.from_numpy(np.asarray(a, dtype=np.int64)) for a in s))

    keep = [k for k in range(len(splits)) if k not in new_ids]
    held = sorted(new_ids)
    return FederatedData(
        name=dataset_label(cfg.source),
        x=torch.from_numpy(np.ascontiguousarray(x)),
        y=torch.from_numpy(np.ascontiguousarray(y)),
        num_classes=pool.num_classes,
        clients=[as_split(splits[k]) for k in keep],
        global_test=torch.from_numpy(np.asarray(global_test, dtype=np.int64)),
        new_clients=[as_split(splits[k]) for k in held],
        client_names=[names[k] for k in keep + held] if names else [],
    )
