"""Every data source is checked once at load: a bad file is refused before training with a
ConfigError that names the file and the client, and no run folder is created."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pfl.cli import main
from pfl.data import DataConfig, build_data
from pfl.errors import ConfigError

CLASSES = 10
QUIET = ["--tracking.wandb", "false", "--trainer.progress", "false", "--trainer.rounds", "1", "--model.hidden", "[8]"]


def samples(n: int, seed: int = 0, shape: tuple[int, ...] = (1, 8, 8)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.random((n, *shape)).astype(np.float32), "y": rng.integers(0, CLASSES, n)}


def write(path: Path, data: dict) -> None:
    """PFLlib's writer: one pickled dict under ``data``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, data=data)


def npz_dir(root: Path, clients: int = 4) -> Path:
    for cid in range(clients):
        write(root / "train" / f"{cid}.npz", samples(6, cid))
        write(root / "test" / f"{cid}.npz", samples(3, 100 + cid))
    write(root / "global_test.npz", samples(5, 999))
    (root / "config.json").write_text(json.dumps({"num_clients": clients, "num_classes": CLASSES}))
    return root


def refused_by_fit(tmp_path: Path, capsys, source: str, root: Path, expected: list[str], *extra: str) -> None:
    """``fit`` exits with 2 before training, names everything in ``expected``, writes no run folder."""
    runs = tmp_path / "runs"
    args = ["fit", "--data.source", source, "--data.root", str(root), *extra, *QUIET, "--tracking.root", str(runs)]
    capsys.readouterr()
    assert main(args) == 2
    message = capsys.readouterr().err
    assert message.startswith("error: data.root: ") and len(message.strip().splitlines()) == 1, message
    for text in expected:
        assert text in message, (text, message)
    assert not runs.exists()


def _shorter_y(root: Path) -> None:
    d = samples(6, 1)
    write(root / "train" / "1.npz", {"x": d["x"], "y": d["y"][:5]})


def _label(path: str, value: int) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        d = samples(3, 7)
        d["y"][1] = value
        write(root / path, d)

    return mutate


def _feature(path: str, value: float) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        d = samples(6, 7)
        d["x"][2, 0, 3, 4] = value
        write(root / path, d)

    return mutate


def _empty(path: str) -> Callable[[Path], None]:
    return lambda root: write(root / path, samples(0))


def _truncate(root: Path) -> None:
    path = root / "test" / "0.npz"
    path.write_bytes(path.read_bytes()[:200])


def _config(text: str) -> Callable[[Path], None]:
    return lambda root: (root / "config.json").write_text(text)


NPZ_CASES = {
    "x_and_y_lengths_differ": (_shorter_y, ["train/1.npz (client 1, train)", "x holds 6 samples but y holds 5"]),
    "test_label_too_large": (
        _label("test/2.npz", 10),
        ["test/2.npz (client 2, test)", "label 10 of sample 1", "[0, 10)"],
    ),
    "negative_train_label": (_label("train/0.npz", -1), ["train/0.npz (client 0, train)", "label -1"]),
    "global_test_label": (_label("global_test.npz", 12), ["global_test.npz (global_test)", "label 12"]),
    "nan_feature": (_feature("train/3.npz", np.nan), ["train/3.npz (client 3, train)", "sample 2 has a NaN or inf"]),
    "inf_feature": (_feature("train/0.npz", -np.inf), ["train/0.npz (client 0, train)", "sample 2 has a NaN or inf"]),
    "mixed_shapes": (
        lambda root: write(root / "train" / "2.npz", samples(6, 2, (1, 8, 9))),
        ["train/2.npz (client 2, train)", "shape (1, 8, 9)", "train/0.npz (client 0, train) have (1, 8, 8)"],
    ),
    "empty_train": (_empty("train/3.npz"), ["client 3 has an empty train split", "train/3.npz"]),
    "empty_test": (_empty("test/1.npz"), ["client 1 has an empty test split", "test/1.npz"]),
    "empty_global_test": (_empty("global_test.npz"), ["global_test.npz", "holds no samples"]),
    "not_a_zip": (lambda root: (root / "train" / "2.npz").write_bytes(b"garbage"), ["train/2.npz", "not a readable"]),
    "truncated": (_truncate, ["test/0.npz", "not a readable .npz archive"]),
    "dict_without_y": (lambda root: write(root / "train" / "1.npz", {"x": samples(6)["x"]}), ["train/1.npz", "'y'"]),
    "fractional_labels": (
        lambda root: write(root / "train" / "1.npz", {"x": samples(2)["x"], "y": np.array([0.0, 2.5])}),
        ["train/1.npz (client 1, train)", "label 2.5 of sample 1 is not an integer"],
    ),
    "text_features": (
        lambda root: write(root / "train" / "1.npz", {"x": np.array(["a", "b"]), "y": np.zeros(2, dtype=int)}),
        ["train/1.npz", "not numeric"],
    ),
    "ragged_samples": (
        lambda root: write(root / "train" / "1.npz", {"x": [np.zeros(3), np.zeros(4)], "y": np.zeros(2, dtype=int)}),
        ["train/1.npz", "x is not an array of equally shaped samples"],
    ),
    "config_not_json": (_config("{num_classes: 10"), ["config.json is not readable JSON"]),
    "config_new_client_out_of_range": (_config('{"new_clients": [7]}'), ["config.json", "new_clients = [7]"]),
    "config_bad_num_classes": (_config('{"num_classes": "ten"}'), ["config.json", "num_classes = 'ten'"]),
    "config_num_classes_past_int32": (
        _config('{"num_classes": 9223372036854775814}'),  # used to end in a TypeError in the model's head
        ["config.json", "num_classes = 9223372036854775814 is more than 2147483647"],
    ),
}


def test_a_valid_npz_dir_loads_with_labels_aligned(tmp_path):
    root = npz_dir(tmp_path / "fed")
    data = build_data(DataConfig(source="npz_dir", root=str(root), num_clients=4), seed=0)
    for cid, client in enumerate(data.clients):
        assert np.array_equal(data.y[client.test].numpy(), samples(3, 100 + cid)["y"])
        assert np.array_equal(data.x[client.train].numpy(), samples(6, cid)["x"])


@pytest.mark.parametrize("case", sorted(NPZ_CASES))
def test_bad_npz_dir_is_refused_before_training(tmp_path, capsys, case):
    mutate, expected = NPZ_CASES[case]
    root = npz_dir(tmp_path / "fed")
    mutate(root)
    with pytest.raises(ConfigError) as err:
        build_data(DataConfig(source="npz_dir", root=str(root), num_clients=4), seed=0)
    assert err.value.field == "data.root"
    refused_by_fit(tmp_path, capsys, "npz_dir", root, expected, "--data.num_clients", "4")


# -- MNIST IDX ---------------------------------------------------------------------------------------
def write_idx(path: Path, array: np.ndarray, cut: int = 0) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw[: len(raw) - cut]))


def mnist(root: Path, n_images: int = 40, n_labels: int = 40, label: int = 3, cut: int = 0) -> Path:
    raw = root / "MNIST" / "raw"
    write_idx(raw / "train-images-idx3-ubyte.gz", np.zeros((n_images, 28, 28)), cut)
    labels = np.arange(n_labels) % 10
    labels[-1] = label
    write_idx(raw / "train-labels-idx1-ubyte.gz", labels)
    return raw


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"n_labels": 39}, ["train-images-idx3-ubyte.gz + ", "x holds 40 samples but y holds 39"]),
        ({"label": 11}, ["train-labels-idx1-ubyte.gz (train)", "label 11 of sample 39"]),
        ({"cut": 5}, ["train-images-idx3-ubyte.gz holds 31355 data bytes", "says 31360"]),
    ],
    ids=["counts_differ", "label_out_of_range", "truncated"],
)
def test_bad_mnist_files_are_refused(tmp_path, capsys, kwargs, expected):
    mnist(tmp_path / "m", **kwargs)
    refused_by_fit(tmp_path, capsys, "mnist", tmp_path / "m", expected, "--data.num_clients", "2")


# -- CIFAR python batches ----------------------------------------------------------------------------
def cifar(root: Path, test_batch: object) -> Path:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    for i in range(1, 6):
        with open(base / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"data": np.zeros((4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 3]}, f)
    with open(base / "test_batch", "wb") as f:
        pickle.dump(test_batch, f)
    return base / "test_batch"


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (
            {b"data": np.zeros((4, 3072), dtype=np.uint8), b"labels": [0, 1]},
            ["(test): x holds 4 samples but y holds 2"],
        ),
        ({b"data": np.zeros((4, 3000), dtype=np.uint8), b"labels": [0] * 4}, ["not uint8 rows of 3x32x32"]),
        ({b"data": np.zeros((1, 3072), dtype=np.uint8), b"labels": [10]}, ["(test): label 10 of sample 0"]),
        ([1, 2, 3], ["is not a CIFAR python batch"]),
    ],
    ids=["counts_differ", "wrong_row_size", "label_out_of_range", "not_a_dict"],
)
def test_bad_cifar_batches_are_refused(tmp_path, capsys, batch, expected):
    path = cifar(tmp_path / "c", batch)
    refused_by_fit(tmp_path, capsys, "cifar10", tmp_path / "c", [str(path), *expected], "--data.num_clients", "2")


# -- LEAF json ---------------------------------------------------------------------------------------
def leaf(root: Path, train: dict, test: dict) -> Path:
    for split, users in (("train", train), ("test", test)):
        blob = {"users": list(users), "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / f"{split}_0.json").write_text(json.dumps(blob))
    return root


PIXELS = [0.5] * 784
ONE = {"u1": ([PIXELS], [1])}
LEAF_CASES = {
    "user_counts_differ": (
        {"u1": ([PIXELS, PIXELS], [3])},
        ONE,
        ["train/train_0.json (client u1, train)", "x holds 2 samples but y holds 1"],
    ),
    "user_without_test": ({"u1": ([PIXELS], [3]), "u2": ([PIXELS], [4])}, ONE, ["client u2 has an empty test split"]),
    "wrong_pixel_count": ({"u1": ([[0.5] * 783], [3])}, ONE, ["(client u1, train): samples are malformed", "784"]),
    "label_out_of_range": (ONE, {"u1": ([PIXELS], [62])}, ["test/test_0.json (client u1, test)", "label 62"]),
}


@pytest.mark.parametrize("case", sorted(LEAF_CASES))
def test_bad_leaf_files_are_refused(tmp_path, capsys, case):
    train, test, expected = LEAF_CASES[case]
    root = leaf(tmp_path / "fe", train, test)
    refused_by_fit(tmp_path, capsys, "femnist", root, expected, "--data.num_clients", "1")


def test_unreadable_leaf_json_is_refused(tmp_path, capsys):
    root = leaf(tmp_path / "fe", ONE, ONE)
    (root / "test" / "test_0.json").write_text('{"users": ["u1"], ')
    refused_by_fit(tmp_path, capsys, "femnist", root, ["test_0.json is not readable JSON"], "--data.num_clients", "1")


# -- image folders -----------------------------------------------------------------------------------
def test_damaged_or_mixed_size_images_are_refused(tmp_path, capsys):
    base = tmp_path / "g" / "gtsrb" / "GTSRB" / "Training"
    for c in (0, 1):
        (base / f"{c:05d}").mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(base / f"{c:05d}" / "a.ppm")
    (base / "00001" / "b.ppm").write_bytes(b"P6 damaged")
    expected = [str(base / "00001" / "b.ppm"), "is not a readable image"]
    refused_by_fit(tmp_path, capsys, "gtsrb", tmp_path / "g", expected, "--data.num_clients", "2")
    tiny = tmp_path / "t" / "tiny-imagenet-200"
    (tiny / "train" / "n1" / "images").mkdir(parents=True)
    (tiny / "wnids.txt").write_text("n1\n")
    for name, size in (("a.JPEG", 8), ("b.JPEG", 9)):
        Image.fromarray(np.zeros((size, size, 3), dtype=np.uint8)).save(tiny / "train" / "n1" / "images" / name)
    expected = [str(tiny / "train" / "n1" / "images" / "b.JPEG"), "is 9x9 pixels", "a.JPEG is 8x8"]
    refused_by_fit(tmp_path, capsys, "tiny_imagenet", tmp_path / "t", expected, "--data.num_clients", "1")
