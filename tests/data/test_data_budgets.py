"""Small files that would exhaust memory are refused with one line before the allocation: labels far
beyond the inferred class count, archive members that inflate past the memory pfl may take or past
their declared size, and models too large to train."""

from __future__ import annotations

import json
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pfl.cli import main
from pfl.data import DataConfig, build_data
from pfl.data import npz as npz_module
from pfl.data.npz import MAX_INFERRED_CLASSES, ReadBudget
from pfl.errors import ConfigError
from pfl.models import ModelConfig, build_model
from pfl.models import size as size_module
from tests.data.test_data_validation import QUIET, npz_dir, refused_by_fit, samples

MB = 1 << 20


def _without_num_classes(root: Path) -> None:
    (root / "config.json").write_text(json.dumps({"num_clients": 4}))


def _plain(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.savez(f, x=x, y=y)


@pytest.mark.parametrize(
    "label, dtype",
    [(10**7, np.int64), (10**9, np.int64), (2**40, np.int64), (2**63 + 5, np.uint64), (MAX_INFERRED_CLASSES, np.int64)],
)
def test_a_huge_label_without_num_classes_is_refused_in_one_line(tmp_path, capsys, label, dtype):
    root = npz_dir(tmp_path / "fed")
    _without_num_classes(root)
    d = samples(6, 1)
    y = d["y"].astype(dtype)
    y[4] = label
    _plain(root / "train" / "1.npz", d["x"], y)
    message = _refused_with_little_memory(root, 8 * MB)  # nothing sized by the label was allocated
    assert f"num_classes {label + 1}" in message
    expected = ["train/1.npz (client 1, train)", f"label {label} of sample 4", "set num_classes in", "config.json"]
    refused_by_fit(tmp_path, capsys, "npz_dir", root, expected, "--data.num_clients", "4")


def test_labels_below_the_cap_infer_num_classes(tmp_path):
    root = npz_dir(tmp_path / "fed")
    _without_num_classes(root)
    d = samples(6, 1)
    d["y"][0] = MAX_INFERRED_CLASSES - 1
    _plain(root / "train" / "1.npz", d["x"], d["y"])
    assert build_data(DataConfig(source="npz_dir", root=str(root), num_clients=4), seed=0).num_classes == (
        MAX_INFERRED_CLASSES
    )


def test_a_declared_num_classes_admits_large_labels(tmp_path):
    root = npz_dir(tmp_path / "fed")
    (root / "config.json").write_text(json.dumps({"num_clients": 4, "num_classes": 10**7}))
    d = samples(6, 1)
    d["y"][0] = 10**7 - 1
    _plain(root / "train" / "1.npz", d["x"], d["y"])
    assert build_data(DataConfig(source="npz_dir", root=str(root), num_clients=4), seed=0).num_classes == 10**7


def _npy_header(rows: int) -> bytes:
    header = {"descr": "<f4", "fortran_order": False, "shape": (rows, 1, 8, 8)}
    out = zipfile.io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()


def _bomb(path: Path, rows: int, data_bytes: int) -> None:
    """An npz whose ``x`` member is ``rows`` float32 8x8 images by its header, followed by ``data_bytes``
    zero bytes, deflated (1 000 times smaller); then a small ``y``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as f:
            f.write(_npy_header(rows))
            chunk = bytes(MB)
            for start in range(0, data_bytes, MB):
                f.write(chunk[: min(MB, data_bytes - start)])
        with archive.open("y.npy", "w") as f:
            np.lib.format.write_array(f, np.zeros(4, dtype=np.int64))


def _refused_with_little_memory(root: Path, limit: int = 4 * MB) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as err:
            build_data(DataConfig(source="npz_dir", root=str(root), num_clients=4), seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, peak
    return str(err.value)


def test_a_zip_bomb_past_the_memory_budget_is_refused_before_inflating(tmp_path, capsys, monkeypatch):
    root = npz_dir(tmp_path / "fed")
    rows = 64 * MB // 256  # 64 MB of images in a file of about 64 KB
    _bomb(root / "train" / "2.npz", rows, rows * 256)
    assert (root / "train" / "2.npz").stat().st_size < MB
    monkeypatch.setattr(npz_module, "available_memory", lambda: 3 * 32 * MB)  # pfl may read 32 MB
    message = _refused_with_little_memory(root)
    assert "train/2.npz: member 'x.npy' inflates to 0.0671 GB" in message and "zip bomb" in message
    refused_by_fit(tmp_path, capsys, "npz_dir", root, ["train/2.npz", "'x.npy'", "zip bomb"], "--data.num_clients", "4")


@pytest.mark.parametrize(
    "rows, data_bytes",
    [(2**36, 4096), (4, 16 * MB)],  # a header claiming 16 TB over 4 KB of data; a 4-image header over 16 MB
)
def test_a_member_whose_size_differs_from_its_header_is_refused_before_inflating(tmp_path, capsys, rows, data_bytes):
    root = npz_dir(tmp_path / "fed")
    _bomb(root / "test" / "3.npz", rows, data_bytes)
    message = _refused_with_little_memory(root)
    assert "test/3.npz: member 'x.npy' declares" in message and "its header describes" in message
    refused_by_fit(tmp_path, capsys, "npz_dir", root, ["test/3.npz", "its header describes"], "--data.num_clients", "4")


def test_the_budget_adds_up_every_member_read(tmp_path):
    budget = ReadBudget(100)
    budget.charge(60, tmp_path / "a.npz", "x.npy")
    budget.charge(40, tmp_path / "a.npz", "y.npy")  # exactly the limit is admitted
    with pytest.raises(ConfigError, match=r"b\.npz: member 'x\.npy'"):
        budget.charge(1, tmp_path / "b.npz", "x.npy")
    ReadBudget(None).charge(2**60, tmp_path / "c.npz", "x.npy")  # no limit known: nothing refused


def test_a_model_too_large_for_memory_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(size_module, "available_memory", lambda: 24 * 10**9)  # as on a 24 GB machine, anywhere
    runs = tmp_path / "runs"
    args = ["fit", "--data.source", "digits", *QUIET, "--model.hidden", "[100000000]", "--tracking.root", str(runs)]
    capsys.readouterr()
    assert main(args) == 2
    message = capsys.readouterr().err
    head = "error: model: model mlp (input (1, 8, 8), 10 classes) has 30 GB of parameters; training holds at least"
    assert message.startswith(head + " 3 copies (90 GB), but 24 GB")
    assert len(message.strip().splitlines()) == 1 and "model.hidden" in message
    assert not runs.exists()


def test_the_model_size_is_counted_exactly_before_allocation(monkeypatch):
    cfg = ModelConfig(name="mlp", hidden=[16])
    params = (64 * 16 + 16) + (16 * 10 + 10)
    net = build_model(cfg, (1, 8, 8), 10)
    assert sum(p.numel() for p in net.parameters()) == params
    monkeypatch.setattr(size_module, "available_memory", lambda: 3 * 4 * params)  # exactly 3 copies fit
    build_model(cfg, (1, 8, 8), 10)
    monkeypatch.setattr(size_module, "available_memory", lambda: 3 * 4 * params - 1)
    with pytest.raises(ConfigError, match="training holds at least 3 copies"):
        build_model(cfg, (1, 8, 8), 10)
