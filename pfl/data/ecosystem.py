"""Datasets read through torchvision (``data.source: torchvision:<Name>``) and HuggingFace ``datasets``
(``data.source: hf:<folder or hub name>``), converted once into pfl's ``Part``s, so they are validated
and pooled exactly like every other source (official train split first, the test split last).

torchvision: an allow-list of datasets whose readers pfl has checked (IDX, bz2 text, .mat and binary
arrays, image files), read from ``data.root`` and downloaded only with ``data.download: true``.
``torchvision:CIFAR10`` / ``CIFAR100`` are read by pfl's own CIFAR reader with the restricted
unpickler, never by torchvision's ``pickle.load`` (SECURITY.md).

HuggingFace: a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, or a hub
dataset already in the local cache (``data.root`` as ``cache_dir``; offline unless ``data.download``).
``data.hf_input`` names the input column (an ``Image`` feature becomes float32 (C, H, W) in [0, 1];
a numeric array column is kept as stored) and ``data.hf_label`` the label column (``ClassLabel`` or
integers). ``datasets`` is optional (``pip install 'pfl[hf]'``) and imported only here, lazily.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pfl.data import disk
from pfl.data.progress import progress
from pfl.data.settings import DataConfig
from pfl.data.validate import Part
from pfl.errors import ConfigError, require

TORCHVISION = "torchvision:"
HF = "hf:"


@dataclass(frozen=True)
class TorchvisionSet:
    """How pfl reads one torchvision dataset: constructor argument per split, array layout, labels."""

    split_arg: str  # "train" (train=True/False) or "split" (split="train"/"test")
    layout: str  # NHW, NCHW (uint8 arrays in .data) or images (PIL images through __getitem__)
    labels: str | None  # attribute holding the labels (None: from __getitem__)
    num_classes: int
    layout_hint: str


IDX = "ROOT/{name}/raw/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte"
TORCHVISION_SETS = {
    "MNIST": TorchvisionSet("train", "NHW", "targets", 10, IDX.format(name="MNIST")),
    "FashionMNIST": TorchvisionSet("train", "NHW", "targets", 10, IDX.format(name="FashionMNIST")),
    "KMNIST": TorchvisionSet("train", "NHW", "targets", 10, IDX.format(name="KMNIST")),
    "QMNIST": TorchvisionSet("train", "NHW", "targets", 10, "ROOT/QMNIST/raw/qmnist-{train,test}-{images,labels}-*"),
    "USPS": TorchvisionSet("train", "NHW", "targets", 10, "ROOT/usps.bz2 and ROOT/usps.t.bz2"),
    "SVHN": TorchvisionSet("split", "NCHW", "labels", 10, "ROOT/{train,test}_32x32.mat"),
    "STL10": TorchvisionSet("split", "NCHW", "labels", 10, "ROOT/stl10_binary/{train,test}_{X,y}.bin"),
    "GTSRB": TorchvisionSet("split", "images", None, 43, "ROOT/gtsrb/GTSRB/{Training,Final_Test}/..."),
}
SAFE_READERS = {"CIFAR10": "cifar10", "CIFAR100": "cifar100"}  # read by pfl's restricted unpickler


def is_ecosystem(source: str) -> bool:
    return source.startswith((TORCHVISION, HF))


def dataset_label(source: str) -> str:
    """A name for folders, W&B tags and reports: ``torchvision:MNIST`` -> ``torchvision-MNIST``,
    ``hf:/data/my_set`` -> ``hf-my_set`` (other sources are their own label)."""
    if source.startswith(TORCHVISION):
        return "torchvision-" + source[len(TORCHVISION) :]
    if source.startswith(HF):
        tail = source[len(HF) :].rstrip("/\\")
        return "hf-" + (Path(tail).name or "dataset")
    return source


def check_ecosystem_config(cfg: DataConfig) -> None:
    """Refuse an unknown torchvision dataset, a torchvision source without data.root, an empty hf
    name and empty column names, before anything is read."""
    if cfg.source.startswith(TORCHVISION):
        name = cfg.source[len(TORCHVISION) :]
        known = sorted([*TORCHVISION_SETS, *SAFE_READERS])
        require(
            name in known,
            "data.source",
            f"torchvision dataset {name!r} is not one pfl reads",
            f"choose one of {', '.join('torchvision:' + k for k in known)} (others: save them with "
            "HuggingFace datasets or as npz_dir)",
        )
        require(cfg.root is not None, "data.root", f"{cfg.source} is read from disk", "set data.root to its directory")
    else:
        require(len(cfg.source) > len(HF), "data.source", "hf: needs a folder or a hub name", "e.g. hf:/data/my_set")
        require(bool(cfg.hf_input), "data.hf_input", "must name the input column", "e.g. image or x")
        require(bool(cfg.hf_label), "data.hf_label", "must name the label column", "e.g. label")


def ecosystem_parts(cfg: DataConfig) -> tuple[list[Part], int, str]:
    """The source's parts (train first, test last), its number of classes and the config key to name
    when a part is refused."""
    if cfg.source.startswith(TORCHVISION):
        parts, classes = torchvision_parts(cfg.source[len(TORCHVISION) :], Path(str(cfg.root)).expanduser(), cfg)
        return parts, classes, "data.root"
    parts, classes = hf_parts(cfg)
    return parts, classes, "data.source"


# -- torchvision ------------------------------------------------------------------------------------
def torchvision_parts(name: str, root: Path, cfg: DataConfig) -> tuple[list[Part], int]:
    if name in SAFE_READERS:
        return disk.standard_parts(SAFE_READERS[name], root, cfg.download, cfg.image_size)
    import torchvision.datasets as tvd

    spec = TORCHVISION_SETS[name]
    parts = []
    for split in ("train", "test"):
        kwargs: dict[str, Any] = {"train": split == "train"} if spec.split_arg == "train" else {"split": split}
        ds = _construct(getattr(tvd, name), name, root, kwargs, cfg.download, spec)
        x, y = _torchvision_arrays(ds, spec, cfg.image_size, f"torchvision:{name} ({split})")
        parts.append(Part(x, y, f"{root} (torchvision:{name}, {split} split)", None, split))
    return parts, spec.num_classes


def _construct(cls: type, name: str, root: Path, kwargs: dict[str, Any], download: bool, spec: TorchvisionSet) -> Any:
    try:
        return cls(str(root), download=download, **kwargs)
    except RuntimeError as err:  # torchvision's "Dataset not found or corrupted", or a damaged file
        fix = f"expected torchvision's layout: {spec.layout_hint}"
        if not download and "not found" in str(err).lower():
            fix += "; or set data.download: true to fetch it"
        raise ConfigError("data.root", f"torchvision:{name} not readable under {root}: {err}", fix) from None
    except Exception as err:  # network and archive errors come in many types
        where = "data.download" if download else "data.root"
        raise ConfigError(where, f"torchvision:{name} under {root}: {type(err).__name__}: {err}") from None


def _torchvision_arrays(ds: Any, spec: TorchvisionSet, size: int | None, what: str) -> tuple[np.ndarray, np.ndarray]:
    if spec.layout == "images":
        images, labels = [], []
        with progress(len(ds), f"reading {what}") as bar:
            for i in range(len(ds)):
                image, label = ds[i]
                images.append(_image_array(image, size, "RGB"))
                labels.append(int(label))
                bar.update(1)
        return _stack(images, what, "data.image_size"), np.asarray(labels, dtype=np.int64)
    data = np.asarray(ds.data)
    if spec.layout == "NHW":
        data = data[:, None]
    return data.astype(np.float32) / 255.0, np.asarray(getattr(ds, str(spec.labels)), dtype=np.int64)


def _image_array(image: Any, size: int | None, mode: str) -> np.ndarray:
    """A PIL image as uint8 (C, H, W) in ``mode`` (L: one channel, RGB: three), resized when asked."""
    from PIL import Image

    image = image.convert(mode) if image.mode != mode else image
    if size is not None and image.size != (size, size):
        image = image.resize((size, size), Image.BILINEAR)
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _stack(images: list[np.ndarray], what: str, field: str) -> np.ndarray:
    for i, image in enumerate(images):
        if image.shape != images[0].shape:
            raise ConfigError(
                field,
                f"{what}: image {i} is {image.shape[2]}x{image.shape[1]} pixels, image 0 is "
                f"{images[0].shape[2]}x{images[0].shape[1]}",
                "set data.image_size to resize every image",
            )
    if not images:
        return np.zeros((0, 1, 1, 1), dtype=np.float32)
    return np.stack(images).astype(np.float32) / 255.0


# -- HuggingFace datasets ---------------------------------------------------------------------------
def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data.source", "hf: sources need the HuggingFace datasets package", "pip install 'pfl[hf]'"
        ) from None
    return datasets


@contextlib.contextmanager
def _hub_offline(offline: bool) -> Iterator[None]:
    """Hub look-ups offline (the cache only) for the duration of one load. ``datasets`` reads the
    switch from its config module at call time; the environment variable alone is read at import."""
    if not offline:
        yield
        return
    import datasets.config
    import huggingface_hub.constants

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved[2]


def load_hf(cfg: DataConfig) -> tuple[Any, str]:
    """The Dataset or DatasetDict named by ``hf:<spec>`` and a description of where it came from."""
    datasets = _datasets()
    spec = cfg.source[len(HF) :]
    path = Path(spec).expanduser()
    if path.exists():
        try:
            return datasets.load_from_disk(str(path)), str(path)
        except Exception as err:  # datasets signals a foreign folder with several exception types
            raise ConfigError(
                "data.source",
                f"{path} is not a dataset folder written by save_to_disk ({type(err).__name__}: {err})",
                "write it with Dataset.save_to_disk(path) or DatasetDict.save_to_disk(path)",
            ) from None
    cache = str(Path(cfg.root).expanduser()) if cfg.root else None
    try:
        with _hub_offline(not cfg.download):
            return datasets.load_dataset(spec, cache_dir=cache), f"{spec} (hub cache {cache or 'default'})"
    except Exception as err:  # not cached, no network, unknown name: the fix is the same
        raise ConfigError(
            "data.source",
            f"{spec!r} is neither a folder nor a hub dataset in the local cache"
            f"{' (offline: data.download is false)' if not cfg.download else ''}: {type(err).__name__}: {err}",
            "give the folder written by save_to_disk, or set data.download: true to fetch it from the hub",
        ) from None


def _split_role(name: str) -> str:
    return {"test": "test", "validation": "val", "valid": "val", "val": "val"}.get(name, "train")


def hf_parts(cfg: DataConfig) -> tuple[list[Part], int]:
    datasets = _datasets()
    obj, where = load_hf(cfg)
    splits = list(obj.items()) if isinstance(obj, datasets.DatasetDict) else [("train", obj)]
    splits.sort(key=lambda s: _split_role(s[0]) == "test")  # the official test split last
    first = splits[0][1]
    for key, column in (("data.hf_input", cfg.hf_input), ("data.hf_label", cfg.hf_label)):
        for name, ds in splits:
            require(
                column in ds.column_names,
                key,
                f"{where} [{name}] has no column {column!r}",
                f"its columns: {', '.join(ds.column_names)}",
            )
    label_feature = first.features[cfg.hf_label]
    parts = []
    for name, ds in splits:
        what = f"{where} [{name}]"
        x = _hf_inputs(ds, cfg.hf_input, cfg.image_size, what, datasets)
        y = _hf_labels(ds, cfg.hf_label, what, datasets)
        parts.append(Part(x, y, what, None, _split_role(name)))
    if isinstance(label_feature, datasets.ClassLabel):
        classes = int(label_feature.num_classes)
    else:
        classes = 1 + max((int(p.y.max()) for p in parts if len(p.y)), default=0)
    return parts, classes


def _hf_inputs(ds: Any, column: str, size: int | None, what: str, datasets: Any) -> np.ndarray:
    feature = ds.features[column]
    if isinstance(feature, datasets.Image):
        images: list[np.ndarray] = []
        mode = ""
        with progress(len(ds), f"decoding {what}") as bar:
            for batch in ds.select_columns([column]).iter(batch_size=1024):
                for image in batch[column]:
                    mode = mode or ("L" if image.mode in ("1", "L", "I", "I;16", "F") else "RGB")
                    images.append(_image_array(image, size, mode))
                bar.update(len(batch[column]))
        return _stack(images, what, "data.image_size")
    values = ds.with_format("numpy")[column]
    try:
        array = np.asarray(values)
    except ValueError as err:
        raise ConfigError("data.hf_input", f"{what}: column {column!r} is not one array ({err})") from None
    if array.dtype == object:
        raise ConfigError(
            "data.hf_input",
            f"{what}: column {column!r} holds {feature} values, not numbers of one shape",
            "use an Image feature or fixed-size numeric arrays",
        )
    return array.astype(np.float32) if array.dtype.kind == "f" else array


def _hf_labels(ds: Any, column: str, what: str, datasets: Any) -> np.ndarray:
    feature = ds.features[column]
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string"):
        raise ConfigError(
            "data.hf_label",
            f"{what}: column {column!r} holds strings, not class ids",
            f"encode it first: ds = ds.class_encode_column({column!r})",
        )
    return np.asarray(ds.with_format("numpy")[column])
