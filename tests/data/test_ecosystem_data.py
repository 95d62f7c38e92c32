"""torchvision and HuggingFace ``datasets`` sources: tiny datasets written on the fly in those
libraries' own formats, read through them, validated like every other source, trained end to end."""

from __future__ import annotations

import bz2
import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from pfl.cli import main
from pfl.data import DataConfig, build_data
from pfl.data.config import validate_data_config
from pfl.data.ecosystem import dataset_label
from pfl.errors import ConfigError
from tests.data.test_data_loaders import write_idx

RNG = np.random.default_rng(0)
QUIET = ["--tracking.wandb", "false", "--trainer.progress", "false", "--model.hidden", "[8]"]
SMALL = DataConfig(num_clients=3, min_samples=5, partition="iid", global_test_frac=0.2)


def write_mnist(root: Path, folder: str, n_train: int = 60, n_test: int = 20) -> dict[str, np.ndarray]:
    """torchvision's raw layout: ROOT/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte."""
    raw = root / folder / "raw"
    arrays = {
        "train-images-idx3-ubyte": RNG.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": RNG.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": np.arange(n_test) % 10,
    }
    for name, array in arrays.items():
        write_idx(raw / name, array, gz=False)
    return arrays


def same_federation(a, b) -> None:
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.global_test, b.global_test)
    for ca, cb in zip(a.clients, b.clients, strict=True):
        assert torch.equal(ca.train, cb.train) and torch.equal(ca.test, cb.test)


# -- torchvision ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "own"), [("MNIST", "mnist"), ("FashionMNIST", "fmnist")])
def test_torchvision_idx_reads_what_pfls_own_reader_reads(tmp_path, name, own):
    arrays = write_mnist(tmp_path, name)
    cfg = replace(SMALL, source=f"torchvision:{name}", root=str(tmp_path))
    via_torchvision = build_data(cfg, seed=3)
    same_federation(via_torchvision, build_data(replace(cfg, source=own), seed=3))
    assert via_torchvision.x.shape == (80, 1, 28, 28) and via_torchvision.num_classes == 10
    assert np.allclose(via_torchvision.x[:60, 0].numpy() * 255, arrays["train-images-idx3-ubyte"])
    # the official test split (it comes last) can be the server's test set
    official = build_data(replace(cfg, official_test=True), seed=3)
    assert official.global_test.tolist() == list(range(60, 80))
    assert via_torchvision.name == f"torchvision-{name}"


def test_torchvision_usps_a_set_pfl_has_no_reader_for(tmp_path):
    def write(path: Path, labels: list[int]) -> np.ndarray:
        pixels = RNG.integers(0, 256, (len(labels), 256))
        lines = [
            f"{lab + 1} " + " ".join(f"{j + 1}:{2 * p / 255 - 1:.6f}" for j, p in enumerate(row))
            for lab, row in zip(labels, pixels, strict=True)
        ]
        path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
        return pixels

    train = write(tmp_path / "usps.bz2", [i % 10 for i in range(30)])
    test = write(tmp_path / "usps.t.bz2", [i % 10 for i in range(10)])
    data = build_data(replace(SMALL, source="torchvision:USPS", root=str(tmp_path)), seed=0)
    assert data.x.shape == (40, 1, 16, 16) and sorted(data.y.tolist()) == sorted(
        [i % 10 for i in range(30)] + list(range(10))
    )
    expected = np.concatenate([train, test]).reshape(40, 16, 16) / 255.0
    assert np.abs(data.x[:, 0].numpy() - expected).max() <= 1.5 / 255  # the libsvm text rounds


def test_torchvision_cifar_goes_through_the_restricted_unpickler(tmp_path):
    from tests.test_security import Payload

    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    rows = RNG.integers(0, 256, (4, 3072)).astype(np.uint8)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(base / name, "wb") as f:
            pickle.dump({b"data": rows, b"labels": [0, 1, 2, 3]}, f)
    cfg = replace(SMALL, source="torchvision:CIFAR10", root=str(tmp_path))
    same_federation(build_data(cfg, seed=1), build_data(replace(cfg, source="cifar10"), seed=1))
    marker = tmp_path / "marker"
    with open(base / "test_batch", "wb") as f:
        pickle.dump({b"data": rows, b"labels": [0, 1, 2, 3], b"filenames": Payload(marker)}, f)
    with pytest.raises(ConfigError) as err:
        build_data(cfg, seed=1)
    assert str(base / "test_batch") in str(err.value) and "io.open" in str(err.value)
    assert not marker.exists()


def test_torchvision_errors_name_the_field_and_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.source.*'LSUN' is not one pfl reads"):
        validate_data_config(replace(SMALL, source="torchvision:LSUN", root=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"data\.root.*read from disk"):
        validate_data_config(replace(SMALL, source="torchvision:MNIST"))
    with pytest.raises(ConfigError, match=r"data\.root.*torchvision:MNIST not readable.*MNIST/raw"):
        build_data(replace(SMALL, source="torchvision:MNIST", root=str(tmp_path)), seed=0)
    write_mnist(tmp_path, "MNIST")
    write_idx(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte", np.array([3] * 19 + [12]), gz=False)
    with pytest.raises(ConfigError) as err:  # the same validation as every other source
        build_data(replace(SMALL, source="torchvision:MNIST", root=str(tmp_path)), seed=0)
    message = str(err.value)
    assert "torchvision:MNIST, test split" in message and "label 12 of sample 19 is outside [0, 10)" in message


def test_torchvision_mnist_trains_end_to_end(tmp_path, capsys):
    write_mnist(tmp_path / "data", "MNIST")
    args = [
        "fit",
        "--data.source",
        "torchvision:MNIST",
        "--data.root",
        str(tmp_path / "data"),
        "--data.num_clients",
        "3",
    ]
    args += ["--data.min_samples", "5", "--trainer.rounds", "2", "--tracking.root", str(tmp_path / "runs"), *QUIET]
    assert main(args) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("fedavg-torchvision-MNIST-s0-")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dataset"] == "torchvision-MNIST" and summary["rounds"] == 2


# -- HuggingFace datasets ---------------------------------------------------------------------------
@pytest.fixture
def hf():
    return pytest.importorskip("datasets")


def image_dataset(hf, n: int, classes: int, seed: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (n, 8, 8)).astype(np.uint8)
    labels = (np.arange(n) % 3).tolist()
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(num_classes=classes)})
    images = [Image.fromarray(p, mode="L") for p in pixels]
    return hf.Dataset.from_dict({"image": images, "label": labels}, features=features), pixels, labels


def test_hf_image_datasetdict_pools_train_then_test(tmp_path, hf):
    train, train_px, train_y = image_dataset(hf, 40, 4, 0)
    test, test_px, test_y = image_dataset(hf, 12, 4, 1)
    hf.DatasetDict({"test": test, "train": train}).save_to_disk(str(tmp_path / "digits8"))
    cfg = replace(SMALL, source=f"hf:{tmp_path / 'digits8'}", official_test=True)
    data = build_data(cfg, seed=0)
    assert data.num_classes == 4  # the ClassLabel's classes, not the labels seen
    assert data.x.shape == (52, 1, 8, 8) and data.x.dtype == torch.float32
    assert np.allclose(data.x.numpy()[:, 0] * 255, np.concatenate([train_px, test_px]))
    assert data.y.tolist() == train_y + test_y
    assert data.global_test.tolist() == list(range(40, 52))  # the test split, last
    assert data.name == "hf-digits8"


def test_hf_numeric_column_and_integer_labels(tmp_path, hf):
    x = RNG.normal(size=(30, 5)).astype(np.float32)
    y = np.arange(30) % 6
    hf.Dataset.from_dict({"x": x.tolist(), "y": y.tolist()}).save_to_disk(str(tmp_path / "tab"))
    cfg = replace(SMALL, source=f"hf:{tmp_path / 'tab'}", hf_input="x", hf_label="y")
    data = build_data(cfg, seed=0)
    assert data.num_classes == 6 and data.x.shape == (30, 5)
    assert np.allclose(data.x.numpy(), x) and data.y.tolist() == y.tolist()


def test_hf_errors_name_the_field_and_the_split(tmp_path, hf):
    x = RNG.normal(size=(10, 3)).astype(np.float32)
    hf.Dataset.from_dict({"x": x.tolist(), "label": list(range(10))}).save_to_disk(str(tmp_path / "ok"))
    with pytest.raises(ConfigError, match=r"data\.hf_input.*no column 'image'.*its columns: x, label"):
        build_data(replace(SMALL, source=f"hf:{tmp_path / 'ok'}"), seed=0)
    x[7, 1] = np.nan
    hf.Dataset.from_dict({"x": x.tolist(), "label": list(range(10))}).save_to_disk(str(tmp_path / "nan"))
    with pytest.raises(ConfigError, match=r"data\.source.*nan \[train\] \(train\): sample 7 has a NaN"):
        build_data(replace(SMALL, source=f"hf:{tmp_path / 'nan'}", hf_input="x"), seed=0)
    hf.Dataset.from_dict({"x": x.tolist(), "label": ["a"] * 10}).save_to_disk(str(tmp_path / "words"))
    with pytest.raises(ConfigError, match=r"data\.hf_label.*holds strings.*class_encode_column"):
        build_data(replace(SMALL, source=f"hf:{tmp_path / 'words'}", hf_input="x"), seed=0)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match=r"data\.source.*not a dataset folder written by save_to_disk"):
        build_data(replace(SMALL, source=f"hf:{tmp_path / 'plain'}"), seed=0)
    with pytest.raises(ConfigError, match=r"data\.source.*not-a-user/not-a-set.*offline"):
        build_data(replace(SMALL, source="hf:not-a-user/not-a-set", root=str(tmp_path / "cache")), seed=0)


def test_hf_dataset_trains_end_to_end(tmp_path, hf):
    train, _, _ = image_dataset(hf, 45, 3, 0)
    train.save_to_disk(str(tmp_path / "shapes"))
    args = ["fit", "--data.source", f"hf:{tmp_path / 'shapes'}", "--data.num_clients", "3", "--data.min_samples", "5"]
    args += ["--trainer.rounds", "2", "--tracking.root", str(tmp_path / "runs"), *QUIET]
    assert main(args) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()  # one folder: the path's slashes are not in the name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dataset"] == "hf-shapes" and summary["rounds"] == 2


def test_dataset_labels_are_folder_names():
    assert dataset_label("torchvision:CIFAR10") == "torchvision-CIFAR10"
    assert dataset_label("hf:/data/sets/my_set/") == "hf-my_set"
    assert dataset_label("hf:ylecun/mnist") == "hf-mnist"
    assert dataset_label("cifar10") == "cifar10"


# -- the progress display while a large source is read ----------------------------------------------
class Terminal:
    """A stderr that says it is a terminal and keeps what was written."""

    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("tty", [True, False])
def test_image_folders_show_a_bar_on_a_terminal_only(tmp_path, monkeypatch, tty):
    from PIL import Image

    from pfl.data import progress
    from pfl.data.disk import load_standard

    for cls in (0, 1):
        folder = tmp_path / "gtsrb" / "GTSRB" / "Training" / f"{cls:05d}"
        folder.mkdir(parents=True)
        for i in range(3):
            Image.fromarray(RNG.integers(0, 256, (5, 5, 3)).astype(np.uint8)).save(folder / f"{i}.ppm")
    monkeypatch.setattr(progress, "MIN_ITEMS", 5)  # the real threshold is 2000 images
    terminal = Terminal(tty)
    monkeypatch.setattr("sys.stderr", terminal)
    x, _, _, _ = load_standard("gtsrb", tmp_path, False, 8)
    assert x.shape == (6, 3, 8, 8)
    if tty:
        assert "reading gtsrb: 100%" in terminal.text and "6/6" in terminal.text
    else:
        assert terminal.text == ""
