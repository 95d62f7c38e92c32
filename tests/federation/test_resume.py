"""Checkpoint/resume: a run killed with SIGKILL and resumed ends with the uninterrupted run's numbers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from pfl.federation.checkpoint import CHECKPOINT, load_checkpoint
from pfl.federation.loop import comparable_metrics
from tests.conftest import make_loop, tiny_config
from tests.helpers.cli_runs import child_env

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--config", "conf/method/ditto.yaml", "--data.num_clients", "8", "--trainer.fraction", "0.5",
    "--trainer.rounds", "100", "--trainer.eval_every", "25", "--trainer.checkpoint_every", "1",
    "--model.hidden", "[64]", "--client.epochs", "2", "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def _fit(root: Path, name: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pfl", "fit", *ARGS, "--tracking.root", str(root), "--tracking.name", name, *extra]
    env = child_env()
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    full = _fit(tmp_path, "full")
    victim = _fit(tmp_path, "victim")
    ckpt = tmp_path / "victim" / CHECKPOINT
    deadline = time.time() + 120
    while time.time() < deadline:
        state = load_checkpoint(ckpt.parent) if ckpt.exists() else None
        if state is not None and state["round"] >= 20:
            break
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (tmp_path / "victim" / "summary.json").exists(), "the run finished before it could be killed"
    killed_at = load_checkpoint(ckpt.parent)["round"]
    assert 20 <= killed_at < 100
    resumed = subprocess.run(
        [sys.executable, "-m", "pfl", "fit", "--resume", str(tmp_path / "victim"), "--trainer.progress", "false"],
        cwd=ROOT, env=child_env(),  # same threads: same sums
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert full.wait(timeout=300) == 0
    a = json.loads((tmp_path / "full" / "summary.json").read_text())
    b = json.loads((tmp_path / "victim" / "summary.json").read_text())
    assert comparable_metrics(a) == comparable_metrics(b)
    assert a["rounds"] == b["rounds"] == 100
    # the per-round history survives the kill: one row per evaluated round, no duplicates
    rows = (tmp_path / "victim" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 100 // 25


def test_checkpoint_holds_the_whole_federation(tmp_path):
    cfg = tiny_config("ditto")
    from pfl.runner.outputs import FileOutputs, RunFiles

    loop = make_loop(cfg, run_dir=tmp_path, callbacks=[FileOutputs(RunFiles(tmp_path))])
    loop.fit()
    state = load_checkpoint(tmp_path)
    assert state["round"] == cfg.trainer.rounds
    assert set(state["clients"]) == set(range(cfg.data.num_clients))
    assert torch.equal(state["server"]["global"], loop.server["global"])
    fresh = make_loop(cfg)
    fresh.checkpointer.load_state_dict(state)
    assert torch.equal(fresh.clients[3]["personal"], loop.clients[3]["personal"])


def test_resume_of_a_missing_run_is_a_clear_error(tmp_path, capsys):
    from pfl.cli import main

    assert main(["fit", "--resume", str(tmp_path / "nope")]) == 2
    assert "--resume" in capsys.readouterr().err
