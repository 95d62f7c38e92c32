"""Hostile and mutated pickles for the restricted unpickler, run in a child process so that a crash
(a segfault from numpy reading file bytes as pointers) is an exit status, not a dead test run.

``python tests/data/pickle_cases.py payloads`` loads each handwritten payload and prints one line each,
``NAME REFUSED <message>`` or ``NAME LOADED <digest>``, then the names of the functions BUILD could rename;
``python tests/data/pickle_cases.py fuzz CASES SEED`` mutates valid pickles CASES times and prints a JSON
summary: every case must load or be refused with a one-line ConfigError naming the file.
"""

from __future__ import annotations

import json
import pickle
import random
import sys
import time
from typing import Any

import numpy as np

MA = "numpy._core.multiarray"
NONE, FALSE, TRUE = b"N", b"\x89", b"\x88"


# -- handwritten opcodes (protocol 3) ---------------------------------------------------------------
def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(s: str) -> bytes:
    return b"X" + len(s.encode()).to_bytes(4, "little") + s.encode()


def raw(b: bytes) -> bytes:
    return b"C" + bytes([len(b)]) + b


def num(n: int) -> bytes:
    return b"J" + n.to_bytes(4, "little", signed=True)


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def dct(**items: bytes) -> bytes:
    return b"}(" + b"".join(text(k) + v for k, v in items.items()) + b"u"


def dtype(
    descr: str, flags: int = 0, names: bytes = NONE, fields: bytes = NONE, size: int = -1, align: int = -1
) -> bytes:
    """``numpy.dtype(descr, False, True)`` then BUILD with a state the file chooses."""
    state = tup(num(3), text("|"), NONE, names, fields, num(size), num(align), num(flags))
    return glob("numpy", "dtype") + tup(text(descr), FALSE, TRUE) + b"R" + state + b"b"


def array(dt: bytes, shape: tuple[int, ...], data: bytes) -> bytes:
    """numpy's own array pickle: ``_reconstruct(ndarray, (0,), b'b')`` then BUILD (1, shape, dtype, False, data)."""
    empty = glob(MA, "_reconstruct") + tup(glob("numpy", "ndarray"), tup(num(0)), raw(b"b")) + b"R"
    return empty + tup(num(1), tup(*map(num, shape)), dt, FALSE, raw(data)) + b"b"


def program(body: bytes) -> bytes:
    return b"\x80\x03" + body + b"."


RENAME = tup(NONE, dct(__name__=text("hijacked"), __qualname__=text("hijacked"))) + b"b0"
PAYLOADS = {  # the ones that crashed the process last, so that one run shows every other verdict
    # BUILD on the admitted functions themselves: renames them for the rest of the process
    "rename_functions": program(
        glob("numpy._core.numeric", "_frombuffer")
        + RENAME
        + glob("numpy", "dtype")
        + RENAME
        + glob("_codecs", "encode")
        + RENAME
        + NONE
    ),
    # numpy.ndarray called directly: an array of uninitialised process memory
    "uninitialised_array": program(glob("numpy", "ndarray") + tup(tup(num(4096)), text("f8")) + b"R"),
    # an array whose data is shorter than its shape needs
    "short_array": program(array(dtype("f8"), (1000,), b"\0" * 8)),
    # a class instantiated by INST (not data even when the class is an admitted name)
    "inst": b"\x80\x02(" + b"inumpy\nndarray\n" + b".",
    # an object array from raw bytes rather than a list of items
    "object_array_bytes": program(array(dtype("O8", flags=0), (1,), b"A" * 8)),
    # a float dtype (it passes a kind check) given an object field by BUILD, then raw bytes under it
    "object_field": program(
        array(
            dtype("f8", names=tup(text("a")), fields=dct(a=tup(dtype("O8", flags=63), num(0))), size=8, align=1),
            (1,),
            b"A" * 8,
        )
    ),
    # dtype('O8') with its flags cleared by BUILD, then eight file bytes as an object pointer
    "object_scalar": program(glob(MA, "scalar") + tup(dtype("O8", flags=0), raw(b"A" * 8)) + b"R"),
}


def admitted_names() -> dict[str, str | None]:
    """The names of what the unpickler resolves its admitted globals to, and of numpy's functions."""
    import numpy._core.numeric as numeric

    from pfl.data.safe_pickle import ALLOWED

    names = {f"{m}.{n}": getattr(resolved, "__name__", None) for (m, n), resolved in ALLOWED.items()}
    names["numpy._core.numeric._frombuffer (numpy's)"] = numeric._frombuffer.__name__
    return names


def load(blob: bytes, name: str, encoding: str = "ASCII") -> tuple[str, Any]:
    from pfl.data.safe_pickle import restricted_load
    from pfl.errors import ConfigError

    try:
        return "LOADED", restricted_load(blob, name, encoding=encoding)
    except ConfigError as err:
        return "REFUSED", str(err)


def run_payloads() -> None:
    """One line per payload (``NAME REFUSED message`` or ``NAME LOADED ...``), then the names."""
    for name, blob in PAYLOADS.items():
        outcome, value = load(blob, name)
        print(name, outcome, value if outcome == "REFUSED" else touch(value), flush=True)
    print(json.dumps(admitted_names()), flush=True)


# -- fuzzing ----------------------------------------------------------------------------------------
def corpus() -> list[tuple[bytes, str]]:
    """Valid pickles of every shape the two formats take, each with the encoding it is read with."""
    rng = np.random.default_rng(0)
    x, y = rng.random((3, 1, 2, 2)).astype(np.float32), rng.integers(0, 10, 3)
    npz = np.empty((), dtype=object)
    npz[()] = {"x": x, "y": y}
    cifar = {
        b"data": rng.integers(0, 255, (2, 12), dtype=np.uint8),
        b"labels": [0, 1],
        b"filenames": [b"a.png", b"b.png"],
    }
    mixed = {
        "f": np.arange(6.0).reshape(2, 3).T,  # Fortran order (protocol 5: order F)
        "k": np.arange(24, dtype=np.int16).reshape(2, 3, 4).transpose(1, 0, 2),  # neither C nor F
        "be": np.arange(3, dtype=">f4"),
        "s": np.float32(2.5),
        "i": np.int64(-3),
        "c": np.complex64(1 + 2j),
        "b": np.array([True, False]),
        "o": np.array([1, "a", None], dtype=object),
        "t": (1, 2.0, "x", b"y", None, True),
    }
    out = []
    for proto in (2, 3, 4, 5):
        out.append((pickle.dumps(npz, protocol=proto), "latin1"))
        out.append((pickle.dumps(mixed, protocol=proto), "ASCII"))
    out.append((pickle.dumps(cifar, protocol=2).replace(b"cnumpy._core.", b"cnumpy.core."), "bytes"))
    return out + [(p, "ASCII") for p in PAYLOADS.values()]


OPCODES = list(b"(.0123FGIJKLMNPQSTUVX]}abcdeghijlopqrstu")  # and those of protocols 2-5:
OPCODES += list(b"\x80\x81\x82\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8e\x8f\x90\x91\x92\x93\x94\x95\x96\x97\x98")
SWAPS = [
    (b"f8", b"O8"),
    (b"f4", b"O8"),
    (b"u1", b"O8"),
    (b"O8", b"f8"),
    (b"K\x00t", b"K?t"),
    (b"K?t", b"K\x00t"),
    (b"|", b">"),
    (b"<", b"|"),
]


def mutate(blob: bytes, rng: random.Random, donors: list[bytes]) -> bytes:
    b = bytearray(blob)
    kind = rng.randrange(7)
    if kind == 0:  # bit flips
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # an opcode byte swapped in
        b[rng.randrange(len(b))] = rng.choice(OPCODES)
    elif kind == 2:  # truncation
        del b[rng.randrange(len(b)) :]
    elif kind == 3:  # a span deleted or duplicated
        i, j = sorted(rng.randrange(len(b) + 1) for _ in range(2))
        b[i:j] = b"" if rng.random() < 0.5 else b[i:j] * 2
    elif kind == 4:  # two spans exchanged
        i, j, k = sorted(rng.randrange(len(b) + 1) for _ in range(3))
        b = b[:i] + b[j:k] + b[i:j] + b[k:]
    elif kind == 5:  # a piece of another pickle spliced in
        donor = rng.choice(donors)
        i, j = sorted(rng.randrange(len(donor) + 1) for _ in range(2))
        at = rng.randrange(len(b) + 1)
        b[at:at] = donor[i:j]
    else:  # a dtype descriptor, flag or byte order exchanged for a dangerous one
        old, new = rng.choice(SWAPS)
        b = bytearray(bytes(b).replace(old, new, rng.randint(1, 3)))
    return bytes(b)


def touch(value: Any) -> str:
    """Read every byte and item of what was loaded (a bad pointer crashes here); returns a digest."""
    seen: set[int] = set()
    stack, parts = [value], 0
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        parts += 1
        if isinstance(v, np.ndarray):  # items, not bytes: a dtype stripped of its object flag hides pointers
            stack.extend(v.ravel().tolist())
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        else:
            repr(v)
    return f"{type(value).__name__} with {parts} parts"


def fuzz(cases: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    seeds = corpus()
    donors = [blob for blob, _ in seeds]
    for blob, encoding in seeds[:9]:  # the valid ones load exactly as pickle.loads does
        outcome, value = load(blob, "seed", encoding)
        assert outcome == "LOADED", value
        assert pickle.dumps(value) == pickle.dumps(pickle.loads(blob, encoding=encoding)), "seed loaded differently"
    counts = {"LOADED": 0, "REFUSED": 0, "FAILED": 0}
    bad, slowest, start = [], 0.0, time.perf_counter()
    for case in range(cases):
        blob, encoding = rng.choice(seeds)
        mutant = mutate(blob, rng, donors)
        name = f"case{case}.pkl"
        t0, outcome = time.perf_counter(), "FAILED"
        try:
            outcome, value = load(mutant, name, encoding)
            if outcome == "LOADED":
                touch(value)
            elif "\n" in value or not value.startswith(f"data.root: {name} "):
                outcome = "FAILED"
                bad.append({"case": case, "message": value})
        except BaseException as err:  # anything but a load or a ConfigError is a failure
            outcome = "FAILED"
            bad.append({"case": case, "error": f"{type(err).__name__}: {err}", "blob": mutant.hex()})
        slowest = max(slowest, time.perf_counter() - t0)
        counts[outcome] += 1
    seconds = time.perf_counter() - start
    return {"cases": cases, **counts, "bad": bad[:5], "n_bad": len(bad), "seconds": seconds, "slowest": slowest}


if __name__ == "__main__":
    if sys.argv[1] == "payloads":
        run_payloads()
    else:
        print(json.dumps(fuzz(int(sys.argv[2]), int(sys.argv[3]))), flush=True)
