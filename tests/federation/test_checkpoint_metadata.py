"""A checkpoint from elsewhere may carry metadata pfl never writes, with its SHA-256 recomputed: chain
names that are paths, counts that are not counts, a round of -5. Such a file is refused in one line (the
previous checkpoint is used when it verifies) and nothing outside the chain folder is read, moved or
written. A resume after config.yaml was edited is refused in one line naming the field, before
anything is built."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pfl.cli import main
from pfl.federation.checkpoint import (
    CHAIN_DIR,
    CHECKPOINT,
    DIGEST,
    META,
    PLATFORM,
    PREVIOUS,
    CheckpointChain,
    MapDelta,
    UnreadableCheckpoint,
    chain_file,
    check_meta,
    check_values,
    content_digest,
    other_platform,
    read_checkpoint,
    recorded_settings,
)

PRECIOUS = b"a file of the user's, outside the run folder"


def rewrite(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change a checkpoint file's content and record the SHA-256 of the new content, as an attacker can."""
    state = torch.load(path, weights_only=True)
    state.pop(DIGEST)
    change(state)
    torch.save({**state, DIGEST: content_digest(state)}, path)


def resume(run: Path, rounds: int = 5) -> int:
    return main(["fit", "--resume", str(run), "--trainer.rounds", str(rounds), "--trainer.progress", "false"])


def file_digests(run: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*.pt"))}


@pytest.fixture
def copied(tmp_path, finished) -> Path:
    shutil.copytree(finished, tmp_path / "copy" / "r")
    return tmp_path / "copy" / "r"


@pytest.mark.parametrize("form", ["absolute", "relative"])
def test_chain_ids_that_name_paths_are_refused_and_the_outside_file_keeps_its_bytes(tmp_path, copied, capsys, form):
    victim = tmp_path / "outside" / "victim.pt"
    victim.parent.mkdir()
    victim.write_bytes(PRECIOUS)
    stem = str(victim)[: -len(".pt")]
    name = stem if form == "absolute" else os.path.relpath(stem, copied / CHAIN_DIR)
    # the previous link claims the id; the newest names it as its parent (what resume then moved there)
    rewrite(copied / PREVIOUS, lambda state: state[META].update(id=name))
    rewrite(copied / CHECKPOINT, lambda state: state[META].update(parent=name))
    capsys.readouterr()
    assert resume(copied) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: --resume: no readable checkpoint in {copied}") and "pfl never writes" in line
    assert repr(name) in line
    assert victim.read_bytes() == PRECIOUS
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.pt"]


def test_a_hostile_parent_in_the_newest_link_falls_back_to_the_previous_one(tmp_path, copied, capsys):
    rewrite(copied / CHECKPOINT, lambda state: state[META].update(parent="../../../../etc/passwd"))
    capsys.readouterr()
    assert resume(copied, 3) == 0
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert "'../../../../etc/passwd'" in warning and f"falling back to {copied / PREVIOUS}" in warning
    assert read_checkpoint(copied / CHECKPOINT)["round"] == 3


def good_meta(tmp_path: Path) -> dict[str, Any]:
    chain = CheckpointChain(tmp_path, segment_bytes=64)
    chain.save({"round": 1}, {"clients": MapDelta({k: {"w": torch.zeros(32)} for k in range(3)}.items())})
    chain.save({"round": 2}, {"clients": MapDelta([(k, {"w": torch.ones(32)}) for k in (0, 1)], removed=[2])})
    chain.wait()
    return read_checkpoint(tmp_path / CHECKPOINT)[META]


BAD_META: dict[str, Callable[[dict[str, Any]], None]] = {
    "absolute id": lambda m: m.update(id="/tmp/x"),
    "id with ..": lambda m: m.update(id="../000000002-0a0b0c0d"),
    "id not hex": lambda m: m.update(id="000000002-0a0b0c0z"),
    "id too short": lambda m: m.update(id="00000002-0a0b0c0d"),
    "id not a string": lambda m: m.update(id=2),
    "parent a path": lambda m: m.update(parent="../../x"),
    "parent with a suffix": lambda m: m.update(parent=m["parent"] + "/x"),
    "segment a path": lambda m: m["maps"]["clients"].update(segments=["../../../x.pt"]),
    "segment of another link": lambda m: m["maps"]["clients"].update(segments=[f"{m['parent']}.clients.0.pt"]),
    "segment with a slash": lambda m: m["maps"]["clients"].update(segments=[f"{m['id']}.clients/0.pt"]),
    "segments not a list": lambda m: m["maps"]["clients"].update(segments="x"),
    "removed not counts": lambda m: m["maps"]["clients"].update(removed=["2"]),
    "negative depth": lambda m: m.update(depth=-1),
    "depth a string": lambda m: m.update(depth="1"),
    "depth a bool": lambda m: m.update(depth=True),
    "base_bytes missing": lambda m: m.pop("base_bytes"),
    "list start negative": lambda m: m.update(lists={"history": -1}),
    "maps not a dict": lambda m: m.update(maps=[]),
}


def test_chain_metadata_of_the_form_pfl_writes_passes(tmp_path):
    meta = good_meta(tmp_path)
    assert meta["maps"]["clients"]["segments"]  # the check below sees real segment names
    check_meta(meta)
    assert chain_file(tmp_path, f"{meta['id']}.pt") == tmp_path / f"{meta['id']}.pt"


@pytest.mark.parametrize("change", list(BAD_META.values()), ids=list(BAD_META))
def test_chain_metadata_of_another_form_is_refused(tmp_path, change):
    meta = good_meta(tmp_path)
    change(meta)
    with pytest.raises(UnreadableCheckpoint, match="pfl never writes"):
        check_meta(meta)


@pytest.mark.parametrize("name", ["/etc/passwd", "../x.pt", "000000001-0a0b0c0d.pt/../../x.pt", "x.pt", ""])
def test_chain_file_names_of_another_form_never_become_paths(tmp_path, name):
    with pytest.raises(UnreadableCheckpoint, match="pfl never writes"):
        chain_file(tmp_path, name)


def test_a_segment_named_outside_the_chain_folder_is_never_read(tmp_path):
    """A link naming a segment outside the folder falls back to the previous link, which verifies."""
    run = tmp_path / "run"
    meta = good_meta(run)
    outside = tmp_path / "elsewhere.pt"
    torch.save({0: {"w": torch.full((32,), 7.0)}}, outside)
    rewrite(run / CHECKPOINT, lambda state: state[META]["maps"]["clients"].update(segments=["../../elsewhere.pt"]))
    checkpoint = CheckpointChain(run).load()
    assert checkpoint is not None and checkpoint.meta["id"] == meta["parent"]


# -- restored values ----------------------------------------------------------------------------------
def two_links(run: Path) -> None:
    chain = CheckpointChain(run)
    for k in (1, 2):
        chain.save({"round": k, "server": {"w": torch.full((3,), float(k))}, "train_samples": 10 * k,
                    "train_seconds": 0.5 * k})  # fmt: skip
    chain.wait()


BAD_VALUES: dict[str, Callable[[dict[str, Any]], None]] = {
    "no round": lambda v: v.pop("round"),
    "no server": lambda v: v.pop("server"),
    "round 'x'": lambda v: v.update(round="x"),
    "round -5": lambda v: v.update(round=-5),
    "round 2.0": lambda v: v.update(round=2.0),
    "round True": lambda v: v.update(round=True),
    "train_samples -1": lambda v: v.update(train_samples=-1),
    "train_seconds 'x'": lambda v: v.update(train_seconds="x"),
}


@pytest.mark.parametrize("change", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_restored_values_of_another_form_fall_back_to_the_previous_checkpoint(tmp_path, capsys, change):
    two_links(tmp_path)
    rewrite(tmp_path / CHECKPOINT, change)
    checkpoint = CheckpointChain(tmp_path).load(check=check_values)
    assert checkpoint is not None and checkpoint.values["round"] == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"warning: checkpoint {tmp_path / CHECKPOINT} is unreadable (it")
    assert f"falling back to {tmp_path / PREVIOUS}" in line


def test_a_checkpoint_with_round_x_and_no_fallback_is_one_line(copied, capsys):
    for name in (CHECKPOINT, PREVIOUS):
        rewrite(copied / name, lambda state: state.update(round="x"))
    capsys.readouterr()
    assert resume(copied) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: --resume: no readable checkpoint") and "its round is 'x'" in lines[-1]


def test_a_checkpoint_with_a_negative_round_resumes_from_the_previous_one(copied, capsys):
    rewrite(copied / CHECKPOINT, lambda state: state.update(round=-5))
    capsys.readouterr()
    assert resume(copied, 3) == 0
    assert "its round is -5" in capsys.readouterr().err
    rounds = [line.split(",")[0] for line in (copied / "metrics.csv").read_text().splitlines()[1:]]
    assert rounds == ["1", "2", "3"]  # in order: round 2 redone from the round-1 checkpoint


# -- an edited config.yaml ----------------------------------------------------------------------------
def test_a_resume_after_config_yaml_was_edited_names_the_field_before_building_anything(copied, capsys):
    assert recorded_settings(copied)["model.hidden"] == [16]
    config = copied / "config.yaml"
    text = config.read_text()
    assert "- 16\n" in text
    config.write_text(text.replace("- 16\n", "- 32\n"))
    before = file_digests(copied)
    capsys.readouterr()
    assert resume(copied) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --resume: {config} sets model.hidden to [32] but its checkpoint was written with")
    assert "[16]" in line and "put model.hidden back to [16] in config.yaml" in line
    assert file_digests(copied) == before
    config.write_text(text)
    assert resume(copied, 3) == 0  # restored: the run goes on


def test_settings_a_resume_may_change_are_not_compared(copied):
    settings = recorded_settings(copied)
    assert "trainer.rounds" not in settings and "tracking.root" not in settings and "data.root" not in settings
    assert settings["seed"] == 0 and settings["method.name"] == "fedavg"


def test_settings_are_compared_where_both_sides_know_them(tmp_path):
    from pfl.errors import ConfigError
    from pfl.runner.plan import check_recorded_settings

    CheckpointChain(tmp_path).save({"round": 1, "settings": {"a": 1, "b": [2], "c": "x", "gone": 0}})
    check_recorded_settings(tmp_path, {"a": 1, "b": [2], "c": "x", "added": 5})  # another version's options
    with pytest.raises(ConfigError) as err:
        check_recorded_settings(tmp_path, {"a": 2, "b": [3], "c": "x"})
    assert err.value.field == "--resume"
    assert f"{tmp_path / 'config.yaml'} sets a to 2 but its checkpoint was written with 1 (and 1 more: b)" in str(
        err.value
    )
    check_recorded_settings(tmp_path / "none", {"a": 2})  # no checkpoint records settings: nothing to compare


# -- the platform -------------------------------------------------------------------------------------
def test_a_resume_on_another_platform_says_so_in_one_line_and_on_the_same_one_says_nothing(copied, capsys):
    recorded = read_checkpoint(copied / CHECKPOINT)[PLATFORM]
    assert recorded["cpu_kernels"] and recorded["torch"] == torch.__version__  # every link records it
    capsys.readouterr()
    assert resume(copied, 4) == 0
    assert "warning" not in capsys.readouterr().err  # the same platform
    other = {**recorded, "cpu": "Intel Xeon", "cpu_kernels": "AVX512"}
    rewrite(copied / CHECKPOINT, lambda state: state.update({PLATFORM: other}))
    assert resume(copied, 5) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning")]
    assert line.startswith("warning: this run's checkpoint was written on torch ")
    assert "Intel Xeon (AVX512 kernels" in line and "its rounds from here can differ" in line
    assert read_checkpoint(copied / CHECKPOINT)[PLATFORM] == recorded  # the new links record this one's


def test_only_a_recorded_platform_that_differs_is_said():
    here = {"torch": "2.14.1", "cpu": "AMD EPYC", "cpu_kernels": "AVX2", "threads": 1}
    assert other_platform(None, here) is None  # a checkpoint of an earlier pfl records none
    assert other_platform(dict(here), here) is None
    note = other_platform({**here, "threads": 2}, here)
    assert note is not None and note.startswith(
        "this run's checkpoint was written on torch 2.14.1, AMD EPYC (AVX2 kernels, 2 threads) and the run "
        "continues on torch 2.14.1, AMD EPYC (AVX2 kernels, 1 thread): "
    )
