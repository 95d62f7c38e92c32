"""A run folder from elsewhere may hold planted symbolic links: pfl refuses them before anything is
built, and never creates, replaces or deletes a file through one (SECURITY.md, pfl/safe_files.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.federation.checkpoint import CHAIN_DIR, PENDING
from pfl.runner.outputs import RunFiles
from pfl.runner.rundir import LOCK, RunLock
from pfl.runner.wandb_identity import WandbIdentity
from pfl.runner.wandb_run import WandbRun
from pfl.safe_files import write_atomic
from tests.conftest import make_loop, tiny_config
from tests.helpers.cli_runs import fit

SECRET = "export PATH=/usr/bin\n"


@pytest.fixture
def copied(tmp_path, finished) -> Path:
    """A copy of the finished run, as if copied from a cluster, next to an unrelated file."""
    shutil.copytree(finished, tmp_path / "run")
    (tmp_path / "bashrc").write_text(SECRET)
    return tmp_path / "run"


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("name", ["config.yaml.tmp", LOCK, PENDING, "metrics.csv", "summary.json"])
def test_a_resume_refuses_a_planted_link_and_never_writes_through_it(copied, capsys, name):
    (copied / name).unlink(missing_ok=True)
    (copied / name).symlink_to(copied.parent / "bashrc")
    before = {p.name: p.stat().st_mtime_ns for p in copied.iterdir() if not p.is_symlink()}
    assert main(["fit", "--resume", str(copied), "--trainer.rounds", "3"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"--resume: {copied / name} is a symbolic link" in line and "remove the link" in line
    assert (copied.parent / "bashrc").read_text() == SECRET
    assert {p.name: p.stat().st_mtime_ns for p in copied.iterdir() if not p.is_symlink()} == before  # no training


def test_a_chain_folder_linked_elsewhere_is_refused_and_that_folder_kept(copied, capsys):
    other = copied.parent / "other"
    shutil.move(copied / CHAIN_DIR, other)
    (other / "notes.txt").write_text("unrelated")
    (copied / CHAIN_DIR).symlink_to(other, target_is_directory=True)
    kept = sorted(p.name for p in other.iterdir())
    assert main(["fit", "--resume", str(copied), "--trainer.rounds", "4"]) == 2
    assert f"{copied / CHAIN_DIR} is a symbolic link" in one_line(capsys.readouterr().err)
    assert sorted(p.name for p in other.iterdir()) == kept


def test_the_checkpoint_writer_refuses_a_linked_chain_folder_itself(tmp_path):
    """Without the run-folder check (the loop used as a library): the writer still never deletes
    through the link."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("unrelated")
    run = tmp_path / "run"
    run.mkdir()
    (run / CHAIN_DIR).symlink_to(other, target_is_directory=True)
    loop = make_loop(tiny_config(trainer={"rounds": 1, "checkpoint_every": 1}), run_dir=run)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        loop.fit()
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_a_new_run_refuses_a_folder_holding_only_a_linked_lock(tmp_path, capsys):
    (tmp_path / "bashrc").write_text(SECRET)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / LOCK).symlink_to(tmp_path / "bashrc")
    assert fit(tmp_path, "x") == 2
    assert f"tracking.name: {tmp_path / 'x' / LOCK} is a symbolic link" in one_line(capsys.readouterr().err)
    assert (tmp_path / "bashrc").read_text() == SECRET


def test_the_lock_and_the_file_writers_never_follow_a_link(tmp_path):
    """The same refusals at the point of writing (a link planted after the checks)."""
    target = tmp_path / "target"
    target.write_text(SECRET)
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).symlink_to(target)
    with pytest.raises(ConfigError, match="run.lock is a symbolic link"):
        RunLock(run).try_acquire()
    (run / "config.yaml.tmp").symlink_to(target)
    with pytest.raises(ConfigError, match="config.yaml.tmp is a symbolic link"):
        RunFiles(run).write_config("seed: 0\n")
    (run / "metrics.csv.tmp").symlink_to(target)
    with pytest.raises(ConfigError, match="metrics.csv.tmp is a symbolic link"):
        RunFiles(run).write_metrics([{"round": 1}])
    assert target.read_text() == SECRET and not (run / "config.yaml").exists()
    (run / "summary.json").symlink_to(target)  # a link at the destination is replaced, not written through
    write_atomic(run / "summary.json", "{}")
    assert target.read_text() == SECRET and not (run / "summary.json").is_symlink()


def test_a_run_folder_that_is_itself_a_link_keeps_working(tmp_path):
    (tmp_path / "disk").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r").symlink_to(tmp_path / "disk", target_is_directory=True)
    assert fit(tmp_path / "runs", "r", "--trainer.rounds", "1") == 0
    assert main(["fit", "--resume", str(tmp_path / "runs" / "r"), "--trainer.rounds", "2"]) == 0
    assert json.loads((tmp_path / "disk" / "summary.json").read_text())["rounds"] == 2


def test_wandb_never_deletes_through_a_linked_offline_folder(tmp_path):
    """Resume drops the superseded offline folders of its W&B id: a link among them is removed
    itself, never the folder it points to (rmtree on it used to raise)."""
    run_id = "r-0123abcd"
    wandb_dir = tmp_path / "run" / "wandb"
    current = wandb_dir / f"offline-run-20260102_000000-{run_id}"
    current.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (wandb_dir / f"offline-run-20260101_000000-{run_id}").symlink_to(elsewhere, target_is_directory=True)
    old = wandb_dir / f"offline-run-20260101_000001-{run_id}"
    old.mkdir()
    callback = WandbRun(WandbIdentity(run_id, "r", "p", "g"), tmp_path / "run", {})
    callback.run = SimpleNamespace(settings=SimpleNamespace(sync_dir=str(current)))
    callback._drop_superseded_offline_runs()
    assert sorted(p.name for p in wandb_dir.iterdir()) == [current.name]
    assert (elsewhere / "keep.txt").read_text() == "mine"


def test_a_stale_regular_temp_file_is_replaced(tmp_path):
    (tmp_path / "config.yaml.tmp").write_text("half a config from a killed run")
    RunFiles(tmp_path).write_config("seed: 1\n")
    assert (tmp_path / "config.yaml").read_text() == "seed: 1\n" and not (tmp_path / "config.yaml.tmp").exists()
    assert os.listdir(tmp_path) == ["config.yaml"]


def test_the_folder_of_replaced_runs_is_not_a_run_name(tmp_path, capsys):
    assert fit(tmp_path, "a", "--trainer.rounds", "1") == 0
    assert fit(tmp_path, "a", "--trainer.rounds", "1", "--tracking.overwrite", "true") == 0
    kept = sorted(p.name for p in (tmp_path / "_replaced").iterdir())
    capsys.readouterr()
    for name in ("_replaced", "_replaced/b"):
        assert fit(tmp_path, name, "--tracking.overwrite", "true") == 2
        line = one_line(capsys.readouterr().err)
        assert f"tracking.name: '{name}' lies in _replaced/, where --tracking.overwrite keeps" in line
    assert sorted(p.name for p in (tmp_path / "_replaced").iterdir()) == kept  # no stray run.lock


def test_a_finished_run_on_read_only_storage_still_shows_its_results(copied, capsys, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != copied and real(path, mode, **kw))
    assert main(["fit", "--resume", str(copied)]) == 0
    assert "already finished its 2 rounds; nothing to do" in capsys.readouterr().out
    assert main(["fit", "--resume", str(copied), "--trainer.rounds", "3"]) == 2  # more rounds must write
    assert f"--resume: {copied} is not writable by this user" in one_line(capsys.readouterr().err)


def test_a_run_lock_that_is_a_hard_link_to_an_outside_file_is_refused_and_that_file_kept(copied, capsys):
    outside = copied.parent / "bashrc"
    (copied / LOCK).unlink(missing_ok=True)
    os.link(outside, copied / LOCK)
    before = {p.name: p.stat().st_mtime_ns for p in copied.iterdir()}
    assert main(["fit", "--resume", str(copied), "--trainer.rounds", "3"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{copied / LOCK} is a hard link (2 names for one file)" in line and "delete it" in line
    assert outside.read_text() == SECRET and outside.stat().st_nlink == 2
    assert {p.name: p.stat().st_mtime_ns for p in copied.iterdir()} == before  # no training
    (copied / LOCK).unlink()
    assert main(["fit", "--resume", str(copied), "--trainer.rounds", "3", "--trainer.progress", "false"]) == 0
    assert outside.read_text() == SECRET and (copied / LOCK).stat().st_nlink == 1
