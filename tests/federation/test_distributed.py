"""Multi-process rounds: greedy client balance, and 2 gloo processes == 1 process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pfl.config import validate
from pfl.errors import ConfigError
from pfl.federation.checkpoint import load_checkpoint
from pfl.federation.distributed import Cohort, balance
from tests.conftest import tiny_config
from tests.helpers.cli_runs import child_env

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--config", "conf/method/ditto.yaml", "--data.num_clients", "8", "--trainer.fraction", "0.5",
    "--trainer.rounds", "3", "--trainer.eval_every", "1", "--model.hidden", "[32]", "--client.epochs", "1",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def test_balance_puts_largest_first_on_least_loaded_rank():
    sizes = [10, 9, 8, 1, 1, 1, 7]
    shares = balance([0, 1, 2, 3, 4, 5, 6], sizes, 2)
    # 10->r0, 9->r1, 8->r1 (9<10), 7->r0 (10<17), then the 1s: r0 (17) ties r1 (17) -> r0, r1, r0
    assert shares == [[0, 3, 5, 6], [1, 2, 4]]
    assert [sum(sizes[c] for c in s) for s in shares] == [19, 18]
    three = balance(list(range(7)), sizes, 3)
    assert sorted(c for s in three for c in s) == list(range(7))
    assert balance([4, 2], sizes, 3)[2] == []  # more ranks than clients: a rank may train nobody


def test_single_rank_keeps_the_sampled_order():
    assert Cohort().share([5, 1, 3], [1] * 6) == [5, 1, 3]


def test_bad_strategy_and_num_nodes_fail_early():
    cfg = tiny_config(trainer={"strategy": "horovod"})
    with pytest.raises(ConfigError, match="trainer.strategy"):
        validate(cfg)
    with pytest.raises(ConfigError, match="trainer.num_nodes"):
        validate(tiny_config(trainer={"num_nodes": 0}))


def _fit(root: Path, name: str, *extra: str) -> dict:
    return _fit_with_log(root, name, *extra)[0]


def _fit_with_log(root: Path, name: str, *extra: str) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "pfl", "fit", *ARGS, "--tracking.root", str(root), "--tracking.name", name, *extra]
    env = child_env()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads((root / name / "summary.json").read_text()), out.stdout + out.stderr


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[dict, Path]:
    """The 1-process run that the several-process runs must reproduce (made once per module, in this
    process: a command line's run is the same run)."""
    from pfl.runner.experiment import run_argv

    root = tmp_path_factory.mktemp("one")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        run_argv([*ARGS, "--tracking.root", str(root), "--tracking.name", "run"])
    return json.loads((root / "run" / "summary.json").read_text()), root / "run"


def test_two_gloo_processes_equal_one_process(tmp_path, one_process):
    one, one_dir = one_process
    two = _fit(tmp_path / "b", "run", "--trainer.devices", "2", "--trainer.strategy", "ddp")
    a, b = load_checkpoint(one_dir), load_checkpoint(tmp_path / "b" / "run")
    torch.testing.assert_close(b["server"]["global"], a["server"]["global"], rtol=1e-5, atol=1e-6)
    # Clients trained on rank 1 must have their personal models on rank 0 too (it wrote the checkpoint).
    assert sorted(b["clients"]) == sorted(a["clients"]) and len(a["clients"]) > 4
    for cid, state in a["clients"].items():
        torch.testing.assert_close(b["clients"][cid]["personal"], state["personal"], rtol=1e-5, atol=1e-6)
    assert b["train_samples"] == a["train_samples"]  # every rank's fits were counted once
    for key, value in one["metrics"].items():
        if not key.startswith(("time.", "throughput.")):
            assert two["metrics"][key] == pytest.approx(value, abs=1e-5), key
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["run"]  # only rank 0 wrote files


def test_a_run_destroys_the_process_group_it_started_and_keeps_a_callers(tmp_path, monkeypatch):
    # Left to interpreter shutdown, gloo's threads can abort a finished rank ("terminate called ...").
    import pfl.runner.experiment as experiment

    def start_group(name: str) -> None:
        store = torch.distributed.FileStore(str(tmp_path / name), 1)
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)

    def cfg(name: str):
        return tiny_config(trainer={"rounds": 1}, tracking={"root": str(tmp_path / "runs"), "name": name})

    original = experiment._run

    def run_starting_a_group(*args, **kwargs):  # as fabric.launch() does in a several-process run
        start_group("run_store")
        return original(*args, **kwargs)

    try:
        monkeypatch.setattr(experiment, "_run", run_starting_a_group)
        experiment.run_experiment(cfg("own"))
        assert not torch.distributed.is_initialized()
        monkeypatch.setattr(experiment, "_run", original)
        start_group("caller_store")
        experiment.run_experiment(cfg("callers"))
        assert torch.distributed.is_initialized()  # the caller's group outlives the run
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_two_processes_sharing_one_device_equal_one_process(tmp_path, one_process):
    one, one_dir = one_process
    two, log = _fit_with_log(tmp_path / "b", "run", "--trainer.processes_per_device", "2")
    assert "MEMBER: 2/2" in log and "distributed_backend=gloo" in log  # two ranks did start, on gloo
    a, b = load_checkpoint(one_dir), load_checkpoint(tmp_path / "b" / "run")
    torch.testing.assert_close(b["server"]["global"], a["server"]["global"], rtol=1e-5, atol=1e-6)
    assert sorted(b["clients"]) == sorted(a["clients"])
    for cid, state in a["clients"].items():
        torch.testing.assert_close(b["clients"][cid]["personal"], state["personal"], rtol=1e-5, atol=1e-6)
    assert b["train_samples"] == a["train_samples"]
    for key, value in one["metrics"].items():
        if not key.startswith(("time.", "throughput.")):
            assert two["metrics"][key] == pytest.approx(value, abs=1e-5), key
