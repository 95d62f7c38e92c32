"""Runs never lose or mix results: an existing run folder is refused (or moved aside on request), a
folder in use is locked, a resume may not change what the run is, a diverged run stops with the round
and client named, bad input gives one line and writes nothing. Every refusal is checked against the
hashes of the files that were there before."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pfl.cli import main
from pfl.config import EvalConfig, validate, validate_target
from pfl.engine.trainer import FitStats
from pfl.errors import ConfigError, TrainingDiverged
from pfl.federation import divergence
from pfl.federation.checkpoint import load_checkpoint
from pfl.federation.loop import comparable_metrics
from pfl.methods import Upload
from pfl.methods.fedavg import FedAvg
from pfl.runner.experiment import apply_threads
from pfl.runner.outputs import RunFiles
from pfl.runner.rundir import LOCK, REPLACED, RunClaim, RunLock, busy_owner
from pfl.runner.sweep import run_parallel, run_status
from tests.conftest import tiny_config
from tests.helpers.cli_runs import TINY, child_env, fit

ROOT = Path(__file__).resolve().parents[2]
SELF = "tests.runner.test_run_safety"


def hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file below ``folder`` (the lock file only records the last owner)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK
    }


def strict_loads(text: str):
    def refuse(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def runs(tmp_path, finished) -> Path:
    """A fresh tracking root holding a copy of the finished run as ``a``."""
    shutil.copytree(finished, tmp_path / "a")
    return tmp_path


# -- an existing run folder -----------------------------------------------------------------------
def test_a_finished_run_is_not_overwritten_by_a_new_run_of_the_same_name(runs, capsys):
    before = hashes(runs / "a")
    assert fit(runs, "a", "--seed", "3") == 2
    err = capsys.readouterr().err
    assert "tracking.name" in err and "already exists" in err and "--resume" in err and "--tracking.overwrite" in err
    assert len(err.strip().splitlines()) == 1
    assert hashes(runs / "a") == before


def test_overwrite_moves_the_old_run_aside_only_after_the_new_one_is_set_up(runs, capsys):
    before = hashes(runs / "a")
    # an overwrite whose configuration or model fails leaves the old run where it was
    assert fit(runs, "a", "--tracking.overwrite", "true", "--client.lr", "-1") == 2
    assert fit(runs, "a", "--tracking.overwrite", "true", "--model.name", "cnn", "--data.source", "synthetic") == 2
    assert hashes(runs / "a") == before and not (runs / REPLACED).exists()
    assert fit(runs, "a", "--tracking.overwrite", "true", "--seed", "5") == 0
    (moved,) = (runs / REPLACED).iterdir()
    assert moved.name.startswith("a-") and hashes(moved) == before  # nothing lost
    assert json.loads((runs / "a" / "summary.json").read_text())["seed"] == 5
    assert f"moved to {moved}" in capsys.readouterr().out


def test_a_failed_set_up_removes_its_folder_and_puts_an_overwritten_run_back(tmp_path):
    old = tmp_path / "r"
    old.mkdir()
    (old / "summary.json").write_text("{}")
    before = hashes(old)
    with pytest.raises(RuntimeError, match="set-up failed"), RunClaim(old, tmp_path, overwrite=True):
        assert not (old / "summary.json").exists() and (tmp_path / REPLACED).exists()
        raise RuntimeError("set-up failed")
    assert hashes(old) == before
    fresh = tmp_path / "new"
    with pytest.raises(RuntimeError), RunClaim(fresh, tmp_path):
        assert (fresh / LOCK).exists()
        raise RuntimeError("set-up failed")
    assert not fresh.exists()  # no stray run folder


def test_an_automatic_name_takes_the_next_free_folder(tmp_path):
    taken = tmp_path / "fedavg-digits-s0-20260101-000000"
    taken.mkdir()
    (taken / "metrics.csv").write_text("round\n1\n")
    with RunClaim(taken, tmp_path, auto_name=True) as claim:
        assert claim.dir == taken.with_name(taken.name + "-2")
    assert (taken / "metrics.csv").read_text() == "round\n1\n"


# -- one process per run folder -------------------------------------------------------------------
def test_the_lock_is_exclusive_and_names_its_owner(tmp_path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.try_acquire()
    assert not second.try_acquire()  # flock is per open file: refused even inside one process
    assert busy_owner(tmp_path).startswith(f"pid {os.getpid()} ")
    first.release()
    assert busy_owner(tmp_path) is None and second.try_acquire()
    second.release()


def test_a_second_process_on_the_same_run_is_refused_while_the_first_runs(tmp_path, capsys):
    # A long first run that writes nothing after its config.yaml (no evaluation, no checkpoint yet).
    forever = ["--trainer.rounds", "100000", "--trainer.eval_every", "100000", "--trainer.checkpoint_every", "100000"]
    # On the CPU: the point is the lock, not the device (with accelerator auto the child would take a
    # GPU beside this process's own CUDA context, which a busy or exclusive-process GPU refuses). The
    # child keeps the caller's PYTHONPATH (child_env), and its stderr is kept to tell why it did not start.
    args = [*TINY, *forever, "--trainer.accelerator", "cpu", "--tracking.root", str(tmp_path), "--tracking.name", "r"]
    env = child_env(WANDB_MODE="disabled")
    log = tmp_path / "first.stderr"  # outside the run folder, whose files the refusals must not change
    with log.open("wb") as stderr:
        first = subprocess.Popen(
            [sys.executable, "-m", "pfl", "fit", *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.time() + 180
        while busy_owner(tmp_path / "r") is None or not (tmp_path / "r" / "config.yaml").exists():
            code = first.poll()
            assert code is None, f"the first run exited {code} before it started: {log.read_text()[-2000:]}"
            assert time.time() < deadline, "the first run did not start within 180 s"
            time.sleep(0.1)
        first.send_signal(signal.SIGSTOP)  # holds its lock, writes nothing (no checkpoint) meanwhile
        for argv in ([*args, "--tracking.overwrite", "true"], ["--resume", str(tmp_path / "r")]):
            before = hashes(tmp_path / "r")
            assert main(["fit", *argv]) == 2
            err = capsys.readouterr().err
            assert f"{tmp_path / 'r'} is in use by pid {first.pid} " in err, err
            assert hashes(tmp_path / "r") == before  # the second process changed and added nothing
        assert not (tmp_path / REPLACED).exists()
    finally:
        first.kill()
        first.wait()
    assert busy_owner(tmp_path / "r") is None  # a killed owner leaves no stale lock


# -- resume ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "named"),
    [
        (["--seed", "1"], "seed (0 -> 1)"),
        (["--model.hidden", "[32]", "--trainer.rounds", "3"], "model.hidden ([16] -> [32])"),
        (["--client.lr", "0.5"], "client.lr"),
        (["--data.num_clients", "5"], "data.num_clients"),
        (["--method", "fedprox"], "recorded with method fedavg; a resume may not change the method (got fedprox)"),
    ],
)
def test_a_resume_that_changes_the_experiment_is_refused_before_writing(runs, capsys, change, named):
    before = hashes(runs / "a")
    config = (runs / "a" / "config.yaml").read_bytes()
    assert main(["fit", "--resume", str(runs / "a"), *change]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and named in err, err
    assert (runs / "a" / "config.yaml").read_bytes() == config and hashes(runs / "a") == before


def test_a_resume_with_fewer_rounds_than_done_is_refused(runs, capsys):
    before = hashes(runs / "a")
    assert main(["fit", "--resume", str(runs / "a"), "--trainer.rounds", "1"]) == 2
    assert "trainer.rounds: 1 is fewer than the 2 rounds" in capsys.readouterr().err
    assert hashes(runs / "a") == before


def test_resuming_a_finished_run_says_so_and_touches_nothing(runs, capsys):
    before = {**hashes(runs / "a"), LOCK: (runs / "a" / LOCK).read_bytes()}
    stamps = {p.name: p.stat().st_mtime_ns for p in (runs / "a").iterdir()}
    assert main(["fit", "--resume", str(runs / "a"), "--eval.batch_size", "64"]) == 0
    assert "already finished its 2 rounds; nothing to do" in capsys.readouterr().out
    assert {**hashes(runs / "a"), LOCK: (runs / "a" / LOCK).read_bytes()} == before
    assert {p.name: p.stat().st_mtime_ns for p in (runs / "a").iterdir()} == stamps


def test_a_run_killed_between_its_last_checkpoint_and_its_summary_is_completed_by_a_resume(runs, capsys):
    summary = json.loads((runs / "a" / "summary.json").read_text())
    (runs / "a" / "summary.json").unlink()  # killed before writing it
    assert main(["fit", "--resume", str(runs / "a")]) == 0
    assert "nothing to do" not in capsys.readouterr().out
    assert json.loads((runs / "a" / "summary.json").read_text())["rounds"] == 2
    (runs / "a" / "summary.json").write_text(json.dumps({**summary, "rounds": 1}))  # not this checkpoint's
    assert main(["fit", "--resume", str(runs / "a")]) == 0
    assert "nothing to do" not in capsys.readouterr().out
    assert json.loads((runs / "a" / "summary.json").read_text())["rounds"] == 2


def test_a_run_without_checkpoints_resumes_as_finished_and_refuses_more_rounds(tmp_path, capsys):
    assert fit(tmp_path, "n", "--trainer.checkpoint_every", "0") == 0
    before = hashes(tmp_path / "n")
    assert not [name for name in before if name.startswith("checkpoint")]
    assert main(["fit", "--resume", str(tmp_path / "n")]) == 0  # its summary is final: not trained again
    assert "already finished its 2 rounds; nothing to do" in capsys.readouterr().out
    assert main(["fit", "--resume", str(tmp_path / "n"), "--trainer.rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert "finished 2 rounds but holds no checkpoint to continue from" in err and "--tracking.name" in err
    assert len(err.strip().splitlines()) == 1 and hashes(tmp_path / "n") == before
    finished = comparable_metrics(json.loads((tmp_path / "n" / "summary.json").read_text()))
    (tmp_path / "n" / "summary.json").unlink()  # killed before its end: nothing to continue, trained again
    assert main(["fit", "--resume", str(tmp_path / "n")]) == 0
    assert "nothing to do" not in capsys.readouterr().out
    assert comparable_metrics(json.loads((tmp_path / "n" / "summary.json").read_text())) == finished  # from round 0


def test_a_resume_may_add_rounds_and_change_the_evaluation_schedule(runs):
    assert main(["fit", "--resume", str(runs / "a"), "--trainer.rounds", "3", "--trainer.eval_every", "3"]) == 0
    assert "rounds: 3" in (runs / "a" / "config.yaml").read_text()
    assert json.loads((runs / "a" / "summary.json").read_text())["rounds"] == 3


def test_a_corrupted_recorded_config_is_one_clear_line(runs, capsys):
    (runs / "a" / "config.yaml").write_text("trainer:\n  rounds: [2\nseed: 0\n")
    before = hashes(runs / "a")
    assert main(["fit", "--resume", str(runs / "a"), "--trainer.rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert "config.yaml is not valid YAML at line" in err and len(err.strip().splitlines()) == 1
    assert hashes(runs / "a") == before


# -- divergence -----------------------------------------------------------------------------------
class Poisoned(FedAvg):
    """FedAvg whose client 1 returns a NaN model (``what: nan``) or reports an infinite training loss
    (``what: inf_loss``) in round ``at_round``."""

    name = "poisoned"

    def __init__(self, finetune_epochs: int = 0, at_round: int = 2, what: str = "nan"):
        super().__init__(finetune_epochs)
        self.at_round, self.what = at_round, what

    def local_update(self, client, payload):
        upload = super().local_update(client, payload)
        if client.round + 1 == self.at_round and client.cid == 1:
            if self.what == "nan":
                upload.state = upload.state.clone()
                upload.state[3] = float("nan")
            else:
                client.fits.append(FitStats(1, 1, 1, float("inf"), 0.0))
        return upload


@pytest.mark.parametrize(
    ("what", "said"), [("nan", "upload.state has 1 non-finite value(s) (NaN)"), ("inf_loss", "loss is inf")]
)
def test_divergence_stops_the_run_naming_round_and_client(runs, capsys, what, said):
    before = hashes(runs / "a")
    args = ["--method", f"{SELF}.Poisoned", "--method.what", what, "--trainer.rounds", "3"]
    assert fit(runs, "p", *args) == 3
    err = capsys.readouterr().err
    assert "training diverged in round 2, client 1" in err and said in err, err
    assert not (runs / "p" / "summary.json").exists()  # no summary claiming success
    assert load_checkpoint(runs / "p")["round"] == 1  # the last good round, nothing of round 2
    assert len((runs / "p" / "metrics.csv").read_text().splitlines()) == 1 + 1
    assert hashes(runs / "a") == before


def test_a_huge_learning_rate_diverges_with_exit_code_3(tmp_path, capsys):
    assert fit(tmp_path, "r", "--client.lr", "1e30") == 3
    assert "training diverged in round 1, client 0" in capsys.readouterr().err


def test_divergence_checks_tensors_and_losses_but_not_the_unknown_loss_marker():
    upload = Upload(torch.ones(3), 1.0, {"grad": torch.tensor([0.0, float("-inf")])})
    assert divergence.first_nonfinite(upload, "upload") == "upload.extras['grad'] has 1 non-finite value(s) (inf)"
    assert divergence.first_nonfinite({"v": torch.ones(2), "ids": torch.arange(3)}, "state") is None
    divergence.check_losses(1, [0.3, float("nan")])  # NaN: a method's own loop reported no loss
    with pytest.raises(TrainingDiverged, match="round 4, client 7: the local training loss is -inf"):
        divergence.check_losses(4, [0.3, float("-inf")], 7)
    with pytest.raises(TrainingDiverged, match="round 2, client 5"):
        divergence.check_clients(2, [5, 3], {3: Upload(torch.ones(2)), 5: upload}, {})
    with pytest.raises(TrainingDiverged, match=r"round 1: server state\['global'\]"):
        divergence.check_server(1, {"global": torch.tensor([float("nan")])})


def test_a_sweep_marks_a_diverged_run_failed(tmp_path, capsys):
    """Both runs in one warm worker process: the diverged one ends it with exit 3, the next one is ok."""
    assert run_status(0) == "ok" and run_status(3) == "FAILED (exit 3: training diverged)"
    common = ["fit", *TINY, "--tracking.root", str(tmp_path)]
    jobs = {"x": [*common, "--client.lr", "1e30", "--tracking.name", "x"], "y": [*common, "--tracking.name", "y"]}
    ended: dict[str, tuple[int, float]] = {}  # what a caller hears as each run ends
    with pytest.raises(ConfigError, match="1 of 2 runs failed: x: error: training diverged in round 1"):
        run_parallel(jobs, on_finish=lambda name, code, wall, cpu: ended.update({name: (code, wall)}))
    out = capsys.readouterr().out
    assert "x: FAILED (exit 3: training diverged)" in out and "y: ok" in out
    assert {name: code for name, (code, _) in ended.items()} == {"x": 3, "y": 0}
    assert all(wall > 0 for _, wall in ended.values())


# -- values -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--client.lr", "1e400"], "client.lr: must be a finite number (got inf)"),
        (["--server.tau", "1e400"], "server.tau: must be a finite number"),
        (["--data.synthetic.alpha=-1e400"], "data.synthetic.alpha: must be a finite number (got -inf)"),
        (["--method", "fedprox", "--method.mu", "1e400"], "method.mu: must be a finite number"),
        (["--eval.target", "1.5"], "eval.target: a classification target is an accuracy and must be in [0, 1]"),
        (["--eval.target", "-0.2"], "eval.target: must be >= 0"),
        (["--trainer.threads", "0"], "trainer.threads: must be >= 1"),
        (["--trainer.checkpoint_every", "-1"], "trainer.checkpoint_every: must be >= 1, or 0 for no checkpoints"),
    ],
)
def test_non_finite_and_out_of_range_values_are_refused(runs, capsys, args, field):
    before = hashes(runs)
    assert fit(runs, "x", *args) == 2
    err = capsys.readouterr().err
    assert field in err and len(err.strip().splitlines()) == 1, err
    assert hashes(runs) == before and not (runs / "x").exists()


def test_every_float_field_is_checked_generically():
    cfg = tiny_config()
    cfg.data.synthetic.beta = math.inf
    with pytest.raises(ConfigError, match="data.synthetic.beta"):
        validate(cfg)
    cfg = tiny_config(eval={"s_acc_others": math.nan})
    with pytest.raises(ConfigError, match="eval.s_acc_others: must be a finite number"):
        validate(cfg)


def test_eval_target_range_depends_on_the_task():
    validate_target(EvalConfig(target=0.0), "classification")
    validate_target(EvalConfig(target=1.0), "classification")
    validate_target(EvalConfig(target=2.5), "regression")  # an MAE
    with pytest.raises(ConfigError, match="regression target is an MAE and must be > 0"):
        validate_target(EvalConfig(target=0.0), "regression")
    with pytest.raises(ConfigError, match=r"must be in \[0, 1\]"):
        validate_target(EvalConfig(target=1.01), "classification")


def test_summary_json_is_strict_json(tmp_path, finished):
    files = RunFiles(tmp_path)
    files.write_summary({"metrics": {"a": float("nan"), "b": np.float64("inf"), "c": 0.5, "d": [np.float32(1.5)]}})
    text = (tmp_path / "summary.json").read_text()
    assert strict_loads(text) == {"metrics": {"a": None, "b": None, "c": 0.5, "d": [1.5]}}
    strict_loads((finished / "summary.json").read_text())  # what a real run writes parses strictly


# -- bad set-up: one line, exit 2, no stray folder ------------------------------------------------
def test_a_yaml_syntax_error_is_one_line(runs, capsys):
    bad = runs / "bad.yaml"
    bad.write_text("trainer:\n  rounds: [2\n")
    before = hashes(runs)
    assert fit(runs, "x", "--config", str(bad)) == 2
    err = capsys.readouterr().err
    assert f"--config: {bad} is not valid YAML at line 3, column 1" in err and len(err.strip().splitlines()) == 1
    assert hashes(runs) == before and not (runs / "x").exists()


def test_an_impossible_tracking_root_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    assert main(["fit", *TINY, "--tracking.root", str(tmp_path / "file" / "runs"), "--tracking.name", "x"]) == 2
    err = capsys.readouterr().err
    assert f"tracking.root: {tmp_path / 'file' / 'runs' / 'x'} cannot be created: {tmp_path / 'file'} is a file" in err
    assert len(err.strip().splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores file permissions")
def test_a_read_only_tracking_root_is_one_line(tmp_path, capsys):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o555)
    try:
        assert fit(root, "x") == 2
        assert "is not writable" in capsys.readouterr().err and not (root / "x").exists()
    finally:
        root.chmod(0o755)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    assert fit(tmp_path, "x", "--trainer.accelerator", "cuda") == 2
    err = capsys.readouterr().err
    assert "trainer.accelerator: cuda was asked for but torch" in err and "sees no CUDA GPU" in err
    assert len(err.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--model.name", "resnet_nope"], "model.name: unknown model 'resnet_nope'"),
        (["--model.name", "cnn", "--data.source", "synthetic"], "model.name: cnn needs image inputs"),  # at build
    ],
)
def test_an_unusable_model_is_one_line_and_leaves_no_folder(tmp_path, capsys, args, said):
    assert fit(tmp_path, "x", *args) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


# -- threads --------------------------------------------------------------------------------------
class CountThreads(FedAvg):
    """FedAvg that appends torch's thread count, while each client trains, to the file ``record``."""

    name = "count_threads"

    def __init__(self, finetune_epochs: int = 0, record: str = ""):
        super().__init__(finetune_epochs)
        self.record = record

    def local_update(self, client, payload):
        with open(self.record, "a") as fh:
            fh.write(f"{torch.get_num_threads()}\n")
        return super().local_update(client, payload)


def test_the_run_sets_torch_threads_itself_and_restores_them(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # what the environment gave this process
    try:
        # default 1 whatever the environment; an explicit count; null: torch's default, untouched
        for name, threads, expected in (
            ("a", [], 1),
            ("b", ["--trainer.threads", "2"], 2),
            ("c", ["--trainer.threads", "null"], 3),
        ):
            record = tmp_path / f"{name}.txt"
            method = ["--method", f"{SELF}.CountThreads", "--method.record", str(record)]
            assert fit(tmp_path, name, *method, *threads, "--trainer.rounds", "1") == 0
            assert set(record.read_text().split()) == {str(expected)}, name
            assert torch.get_num_threads() == 3  # restored after the run
        assert apply_threads(None) == 3 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
