"""Opening a dataset, a checkpoint or a run name never runs code from it or writes outside the run root.

Each hostile file carries a live payload: an object whose ``__reduce__`` makes the unpickler call
``open(marker, "w")``. A control shows that an ordinary unpickler does create the marker; pfl must
refuse the file with a ConfigError naming it, and the marker must never appear.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pfl.cli import main
from pfl.data import DataConfig, build_data
from pfl.data.disk import load_standard
from pfl.data.npz import read_npz
from pfl.data.safe_pickle import restricted_load
from pfl.errors import ConfigError
from pfl.federation.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint, read_checkpoint, save_checkpoint
from pfl.runner.outputs import run_dir_under

QUIET = ["--tracking.wandb", "false", "--trainer.progress", "false"]


class Payload:
    """Unpickling this creates ``marker``: proof that the file's code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def pfllib_npz(path: Path, data: dict) -> None:
    """Exactly how PFLlib writes a client file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, data=data)


def small_npz_dir(root: Path, n_clients: int = 3) -> None:
    rng = np.random.default_rng(0)
    for cid in range(n_clients):
        for split, n in (("train", 6), ("test", 3)):
            pfllib_npz(root / split / f"{cid}.npz", {"x": rng.random((n, 1, 8, 8)), "y": rng.integers(0, 10, n)})
    (root / "config.json").write_text(json.dumps({"num_clients": n_clients, "num_classes": 10}))


# -- npz (PFLlib layout) ----------------------------------------------------------------------------
def test_npz_payload_is_refused_naming_file_and_global(tmp_path):
    marker = tmp_path / "marker"
    root = tmp_path / "fed"
    small_npz_dir(root)
    evil = root / "train" / "1.npz"
    pfllib_npz(evil, {"x": np.zeros((6, 1, 8, 8)), "y": np.zeros(6, dtype=np.int64), "z": Payload(marker)})
    with pytest.raises(ConfigError) as err:
        build_data(DataConfig(source="npz_dir", root=str(root), num_clients=3), seed=0)
    assert str(evil) in str(err.value) and "io.open" in str(err.value) and "refuses to unpickle" in str(err.value)
    assert not marker.exists()
    runs = tmp_path / "runs"
    args = ["fit", "--data.source", "npz_dir", "--data.root", str(root), "--data.num_clients", "3", *QUIET]
    assert main([*args, "--tracking.root", str(runs)]) == 2
    assert not marker.exists() and not runs.exists()
    np.load(evil, allow_pickle=True)["data"]  # control: numpy's own reader runs the payload
    assert marker.exists()


def test_npz_payload_in_a_plain_member_is_refused_too(tmp_path):
    """An object array hidden under the plain ``x`` name goes through the same unpickler."""
    marker = tmp_path / "marker"
    path = tmp_path / "0.npz"
    np.savez(path, x=np.array([Payload(marker)], dtype=object), y=np.zeros(1, dtype=np.int64))
    with pytest.raises(ConfigError, match="io.open"):
        read_npz(path)
    assert not marker.exists()


def test_pfllib_layout_and_numpy1_pickles_load(tmp_path):
    """A directory written exactly as PFLlib writes it loads, with the arrays unchanged; so do the
    globals numpy 1.x wrote (numpy.core.*) and protocol-5 in-band buffers (_frombuffer)."""
    root = tmp_path / "fed"
    small_npz_dir(root)
    data = build_data(DataConfig(source="npz_dir", root=str(root), num_clients=3), seed=0)
    with open(root / "test" / "2.npz", "rb") as f:
        expected = np.load(f, allow_pickle=True)["data"].tolist()
    assert np.array_equal(data.x[data.clients[2].test].numpy(), expected["x"].astype(np.float32))
    assert np.array_equal(data.y[data.clients[2].test].numpy(), expected["y"])
    arrays = {"x": np.arange(6.0).reshape(2, 3), "y": np.array([1, 0]), "s": np.float32(2.5), "k": [1, "a", None]}
    numpy1 = pickle.dumps(arrays, protocol=2).replace(b"cnumpy._core.", b"cnumpy.core.")
    assert b"numpy.core.multiarray" in numpy1
    for blob in (numpy1, pickle.dumps(arrays, protocol=5)):
        back = restricted_load(blob, "blob")
        assert np.array_equal(back["x"], arrays["x"]) and back["s"] == arrays["s"] and back["k"] == arrays["k"]


def test_npz_refuses_non_numeric_dtypes(tmp_path):
    path = tmp_path / "0.npz"
    np.savez(path, data={"x": np.array(["a", "b"]), "y": np.zeros(2)})
    with pytest.raises(ConfigError) as err:
        read_npz(path)
    assert str(path) in str(err.value) and "not numeric" in str(err.value)


def test_export_loads_without_pickle_and_round_trips(tmp_path):
    out = tmp_path / "fed"
    assert main(["data", "export", str(out), "--data.num_clients", "4", "--data.val_frac", "0.1"]) == 0
    original = build_data(DataConfig(num_clients=4, val_frac=0.1), seed=0)
    with np.load(out / "train" / "0.npz", allow_pickle=False) as f:  # any reader, no pickle needed
        assert np.array_equal(f["x"], original.x[original.clients[0].train].numpy())
        assert np.array_equal(f["y"], original.y[original.clients[0].train].numpy())
    with np.load(out / "val" / "3.npz", allow_pickle=True) as f:  # PFLlib's reader still finds the dict
        assert np.array_equal(f["data"].tolist()["y"], original.y[original.clients[3].val].numpy())
    loaded = build_data(DataConfig(source="npz_dir", root=str(out), num_clients=4), seed=5)
    for a, b in zip(original.clients, loaded.clients, strict=True):
        for split in ("train", "val", "test"):
            assert torch.equal(original.x[getattr(a, split)], loaded.x[getattr(b, split)])
            assert torch.equal(original.y[getattr(a, split)], loaded.y[getattr(b, split)])


# -- CIFAR python batches ---------------------------------------------------------------------------
def test_cifar_batch_payload_is_refused(tmp_path):
    marker = tmp_path / "marker"
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    rows = np.zeros((2, 3072), dtype=np.uint8)
    for i in range(1, 6):
        with open(base / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"data": rows, b"labels": [0, 1]}, f)
    with open(base / "test_batch", "wb") as f:
        pickle.dump({b"data": rows, b"labels": [0, 1], b"filenames": Payload(marker)}, f)
    with pytest.raises(ConfigError) as err:
        load_standard("cifar10", tmp_path, False, None)
    assert str(base / "test_batch") in str(err.value) and "io.open" in str(err.value)
    assert not marker.exists()
    with open(base / "test_batch", "rb") as f:  # control: the usual pickle.load runs it
        pickle.load(f, encoding="bytes")
    assert marker.exists()


# -- checkpoints ------------------------------------------------------------------------------------
def test_checkpoint_payload_is_refused_on_resume(tmp_path, capsys):
    marker = tmp_path / "marker"
    runs = tmp_path / "runs"
    tiny = ["--data.num_clients", "4", "--trainer.rounds", "2", "--model.hidden", "[8]", "--client.epochs", "1"]
    assert main(["fit", *tiny, *QUIET, "--tracking.root", str(runs), "--tracking.name", "r"]) == 0
    ckpt = runs / "r" / CHECKPOINT
    state = torch.load(ckpt, weights_only=True)  # what pfl wrote is plain tensors and containers
    state["history"].append({"note": Payload(marker)})
    torch.save(state, ckpt)
    shutil.copytree(runs / "r", runs / "alone")
    (runs / "alone" / PREVIOUS).unlink()
    resume = ["--trainer.rounds", "3", "--trainer.progress", "false"]
    capsys.readouterr()
    # the previous checkpoint verifies: the payload is refused in one warning and the run goes on from it
    assert main(["fit", "--resume", str(runs / "r"), *resume]) == 0
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert str(ckpt) in warning and "not plain tensors/containers: io.open" in warning
    assert f"falling back to {runs / 'r' / PREVIOUS}" in warning and not marker.exists()
    # nothing to fall back to: one error line
    assert main(["fit", "--resume", str(runs / "alone"), *resume]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("error: --resume: no readable checkpoint") and str(runs / "alone" / CHECKPOINT) in message
    assert "not plain tensors/containers: io.open" in message and "refuses to unpickle code" in message
    assert not marker.exists()
    torch.load(runs / "alone" / CHECKPOINT, weights_only=False)  # control: an unrestricted load runs it
    assert marker.exists()


def test_pfl_checkpoints_load_with_weights_only_and_resume(tmp_path):
    """What pfl saves (models, method state, history rows, the evaluation state with the trained models)
    loads under weights_only=True, and a run resumes from it."""
    runs = tmp_path / "runs"
    tiny = ["--data.num_clients", "5", "--data.new_clients", "0.2", "--data.val_frac", "0.1", "--model.hidden", "[8]"]
    args = [*tiny, "--client.epochs", "1", "--trainer.eval_every", "1", *QUIET]
    full = ["--config", "conf/eval/full.yaml", "--eval.reference", "none", "--eval.pm_source", "local_update"]
    for method, extra in (("pgfed", full), ("fedfomo", []), ("ditto", [])):
        common = ["fit", "--method", method, *args, *extra, "--tracking.root", str(runs), "--tracking.name", method]
        assert main([*common, "--trainer.rounds", "2"]) == 0
        state = torch.load(runs / method / CHECKPOINT, weights_only=True)
        assert state["round"] == 2 and (runs / method / PREVIOUS).exists()
        assert main(["fit", "--resume", str(runs / method), "--trainer.rounds", "3", *QUIET]) == 0
        assert read_checkpoint(runs / method / CHECKPOINT)["round"] == 3


def test_save_verifies_before_replacing_and_load_falls_back(tmp_path, capsys):
    for k in (1, 2):
        save_checkpoint(tmp_path, {"round": k, "w": torch.full((3,), float(k))})
    assert read_checkpoint(tmp_path / PREVIOUS)["round"] == 1
    with pytest.raises(RuntimeError, match="weights_only"):  # numpy scalars do not load back: refused at save
        save_checkpoint(tmp_path, {"round": 3, "loss": np.float64(0.5)})
    assert load_checkpoint(tmp_path)["round"] == 2 and read_checkpoint(tmp_path / PREVIOUS)["round"] == 1
    newest = tmp_path / CHECKPOINT
    whole = newest.read_bytes()
    for damaged in (whole[: len(whole) // 2], b""):  # truncated, then empty
        newest.write_bytes(damaged)
        capsys.readouterr()
        state = load_checkpoint(tmp_path)
        assert state["round"] == 1 and torch.equal(state["w"], torch.ones(3))
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and str(newest) in lines[0] and str(tmp_path / PREVIOUS) in lines[0]
    (tmp_path / PREVIOUS).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError) as err:
        load_checkpoint(tmp_path)
    assert str(newest) in str(err.value) and str(tmp_path / PREVIOUS) in str(err.value)


# -- run names --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../escaped", "../../x", "a/../../x", "..", ".", "/tmp/abs-run"])
def test_run_names_that_leave_the_root_are_refused(tmp_path, name, capsys):
    root = tmp_path / "root" / "runs"
    with pytest.raises(ConfigError) as err:
        run_dir_under(root, name)
    assert err.value.field == "tracking.name"
    tiny = ["--data.num_clients", "4", "--trainer.rounds", "1", "--model.hidden", "[8]", *QUIET]
    assert main(["fit", *tiny, "--tracking.root", str(root), "--tracking.name", name]) == 2
    assert "tracking.name" in capsys.readouterr().err
    assert not (tmp_path / "root").exists() and not (tmp_path / "escaped").exists()


def test_run_names_inside_the_root_are_kept(tmp_path):
    assert run_dir_under(tmp_path, "sweep/run001") == tmp_path / "sweep" / "run001"
    assert run_dir_under(tmp_path, "a/../b") == tmp_path / "b"
    assert run_dir_under("runs", "./x") == Path("runs") / "x"
