"""Loaders for standard on-disk formats under ``data.root``. Each returns the samples of all official
splits merged into one pool (PGFed's protocol: partition the union, then split per client), as
float32 images (N, C, H, W) in [0, 1] and int64 labels, plus the number of official training samples
(they come first; the rest is the official test/validation split, PAGE's server test set).

A missing dataset raises ConfigError with the path looked at and the layout expected; with
``data.download: true`` the torchvision datasets that can fetch themselves are downloaded first.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

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


def missing(source: str, root: Path, looked_at: Path) -> ConfigError:
    fix = f"expected layout: {LAYOUTS[source]}"
    if source in TORCHVISION or source == "gtsrb":
        fix += "; or set data.download: true to fetch it with torchvision"
    return ConfigError("data.root", f"{source} not found at {looked_at} (data.root = {root})", fix)


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
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    code, ndim = raw[2], raw[3]
    if raw[:2] != b"\0\0" or code not in dtypes:
        raise ConfigError("data.root", f"{path} is not an IDX file", "use the original MNIST-format files")
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(int)
    return np.frombuffer(raw, dtype=dtypes[code], offset=4 + 4 * ndim).reshape(dims)


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    return None


def load_idx(source: str, root: Path) -> Loaded:
    sub = root / TORCHVISION[source] / "raw"
    folder = sub if _find_idx(sub, "train-images-idx3-ubyte") else root
    xs, ys = [], []
    for split in ("train", "t10k"):
        images = _find_idx(folder, f"{split}-images-idx3-ubyte")
        labels = _find_idx(folder, f"{split}-labels-idx1-ubyte")
        if images is None or labels is None:
            if split == "t10k" and xs:
                break  # the test files are optional
            raise missing(source, root, sub)
        xs.append(read_idx(images))
        ys.append(read_idx(labels))
    x = np.concatenate(xs)[:, None].astype(np.float32) / 255.0
    return x, np.concatenate(ys).astype(np.int64), 10, len(ys[0])


# -- CIFAR python batches ---------------------------------------------------------------------------
def load_cifar(source: str, root: Path) -> Loaded:
    if source == "cifar10":
        folder, classes, label_key = root / "cifar-10-batches-py", 10, b"labels"
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    else:
        folder, names, classes, label_key = root / "cifar-100-python", ["train", "test"], 100, b"fine_labels"
    if not (folder / names[0]).exists():
        raise missing(source, root, folder)
    xs, ys, read = [], [], []
    for name in names:
        if not (folder / name).exists():
            continue
        read.append(name)
        with open(folder / name, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch[label_key], dtype=np.int64))
    num_train = sum(len(v) for name, v in zip(read, ys, strict=True) if not name.startswith("test"))
    return np.concatenate(xs).astype(np.float32) / 255.0, np.concatenate(ys), classes, num_train


# -- image folders (Tiny-ImageNet, GTSRB) -----------------------------------------------------------
def read_image(path: Path, size: int | None) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        if size is not None and img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def _stack(images: list[np.ndarray], labels: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.stack(images).astype(np.float32) / 255.0, np.asarray(labels, dtype=np.int64)


def load_tiny_imagenet(root: Path, size: int | None) -> Loaded:
    base = root / "tiny-imagenet-200" if (root / "tiny-imagenet-200").is_dir() else root
    if not (base / "wnids.txt").exists():
        raise missing("tiny_imagenet", root, base / "wnids.txt")
    wnids = (base / "wnids.txt").read_text().split()
    index = {w: i for i, w in enumerate(wnids)}
    images, labels = [], []
    for w in wnids:
        for path in sorted((base / "train" / w / "images").glob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                images.append(read_image(path, size))
                labels.append(index[w])
    num_train = len(labels)
    annotations = base / "val" / "val_annotations.txt"
    if annotations.exists():
        for line in annotations.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 2 and fields[1] in index:
                images.append(read_image(base / "val" / "images" / fields[0], size))
                labels.append(index[fields[1]])
    if not images:
        raise missing("tiny_imagenet", root, base / "train")
    x, y = _stack(images, labels)
    return x, y, len(wnids), num_train


def load_gtsrb(root: Path, size: int) -> Loaded:
    base = root / "gtsrb"
    train = next((d for d in (base / "GTSRB" / "Training", root) if d.is_dir() and _class_dirs(d)), None)
    if train is None:
        raise missing("gtsrb", root, base / "GTSRB" / "Training")
    images, labels = [], []
    for d in _class_dirs(train):
        for path in sorted(d.iterdir()):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                images.append(read_image(path, size))
                labels.append(int(d.name))
    num_train = len(labels)
    test_csv = base / "GT-final_test.csv"
    if test_csv.exists():
        import csv

        with open(test_csv) as f:
            for row in csv.DictReader(f, delimiter=";", skipinitialspace=True):
                images.append(read_image(base / "GTSRB" / "Final_Test" / "Images" / row["Filename"], size))
                labels.append(int(row["ClassId"]))
    x, y = _stack(images, labels)
    return x, y, max(43, int(y.max()) + 1), num_train


def _class_dirs(folder: Path) -> list[Path]:
    return sorted(d for d in folder.iterdir() if d.is_dir() and d.name.isdigit())


def load_standard(source: str, root: Path, download_ok: bool, image_size: int | None) -> Loaded:
    """Dispatch ``source`` to its loader, downloading first when asked and the files are absent."""
    loaders = {
        "mnist": lambda: load_idx("mnist", root),
        "fmnist": lambda: load_idx("fmnist", root),
        "cifar10": lambda: load_cifar("cifar10", root),
        "cifar100": lambda: load_cifar("cifar100", root),
        "tiny_imagenet": lambda: load_tiny_imagenet(root, image_size),
        "gtsrb": lambda: load_gtsrb(root, image_size or 32),  # GTSRB images vary in size
    }
    try:
        return loaders[source]()
    except ConfigError as err:
        if not download_ok or err.field != "data.root":
            raise
    download(source, root)
    return loaders[source]()
