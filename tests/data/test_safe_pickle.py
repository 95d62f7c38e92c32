"""The restricted unpickler is memory safe: hostile pickles built only from admitted globals, and
thousands of mutated valid ones, are refused with a one-line error or load as plain data; never a
crash, a hang or a process-wide change. Each runs in a child process (tests/data/pickle_cases.py), so a
segfault is a failed test with its exit status, not a dead test run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pfl.data.disk import load_standard
from tests.data.pickle_cases import FALSE, PAYLOADS, glob, num, tup
from tests.helpers.cli_runs import child_env

ROOT = Path(__file__).resolve().parents[2]
FUZZ_CASES = 10_000

# what each payload asks for, as the refusal names it
REFUSAL = {
    "object_scalar": "a scalar with dtype object from raw bytes",
    "object_field": "a dtype state with a subarray, fields or metadata",
    "object_array_bytes": "an object array (1,) without its items",
    "rename_functions": "BUILD (__setstate__) on numpy._core.numeric._frombuffer",
    "uninitialised_array": "calling numpy.ndarray",
    "short_array": "array float64 (1000,) needs 8000 bytes of data",
    "inst": "opcode b'i'",
}


def child(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = child_env()
    script = str(Path(__file__).with_name("pickle_cases.py"))
    return subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def payload_run() -> tuple[int, dict[str, str], str]:
    """All payloads, in order, in one child process: its exit status, each verdict, and its stderr."""
    out = child("payloads", timeout=120)
    lines = out.stdout.splitlines()
    verdicts = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines if line.split(" ", 1)[0] in PAYLOADS}
    names = lines[-1] if len(lines) > len(PAYLOADS) else ""
    return out.returncode, verdicts, names + out.stderr[-800:]


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_hostile_payload_is_refused_in_one_line(payload_run, name):
    returncode, verdicts, rest = payload_run
    assert name in verdicts, f"the process died before this payload (exit {returncode}): {rest}"
    assert verdicts[name] == (
        f"REFUSED data.root: {name} holds a pickle that asks for {REFUSAL[name]}, which is not plain data; "
        "pfl refuses it (use a file written by the original tool, or re-export it from a trusted copy)"
    )


def test_payloads_leave_the_process_unchanged(payload_run):
    """BUILD on an admitted function used to rename it (and numpy's own _frombuffer) for the rest of the process."""
    returncode, _, rest = payload_run
    assert returncode == 0, f"a payload crashed the process (exit {returncode}): {rest}"
    assert "hijacked" not in rest, rest


def test_mutated_pickles_load_or_are_refused_never_crash_or_hang():
    """Bit flips, opcode bytes, truncations, span swaps, splices and dangerous descriptor/flag swaps
    of valid PFLlib, CIFAR and mixed pickles (protocols 2-5) and of the payloads above."""
    start = time.perf_counter()
    out = child("fuzz", str(FUZZ_CASES), "0", timeout=240)
    assert out.returncode == 0, f"a mutated pickle crashed the process (exit {out.returncode}): {out.stderr[-800:]}"
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["n_bad"] == 0, summary["bad"]
    assert summary["LOADED"] + summary["REFUSED"] == FUZZ_CASES and summary["LOADED"] > 100
    assert summary["slowest"] < 2.0, f"one case took {summary['slowest']:.1f} s"
    print(f"{FUZZ_CASES} cases in {summary['seconds']:.1f} s ({time.perf_counter() - start:.1f} s with start-up)")


def py2_string(b: bytes) -> bytes:
    return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + len(b).to_bytes(4, "little") + b


def test_python2_cifar_batch_loads(tmp_path):
    """CIFAR's batches were written by Python 2: numpy.core names, str (bytes) descriptors, byte
    orders and raw data, with the dtype state numpy then wrote."""
    rows = np.arange(2 * 3072, dtype=np.uint64).astype(np.uint8).reshape(2, 3072)
    u1 = glob("numpy", "dtype") + tup(py2_string(b"u1"), num(0), num(1)) + b"R"
    u1 += tup(num(3), py2_string(b"|"), b"NNN", num(-1), num(-1), num(0)) + b"b"
    empty = (
        glob("numpy.core.multiarray", "_reconstruct")
        + tup(glob("numpy", "ndarray"), tup(num(0)), py2_string(b"b"))
        + b"R"
    )
    data = empty + tup(num(1), tup(num(2), num(3072)), u1, FALSE, py2_string(rows.tobytes())) + b"b"
    labels = b"](" + num(3) + num(7) + b"e"
    batch = b"\x80\x02}(" + py2_string(b"data") + data + py2_string(b"labels") + labels + b"u."
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(batch)
    x, y, classes, num_train = load_standard("cifar10", tmp_path, False, None)
    assert classes == 10 and num_train == 10 and list(y[:2]) == [3, 7]
    assert np.array_equal(x[0], rows[0].reshape(3, 32, 32).astype(np.float32) / 255.0)
