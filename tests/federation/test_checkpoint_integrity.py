"""Checkpoints whose bytes changed after they were written (memory-mapped loading skips the zip
checksums) are detected by the SHA-256 each file records, and the previous checkpoint is used; a
disk that fills up while checkpointing is one line, and both checkpoints survive."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from bench.checkpoint_fuzz import OUTCOMES, small_run, sweep
from pfl.cli import main
from pfl.errors import ConfigError
from pfl.federation.checkpoint import (
    CHAIN_DIR,
    CHECKPOINT,
    DIGEST,
    PENDING,
    PREVIOUS,
    CheckpointChain,
    MapDelta,
    UnreadableCheckpoint,
    content_digest,
    load_checkpoint,
    read_checkpoint,
)
from pfl.federation.loop import comparable_metrics

ARGS = [
    "--data.num_clients", "4", "--model.hidden", "[64]", "--trainer.eval_every", "1", "--trainer.checkpoint_every", "1",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def resume(run: Path, rounds: int = 3) -> int:
    return main(["fit", "--resume", str(run), "--trainer.rounds", str(rounds), "--trainer.progress", "false"])


def digests(run: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (run / CHECKPOINT, run / PREVIOUS)}


def largest_tensor_offset(path: Path) -> tuple[int, int]:
    """(file offset, size) of the largest tensor record in a torch zip archive."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round run (checkpoint.pt: round 2, checkpoint.prev.pt: round 1)."""
    root = tmp_path_factory.mktemp("integrity")
    assert main(["fit", *ARGS, "--trainer.rounds", "2", "--tracking.root", str(root), "--tracking.name", "r"]) == 0
    return root / "r"


@pytest.fixture(scope="module")
def uninterrupted(finished, tmp_path_factory) -> dict:
    """The finished run continued to round 3 from its intact checkpoint."""
    run = tmp_path_factory.mktemp("reference") / "r"
    shutil.copytree(finished, run)
    assert resume(run) == 0
    return json.loads((run / "summary.json").read_text())


def damage_flip(path: Path) -> None:
    offset, size = largest_tensor_offset(path)
    with open(path, "r+b") as fh:
        fh.seek(offset + size // 2)
        byte = fh.read(1)
        fh.seek(offset + size // 2)
        fh.write(bytes([byte[0] ^ 0x01]))  # the lowest bit of one byte: silently different numbers before


def damage_random(path: Path) -> None:
    offset, size = largest_tensor_offset(path)
    assert size >= 4096
    noise = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    with open(path, "r+b") as fh:
        fh.seek(offset + (size - 4096) // 2)
        fh.write(noise.numpy().tobytes())


@pytest.mark.parametrize("damage", [damage_flip, damage_random], ids=["one_flipped_bit", "4kb_random"])
def test_altered_checkpoint_falls_back_to_the_previous_one_and_ends_identical(
    tmp_path, finished, uninterrupted, capsys, damage
):
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    damage(run / CHECKPOINT)
    assert resume(run) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: checkpoint {run / CHECKPOINT} is unreadable (its content differs from the SHA-256 recorded "
        f"when it was written); falling back to {run / PREVIOUS}"
    ]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == 3
    assert comparable_metrics(summary) == comparable_metrics(uninterrupted)  # bit-identical numbers


def flip_first(path: Path, needle: bytes, at: int = 1) -> None:
    """Flip one byte (``at``) of the first occurrence of ``needle`` in the file."""
    data = bytearray(path.read_bytes())
    where = data.index(needle) + at
    data[where] ^= 0x01
    path.write_bytes(bytes(data))


def resumed_warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]


def test_a_renamed_digest_key_leaves_the_file_unverified_and_the_previous_one_is_used(
    tmp_path, finished, uninterrupted, capsys
):
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    flip_first(run / CHECKPOINT, DIGEST.encode())  # "_sha256" -> "_rha256": no digest any more ...
    damage_flip(run / CHECKPOINT)  # ... and different numbers, which nothing else would notice
    assert "_rha256" in read_checkpoint(run / CHECKPOINT, mmap=True)  # the digest is just another key now
    assert resume(run) == 0
    assert resumed_warnings(capsys) == [
        f"warning: checkpoint {run / CHECKPOINT} is unverified (it or its chain records no SHA-256 ({DIGEST})); "
        f"falling back to {run / PREVIOUS}"
    ]
    assert comparable_metrics(json.loads((run / "summary.json").read_text())) == comparable_metrics(uninterrupted)


def test_a_damaged_type_name_falls_back_to_the_previous_checkpoint(tmp_path, finished, uninterrupted, capsys):
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    flip_first(run / CHECKPOINT, b"_rebuild_tensor_v2", at=4)  # reads as an unknown global: "not plain tensors"
    assert resume(run) == 0
    (warning,) = resumed_warnings(capsys)
    assert "not plain tensors/containers" in warning and f"falling back to {run / PREVIOUS}" in warning
    assert comparable_metrics(json.loads((run / "summary.json").read_text())) == comparable_metrics(uninterrupted)


def test_unverified_files_are_used_only_when_no_checkpoint_verifies(tmp_path, capsys):
    chain = CheckpointChain(tmp_path)
    for k in (1, 2):
        chain.save({"round": k, "server": torch.full((2,), float(k))})
    chain.wait()
    for name in (CHECKPOINT, PREVIOUS):  # as written by an earlier version of pfl: no digest
        state = torch.load(tmp_path / name, weights_only=True)
        torch.save({k: v for k, v in state.items() if k != DIGEST}, tmp_path / name)
    assert CheckpointChain(tmp_path).load().values["round"] == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == f"warning: no checkpoint of {tmp_path} verifies; using {tmp_path / CHECKPOINT} unverified"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (torch.zeros(4, dtype=torch.float32), torch.zeros(4, dtype=torch.int32)),  # same bytes, other dtype
        (torch.zeros(4), torch.zeros(2, 2)),
        ([1, 2], (1, 2)),
        ({"w": [1.0]}, {"w": (1.0,)}),
        (1, 1.0),
        (1, True),
        ("1", 1),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ([[1], 2], [[1, 2]]),
    ],
)
def test_the_digest_covers_dtypes_shapes_and_container_types(a, b):
    assert content_digest(a) != content_digest(b)
    assert content_digest(a) == content_digest(a)


def test_a_sample_of_flipped_bytes_never_changes_what_is_resumed(tmp_path):
    """Offsets of a small checkpoint, one byte flipped at a time: the digest key's name, every type
    name's bytes, and a spread over the whole file (``python -m bench.checkpoint_fuzz`` sweeps all)."""
    run = small_run(tmp_path)
    data = (run / CHECKPOINT).read_bytes()
    named = [data.index(DIGEST.encode()) + k for k in range(len(DIGEST))]
    for needle in (b"_rebuild_tensor_v2", b"FloatStorage", b"collections", b"OrderedDict"):
        start = data.find(needle)
        if start >= 0:
            named += range(start, start + len(needle))
    offsets = sorted(set(named) | set(range(0, len(data), 89)))
    row = sweep(run, offsets)
    assert row["failures"] == {} and sum(row[k] for k in OUTCOMES) == len(offsets)
    assert row["fallback"] >= len(named) // 2  # most of these are caught, not harmless


@pytest.mark.slow
def test_every_flipped_byte_of_a_small_checkpoint_is_caught_or_harmless(tmp_path):
    """The acceptance sweep (a few minutes): every offset of the small checkpoint, one at a time."""
    run = small_run(tmp_path)
    row = sweep(run, range((run / CHECKPOINT).stat().st_size))
    assert row["failures"] == {} and row["silent_difference"] == row["refused"] == row["crash"] == 0
    assert row["same"] + row["fallback"] == row["bytes"]


def test_an_altered_chain_segment_is_detected_before_it_is_used(tmp_path):
    chain = CheckpointChain(tmp_path, segment_bytes=64)
    states = {cid: {"w": torch.full((32,), float(cid))} for cid in range(4)}
    chain.save({"round": 1}, {"clients": MapDelta(states.items())})
    chain.save({"round": 2}, {"clients": MapDelta([(0, {"w": torch.zeros(32)})])})
    chain.wait()
    (segment, *_) = sorted((tmp_path / CHAIN_DIR).glob("*.clients.*.pt"))
    offset, size = largest_tensor_offset(segment)
    data = bytearray(segment.read_bytes())
    data[offset] ^= 0x40
    segment.write_bytes(bytes(data))
    with pytest.raises(UnreadableCheckpoint, match="differs from the SHA-256"):
        read_checkpoint(segment, mmap=True)
    # both links need the base's segments: nothing readable is left, said in one error
    with pytest.raises(ConfigError, match="no readable checkpoint"):
        load_checkpoint(tmp_path)


def test_the_recorded_digest_is_not_part_of_the_content(tmp_path):
    chain = CheckpointChain(tmp_path)
    chain.save({"round": 1, "server": {"w": torch.arange(5.0)}})
    state = read_checkpoint(tmp_path / CHECKPOINT)
    assert "_sha256" not in state and torch.equal(state["server"]["w"], torch.arange(5.0))


class FullDisk:
    """A file that accepts ``room`` bytes, then fails as a full disk does."""

    def __init__(self, fh, room: int):
        self.fh, self.room = fh, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def test_a_full_disk_while_checkpointing_is_one_line_and_both_checkpoints_survive(
    tmp_path, finished, uninterrupted, capsys, monkeypatch
):
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    before = digests(run)
    save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, fh, *a, **k: save(obj, FullDisk(fh, 2000), *a, **k))
    assert resume(run) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: tracking.root: no space left on the device while writing {run / PENDING} (free space there, "
        f"then continue with --resume {run}; its last checkpoints are intact)"
    )
    assert digests(run) == before and not (run / PENDING).exists()
    monkeypatch.setattr(torch, "save", save)
    assert resume(run) == 0  # continues exactly where the full disk stopped it
    assert comparable_metrics(json.loads((run / "summary.json").read_text())) == comparable_metrics(uninterrupted)
