"""Every on-disk loader reads a tiny fixture written in its exact format."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pfl.data import DataConfig, build_data
from pfl.data.disk import load_standard
from pfl.data.leaf import load_leaf
from pfl.errors import ConfigError

RNG = np.random.default_rng(0)


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)


@pytest.mark.parametrize(("source", "folder"), [("mnist", "MNIST"), ("fmnist", "FashionMNIST")])
def test_idx_loader_reads_gz_and_raw(tmp_path, source, folder):
    raw = tmp_path / folder / "raw"
    train_x, test_x = RNG.integers(0, 256, (12, 28, 28)), RNG.integers(0, 256, (5, 28, 28))
    train_y, test_y = np.arange(12) % 10, np.arange(5)
    write_idx(raw / "train-images-idx3-ubyte", train_x, gz=True)
    write_idx(raw / "train-labels-idx1-ubyte", train_y, gz=True)
    write_idx(raw / "t10k-images-idx3-ubyte", test_x, gz=False)
    write_idx(raw / "t10k-labels-idx1-ubyte", test_y, gz=False)
    x, y, classes, num_train = load_standard(source, tmp_path, False, None)
    assert x.shape == (17, 1, 28, 28) and classes == 10 and num_train == 12
    assert np.allclose(x[:12, 0] * 255, train_x) and np.allclose(x[12:, 0] * 255, test_x)
    assert y.tolist() == [*train_y.tolist(), *test_y.tolist()]


def write_cifar_batch(path: Path, n: int, label_key: bytes, classes: int) -> tuple[np.ndarray, list[int]]:
    data = RNG.integers(0, 256, (n, 3072)).astype(np.uint8)
    labels = RNG.integers(0, classes, n).tolist()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump({b"data": data, label_key: labels, b"coarse_labels": [0] * n}, f)
    return data, labels


def test_cifar10_and_cifar100_batches(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    written = [write_cifar_batch(base / f"data_batch_{i}", 3, b"labels", 10) for i in range(1, 6)]
    written.append(write_cifar_batch(base / "test_batch", 4, b"labels", 10))
    x, y, classes, num_train = load_standard("cifar10", tmp_path, False, None)
    assert x.shape == (19, 3, 32, 32) and classes == 10 and num_train == 15
    assert np.allclose(x[0] * 255, written[0][0][0].reshape(3, 32, 32))  # channel-first planes
    assert y.tolist() == sum((w[1] for w in written), [])
    base = tmp_path / "cifar-100-python"
    train = write_cifar_batch(base / "train", 6, b"fine_labels", 100)
    test = write_cifar_batch(base / "test", 2, b"fine_labels", 100)
    x, y, classes, num_train = load_standard("cifar100", tmp_path, False, None)
    assert x.shape == (8, 3, 32, 32) and classes == 100 and y.tolist() == train[1] + test[1] and num_train == 6


def write_image(path: Path, value: int, size: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size, 3), value, dtype=np.uint8)).save(path)


def test_tiny_imagenet_folder_layout(tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    wnids = ["n01443537", "n01629819", "n01641577"]
    (base).mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for c, w in enumerate(wnids):
        for i in range(2):
            write_image(base / "train" / w / "images" / f"{w}_{i}.JPEG", 40 * c + 10)
    write_image(base / "val" / "images" / "val_0.JPEG", 200)
    (base / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn01641577\t0\t0\t8\t8\n")
    x, y, classes, num_train = load_standard("tiny_imagenet", tmp_path, False, None)
    assert classes == 3 and x.shape == (7, 3, 8, 8) and num_train == 6
    assert y.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert abs(x[2].mean() * 255 - 50) < 2 and abs(x[-1].mean() * 255 - 200) < 2  # JPEG is lossy


def test_gtsrb_folder_layout_train_and_test(tmp_path):
    base = tmp_path / "gtsrb"
    for c in (0, 1, 42):
        write_image(base / "GTSRB" / "Training" / f"{c:05d}" / f"{c:05d}_00000.ppm", 5 * c, size=11)
    write_image(base / "GTSRB" / "Final_Test" / "Images" / "00000.ppm", 77, size=13)
    header = "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId"
    (base / "GT-final_test.csv").write_text(f"{header}\n00000.ppm;13;13;0;0;13;13;7\n")
    x, y, classes, num_train = load_standard("gtsrb", tmp_path, False, 16)
    assert x.shape == (4, 3, 16, 16) and classes == 43 and num_train == 3  # resized to data.image_size
    assert y.tolist() == [0, 1, 42, 7] and np.allclose(x[3] * 255, 77)


def write_leaf(root: Path, users: dict[str, tuple[list, list]], split: str) -> None:
    blob = {
        "users": list(users),
        "num_samples": [len(v[1]) for v in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / split / "all_data_niid_0_keep_0_train_9.json").write_text(json.dumps(blob))


def test_leaf_shakespeare_and_femnist_json(tmp_path):
    line = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to s"
    assert len(line) == 79
    train = {"HAMLET": ([line + "u", "x" * 80], ["f", "y"]), "OPHELIA": (["o" * 80], ["!"])}
    write_leaf(tmp_path / "sh", train, "train")
    write_leaf(tmp_path / "sh", {"HAMLET": (["z" * 80], ["a"]), "OPHELIA": (["q" * 80], ["b"])}, "test")
    x, y, classes, names, splits = load_leaf("leaf_shakespeare", tmp_path / "sh")
    assert names == ["HAMLET", "OPHELIA"] and classes == 80 and x.shape == (5, 80)
    assert [len(s[0]) for s in splits] == [2, 1] and [len(s[1]) for s in splits] == [1, 1]
    from pfl.data.bundled import LEAF_LETTERS

    assert "".join(LEAF_LETTERS[i] for i in x[splits[0][0][0]]) == line + "u"
    assert LEAF_LETTERS[y[splits[0][0][0]]] == "f"
    pixels = RNG.random((3, 784)).round(3).tolist()
    write_leaf(tmp_path / "fe", {"f0001_14": (pixels[:2], [3, 61])}, "train")
    write_leaf(tmp_path / "fe", {"f0001_14": (pixels[2:], [5])}, "test")
    cfg = DataConfig(source="femnist", root=str(tmp_path / "fe"), num_clients=1)
    data = build_data(cfg, seed=0)
    assert data.num_classes == 62 and data.input_shape == (1, 28, 28)
    assert data.y[data.clients[0].train].tolist() == [3, 61] and data.y[data.clients[0].test].tolist() == [5]
    assert np.allclose(data.x[data.clients[0].test].numpy().reshape(-1), pixels[2], atol=1e-6)


@pytest.mark.parametrize("source", ["mnist", "cifar10", "cifar100", "tiny_imagenet", "gtsrb", "femnist", "npz_dir"])
def test_missing_dataset_names_path_and_layout(tmp_path, source):
    with pytest.raises(ConfigError) as err:
        build_data(DataConfig(source=source, root=str(tmp_path / "nowhere")), seed=0)
    assert err.value.field == "data.root"
    assert "nowhere" in str(err.value) and "layout" in str(err.value)


def test_download_of_a_dataset_torchvision_cannot_fetch_explains(tmp_path):
    with pytest.raises(ConfigError) as err:
        build_data(DataConfig(source="tiny_imagenet", root=str(tmp_path), download=True), seed=0)
    assert err.value.field == "data.download" and "tiny-imagenet-200" in str(err.value)


def test_on_disk_source_goes_through_the_partition_pipeline(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    labels = np.arange(400) % 10
    write_idx(raw / "train-images-idx3-ubyte", RNG.integers(0, 256, (400, 28, 28)), gz=False)
    write_idx(raw / "train-labels-idx1-ubyte", labels, gz=False)
    cfg = DataConfig(source="mnist", root=str(tmp_path), num_clients=5, partition="pathological", rotation_groups=5)
    data = build_data(cfg, seed=0)
    assert data.num_clients == 5 and len(data.y) == 400
    for c in data.clients:
        assert len(np.unique(data.y[np.concatenate([c.train, c.test])].numpy())) == 2
    write_idx(raw / "t10k-images-idx3-ubyte", RNG.integers(0, 256, (30, 28, 28)), gz=False)
    write_idx(raw / "t10k-labels-idx1-ubyte", np.arange(30) % 10, gz=False)
    official = build_data(replace(cfg, official_test=True, rotation_groups=0), seed=0)
    assert official.global_test.tolist() == list(range(400, 430))  # PAGE: the official test set is the server's
    assert max(c.train.max() for c in official.clients) < 400
    with pytest.raises(ConfigError, match="data.official_test"):
        build_data(DataConfig(official_test=True), seed=0)
