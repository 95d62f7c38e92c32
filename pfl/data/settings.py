"""The data settings: one dataclass per group (read by the sources and by the federation builder)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pfl.data.regression import RegressionConfig

PARTITIONS = ("iid", "dirichlet", "pathological")
SYNTHETIC_VARIANTS = ("fedprox", "page")
CLIENT_TESTS = ("split", "pool")


@dataclass
class SyntheticConfig:
    """FedProx/LEAF Synthetic(α, β): α = model heterogeneity, β = feature heterogeneity.
    ``variant: page``: PAGE's shared labelling function with per-client mean shifts, ``samples`` each."""

    alpha: float = 0.5
    beta: float = 0.5
    dim: int = 60
    num_classes: int = 10
    iid: bool = False
    variant: str = "fedprox"
    samples: int = 375


@dataclass
class ShakespeareConfig:
    """Bundled plays: one client per role with >= ``min_lines`` speeches; samples are ``seq_len``-char
    windows and the next char; at most ``max_samples`` evenly spaced windows per role (0: all)."""

    seq_len: int = 80
    min_lines: int = 20
    max_samples: int = 1000


@dataclass
class DataConfig:
    # a registered source (pfl.data.sources.SOURCES), torchvision:<Name>, hf:<folder or hub name>, or the
    # import path of one of your own (docs/data.md, "Adding a data source")
    source: str = "digits"
    num_clients: int = 20  # all clients, including held-out new ones
    partition: str = "dirichlet"  # iid | dirichlet | pathological (ignored by naturally federated sources)
    alpha: float = 0.5  # Dirichlet concentration
    classes_per_client: int = 2  # k of pathological Pat-k
    quantity_sigma: float = 0.0  # log-normal quantity skew (0: off)
    min_samples: int = 20
    big_client_frac: float = 0.0  # share of the pool given to client 0 (FedORA's one big client)
    max_client_samples: int | None = None  # cap per client before its split (FedORA: 192)
    test_frac: float = 0.25
    # split: each client's test set is test_frac of its samples | pool: every sample of the server's global
    # test set whose label the client holds in its training split (shared between clients; test_frac 0)
    client_test: str = "split"
    val_frac: float = 0.0
    global_test_frac: float = 0.1
    official_test: bool = False  # on-disk sources: the official test split is the server's test set (PAGE)
    rotation_groups: int = 0  # feature shift: client k rotated by 360°·(k mod G)/G (0: off)
    new_clients: float = 0.0  # fraction of clients held out, never trained on
    root: str | None = None  # directory of on-disk / LEAF / npz data
    download: bool = False  # fetch with torchvision when absent (needs a network)
    image_size: int | None = None  # resize folder images (GTSRB default 32; Tiny-ImageNet native 64)
    augment: str = "none"  # training batches only: none | cifar (pad-4 random crop + flip) | flip
    hf_input: str = "image"  # hf:<dataset> sources: the input column (an Image feature or numeric arrays)
    hf_label: str = "label"  # hf:<dataset> sources: the label column (ClassLabel or integers)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    shakespeare: ShakespeareConfig = field(default_factory=ShakespeareConfig)
    regression: RegressionConfig = field(default_factory=RegressionConfig)  # source synthetic_regression
