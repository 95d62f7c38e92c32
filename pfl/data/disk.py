"""Loaders for standard on-disk formats under ``data.root``. Each returns the samples of all official
splits merged into one pool (PGFed's protocol: partition the union, then split per client), as
float32 images (N, C, H, W) in [0, 1] and int64 labels, plus the number of official training samples
(they come first; the rest is the official test/validation split, PAGE's server test set).

A missing dataset raises ConfigError with the path looked at and the layout expected; with
``data.download: true`` the torchvision datasets that can fetch themselves are downloaded first.
A damaged file is a ConfigError naming it. CIFAR's pickled batches are read with the restricted
unpickler (``pfl.data.safe_pickle``): arrays, numbers, strings and containers, never code.

Each ``*_parts`` loader returns one ``Part`` per file (or per class folder), so that
``validate_source`` can name the file at fault; ``load_standard`` validates and pools them.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np

from pfl.data.progress import progress
from pfl.data.safe_pickle import restricted_load
from pfl.data.validate import Part, pool_parts, validate_source
from pfl.errors import ConfigError

LAYOUTS = {
    "mnist": "ROOT/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (torchvision's layout) "
    "or the same four IDX files directly in ROOT",
    "fmnist": "ROOT/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (torchvision's layout) "
    "or the same four IDX files directly in ROOT",
    "cifar10": "ROOT/cifar-10-batches-py/{data_batch_1..5,test_batch} (the python pickled batches)",
    "cifar100": "ROOT/cifar-100-python/{train,test} (the python pickled batches, fine labels)",
    "tiny_imagenet": "ROOT/tiny-imagenet-200/{wnids.txt, train/<wnid>/images/*.JPEG, "
    "val/images/*.JPEG, val/val_annotations.txt} (ROOT may also be the tiny-imagenet-200 folder itself)",
    "gtsrb": "ROOT/gtsrb/GTSRB/Training/<class 00000..00042>/*.ppm (torchvision's layout; optional test: "
    "ROOT/gtsrb/GTSRB/Final_Test/Images/*.ppm with ROOT/gtsrb/GT-final_test.csv), or ROOT/<class>/*.ppm",
}
TORCHVISION = {"mnist": "MNIST", "fmnist": "FashionMNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}
IMAGE_SUFFIXES = (".ppm", ".png", ".jpg", ".jpeg", ".bmp")
Loaded = tuple[np.ndarray, np.ndarray, int, int]  # x, y, num_classes, num_train (official train first)
FIELD = "data.root"


class DatasetMissing(ConfigError):
    """The dataset is absent (not damaged): the one case ``data.download`` may fix."""


def missing(source: str, root: Path, looked_at: Path) -> ConfigError:
    fix = f"expected layout: {LAYOUTS[source]}"
    if source in TORCHVISION or source == "gtsrb":
        fix += "; or set data.download: true to fetch it with torchvision"
    return DatasetMissing(FIELD, f"{source} not found at {looked_at} (data.root = {root})", fix)


def download(source: str, root: Path) -> None:
    """Fetch ``source`` into ``root`` with torchvision (needs a network)."""
    import torchvision.datasets as tvd

    if source != "gtsrb" and source not in TORCHVISION:
        raise ConfigError("data.download", f"torchvision cannot download {source}", f"place it as {LAYOUTS[source]}")
    try:
        if source == "gtsrb":
            for split in ("train", "test"):
                tvd.GTSRB(str(root), split=split, download=True)
        else:
            for train in (True, False):
                getattr(tvd, TORCHVISION[source])(str(root), train=train, download=True)
    except Exception as err:  # network errors come in many types; the fix is the same
        raise ConfigError(
            "data.download", f"downloading {source} into {root} failed: {err}", f"place it as {LAYOUTS[source]}"
        ) from err


# -- IDX (MNIST, Fashion-MNIST) -------------------------------------------------------------------
def read_idx(path: Path) -> np.ndarray:
    """An IDX file (optionally gzipped): big-endian magic (dtype code, ndim), then the dims, then data."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as err:
        raise ConfigError(FIELD, f"{path} is not readable ({type(err).__name__}: {err})") from None
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in dtypes:
        raise ConfigError(FIELD, f"{path} is not an IDX file", "use the original MNIST-format files")
    dtype, ndim = np.dtype(dtypes[raw[2]]), raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ConfigError(FIELD, f"{path} is truncated inside its header")
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(int)
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - 4 - 4 * ndim != expected:
        raise ConfigError(
            FIELD, f"{path} holds {len(raw) - 4 - 4 * ndim} data bytes, its header {tuple(dims)} says {expected}"
        )
    return np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim).reshape(dims)


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    return None


def idx_parts(source: str, root: Path) -> tuple[list[Part], int]:
    sub = root / TORCHVISION[source] / "raw"
    folder = sub if _find_idx(sub, "train-images-idx3-ubyte") else root
    parts = []
    for split, role in (("train", "train"), ("t10k", "test")):
        images = _find_idx(folder, f"{split}-images-idx3-ubyte")
        labels = _find_idx(folder, f"{split}-labels-idx1-ubyte")
        if images is None or labels is None:
            if split == "t10k" and parts:
                break  # the test files are optional
            raise missing(source, root, sub)
        x = read_idx(images)
        if x.ndim != 3:
            raise ConfigError(FIELD, f"{images} holds an array of shape {x.shape}, not (N, H, W) images")
        parts.append(Part(x[:, None].astype(np.float32) / 255.0, read_idx(labels), f"{images} + {labels}", None, role))
    return parts, 10


# -- CIFAR python batches ---------------------------------------------------------------------------
def read_cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One python batch: a pickled dict with bytes keys, ``b'data'`` (N, 3072) uint8 rows of channel
    planes and the labels under ``label_key``; unpickled with the restricted unpickler."""
    with open(path, "rb") as f:
        batch = restricted_load(f, path, encoding="bytes")
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        raise ConfigError(FIELD, f"{path} is not a CIFAR python batch (no {b'data'!r} and {label_key!r} entries)")
    try:
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[label_key])
    except (ValueError, TypeError) as err:
        raise ConfigError(FIELD, f"{path}: data or labels are not arrays ({err})") from None
    if data.dtype != np.uint8 or data.size % 3072:
        raise ConfigError(FIELD, f"{path}: data is {data.dtype} {data.shape}, not uint8 rows of 3x32x32 pixels")
    return data.reshape(-1, 3, 32, 32), labels


def cifar_parts(source: str, root: Path) -> tuple[list[Part], int]:
    if source == "cifar10":
        folder, classes, label_key = root / "cifar-10-batches-py", 10, b"labels"
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    else:
        folder, names, classes, label_key = root / "cifar-100-python", ["train", "test"], 100, b"fine_labels"
    if not (folder / names[0]).exists():
        raise missing(source, root, folder)
    parts = []
    for name in names:
        if (folder / name).exists():
            data, labels = read_cifar_batch(folder / name, label_key)
            split = "test" if name.startswith("test") else "train"
            parts.append(Part(data.astype(np.float32) / 255.0, labels, str(folder / name), None, split))
    return parts, classes


# -- image folders (Tiny-ImageNet, GTSRB) -----------------------------------------------------------
def read_image(path: Path, size: int | None) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            if size is not None and img.size != (size, size):
                img = img.resize((size, size), Image.BILINEAR)
            return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)
    except Exception as err:  # PIL signals a damaged or foreign file with many exception types
        raise ConfigError(FIELD, f"{path} is not a readable image ({type(err).__name__}: {err})") from None


def _image_part(paths: list[Path], labels: list[int], size: int | None, file: str, split: str, bar: Any = None) -> Part:
    """Images stacked as float32 in [0, 1]; an image whose shape differs from the first is named.
    ``bar`` (a progress bar) advances by one per image read."""
    images = []
    for path in paths:
        images.append(read_image(path, size))
        if bar is not None:
            bar.update(1)
    for path, image in zip(paths, images, strict=True):
        if image.shape != images[0].shape:
            (h, w), (h0, w0) = image.shape[1:], images[0].shape[1:]
            raise ConfigError(
                FIELD,
                f"{path} is {w}x{h} pixels, but {paths[0]} is {w0}x{h0}",
                "set data.image_size to resize every image",
            )
    return Part(np.stack(images).astype(np.float32) / 255.0, np.asarray(labels, dtype=np.int64), file, None, split)


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def tiny_imagenet_parts(root: Path, size: int | None) -> tuple[list[Part], int]:
    base = root / "tiny-imagenet-200" if (root / "tiny-imagenet-200").is_dir() else root
    if not (base / "wnids.txt").exists():
        raise missing("tiny_imagenet", root, base / "wnids.txt")
    wnids = (base / "wnids.txt").read_text().split()
    index = {w: i for i, w in enumerate(wnids)}
    train = {w: _images_in(base / "train" / w / "images") for w in wnids}
    annotations = base / "val" / "val_annotations.txt"
    val_paths, val_labels = [], []
    if annotations.exists():
        for line in annotations.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 2 and fields[1] in index:
                val_paths.append(base / "val" / "images" / fields[0])
                val_labels.append(index[fields[1]])
    parts = []
    with progress(sum(map(len, train.values())) + len(val_paths), "reading tiny_imagenet") as bar:
        for w, paths in train.items():
            if paths:
                parts.append(_image_part(paths, [index[w]] * len(paths), size, str(base / "train" / w), "train", bar))
        if val_paths:
            parts.append(_image_part(val_paths, val_labels, size, str(annotations), "test", bar))
    if not parts:
        raise missing("tiny_imagenet", root, base / "train")
    return parts, len(wnids)


def gtsrb_parts(root: Path, size: int) -> tuple[list[Part], int]:
    base = root / "gtsrb"
    train = next((d for d in (base / "GTSRB" / "Training", root) if d.is_dir() and _class_dirs(d)), None)
    if train is None:
        raise missing("gtsrb", root, base / "GTSRB" / "Training")
    parts = []
    listed = {d: _images_in(d) for d in _class_dirs(train)}
    with progress(sum(map(len, listed.values())), "reading gtsrb") as bar:
        for d, paths in listed.items():
            if paths:
                parts.append(_image_part(paths, [int(d.name)] * len(paths), size, str(d), "train", bar))
    test_csv = base / "GT-final_test.csv"
    if test_csv.exists():
        import csv

        try:
            with open(test_csv) as f:
                rows = [
                    (r["Filename"], int(r["ClassId"])) for r in csv.DictReader(f, delimiter=";", skipinitialspace=True)
                ]
        except (KeyError, ValueError, TypeError, csv.Error, UnicodeDecodeError) as err:
            raise ConfigError(FIELD, f"{test_csv} is not GTSRB's test annotation file ({err})") from None
        if rows:
            images = base / "GTSRB" / "Final_Test" / "Images"
            paths, labels = [images / r[0] for r in rows], [r[1] for r in rows]
            with progress(len(rows), "reading gtsrb (test)") as bar:
                parts.append(_image_part(paths, labels, size, str(test_csv), "test", bar))
    if not parts:
        raise missing("gtsrb", root, train)
    classes = max(43, 1 + max(int(p.y.max()) for p in parts if len(p.y)))
    return parts, classes


def _class_dirs(folder: Path) -> list[Path]:
    return sorted(d for d in folder.iterdir() if d.is_dir() and d.name.isdigit())


def standard_parts(source: str, root: Path, download_ok: bool, image_size: int | None) -> tuple[list[Part], int]:
    """Dispatch ``source`` to its loader, downloading first when asked and the files are absent.
    Returns its parts (official train first, then the official test split) and num_classes."""
    loaders = {
        "mnist": lambda: idx_parts("mnist", root),
        "fmnist": lambda: idx_parts("fmnist", root),
        "cifar10": lambda: cifar_parts("cifar10", root),
        "cifar100": lambda: cifar_parts("cifar100", root),
        "tiny_imagenet": lambda: tiny_imagenet_parts(root, image_size),
        "gtsrb": lambda: gtsrb_parts(root, image_size or 32),  # GTSRB images vary in size
    }
    try:
        return loaders[source]()
    except DatasetMissing:
        if not download_ok:
            raise
    download(source, root)
    return loaders[source]()


def load_standard(source: str, root: Path, download_ok: bool, image_size: int | None) -> Loaded:
    """``source`` validated and pooled: x, y, num_classes and the number of official training samples."""
    parts, classes = standard_parts(source, root, download_ok, image_size)
    validate_source(parts, classes)
    x, y, _ = pool_parts(parts)
    return x, y, classes, sum(len(p.y) for p in parts if p.split == "train")
