"""The PFLlib / PGFed ``.npz`` layout, so a partition can be compared across libraries.

``DIR/train/<id>.npz`` and ``DIR/test/<id>.npz`` (client ids 0..N-1) each hold one pickled dict
``data = {'x': array, 'y': array}``, which PFLlib reads with
``np.load(f, allow_pickle=True)['data'].tolist()``. pfl adds ``DIR/val/<id>.npz`` when clients have
validation splits, ``DIR/global_test.npz`` for the server's test set, and ``DIR/config.json``
(PFLlib's ``num_clients``/``num_classes`` plus the ids of held-out new clients, which follow the
training clients' ids).

Reading never uses ``allow_pickle=True``, which would let a file run code: the archive is opened as
a zip, plain arrays are read as numpy reads them, and the pickled ``data`` dict goes through
``pfl.data.safe_pickle`` (arrays, numbers, strings and containers only). pfl's export writes the
samples twice in each file: as the ``data`` dict, so PFLlib reads it unchanged, and as plain arrays
``x`` and ``y``, so any reader can load it with ``allow_pickle=False``; pfl reads ``x``/``y`` when
they are there and never unpickles that file's ``data``.
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from pfl.data.safe_pickle import restricted_load
from pfl.data.validate import Part
from pfl.errors import ConfigError
from pfl.memory import available_memory, gigabytes

if TYPE_CHECKING:  # reading a partition needs no torch; only exporting one has a FederatedData
    from pfl.data.federated import FederatedData

LAYOUT = "DIR/train/<id>.npz and DIR/test/<id>.npz (ids 0..N-1), each np.savez(f, data={'x': ..., 'y': ...})"
FIELD = "data.root"
MEMORY_SHARE = 3  # the data read may take a third of the memory available: it is copied when pooled
MAX_CLASSES = 2**31 - 1  # a class id must fit torch's int32 indexing
MAX_INFERRED_CLASSES = 100_000  # without num_classes in config.json, a larger label is refused, not allocated for


def _save(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, data={"x": x, "y": y}, x=x, y=y)


class ReadBudget:
    """The bytes the archive members read so far declare, against ``limit``: a member is refused before it
    is inflated when it would take the total past it (a zip bomb: a small file whose members inflate to
    gigabytes). None: no limit known."""

    def __init__(self, limit: int | None):
        self.limit, self.used = limit, 0

    @classmethod
    def from_memory(cls) -> ReadBudget:
        """A third of the memory available now: the samples are copied when converted and pooled."""
        available = available_memory()
        return cls(None if available is None else available // MEMORY_SHARE)

    def charge(self, nbytes: int, path: Path, member: str) -> None:
        if self.limit is not None and self.used + nbytes > self.limit:
            raise ConfigError(
                FIELD,
                f"{path}: member {member!r} inflates to {gigabytes(nbytes)}, which would bring the data read to "
                f"{gigabytes(self.used + nbytes)}, more than pfl reads with the memory available "
                f"({gigabytes(self.limit)}, a third of it)",
                "free memory or use a smaller data set; a small file that inflates this much is a zip bomb",
            )
        self.used += nbytes


def _header(fp: IO[bytes], path: Path) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    else:  # 3.0 exists only for structured dtypes with non-latin-1 field names: never numeric data
        raise ConfigError(FIELD, f"{path} holds a .npy member of version {version}, which pfl does not read")
    return tuple(shape), dtype


def _npy_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, budget: ReadBudget) -> Any:
    """One ``.npy`` member of an archive, inflated only after its declared size is checked against the
    budget and, for plain arrays, against the size its header describes; the inflating stream never
    yields more than the declared size (zipfile stops there), so a member that lies about it cannot
    take more. Object payloads are unpickled restrictedly."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):  # what numpy writes
        raise ConfigError(FIELD, f"{path}: member {info.filename!r} uses zip compression {info.compress_type}")
    budget.charge(info.file_size, path, info.filename)
    with archive.open(info) as fp:
        shape, dtype = _header(fp, path)
        if dtype.hasobject:
            array = restricted_load(fp, path, encoding="latin1")
            if not isinstance(array, np.ndarray) or array.shape != shape:
                raise ConfigError(FIELD, f"{path} holds an object member that is not the array its header describes")
            return array.item() if array.shape == () else array
        described = fp.tell() + math.prod(shape) * dtype.itemsize
    if described != info.file_size:
        raise ConfigError(
            FIELD,
            f"{path}: member {info.filename!r} declares {info.file_size} bytes, but its header describes "
            f"{described} ({shape} {dtype})",
            "the archive is damaged or forged; export it again",
        )
    with archive.open(info) as fp:  # numpy reads a stream chunk by chunk into the array it allocates
        return np.lib.format.read_array(fp, allow_pickle=False)


def _open(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except Exception as err:  # missing, unreadable, not a zip, truncated central directory
        raise ConfigError(FIELD, f"{path} is not a readable .npz archive ({type(err).__name__}: {err})") from None


def npz_members(path: Path) -> set[str]:
    """The array names in the ``.npz`` archive at ``path``."""
    with _open(path) as archive:
        return {n.removesuffix(".npy") for n in archive.namelist()}


def read_npz(path: Path, names: tuple[str, ...] | None = None, budget: ReadBudget | None = None) -> dict[str, Any]:
    """The members of the ``.npz`` archive at ``path`` (only ``names`` when given), without ever
    unpickling anything but data, and within ``budget`` (default: a third of the memory available).
    Damaged, foreign or oversized files are a ConfigError naming ``path``."""
    budget = ReadBudget.from_memory() if budget is None else budget
    with _open(path) as archive:
        members = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
        wanted = list(members) if names is None else [n for n in names if n in members]
        try:
            return {key: _npy_member(archive, members[key], path, budget) for key in wanted}
        except ConfigError:
            raise
        except Exception as err:  # zip, header and array errors all mean "not a readable npz"
            raise ConfigError(FIELD, f"{path} is not a readable .npz archive ({type(err).__name__}: {err})") from None


def _as_array(value: Any, path: Path, key: str) -> np.ndarray:
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as err:
        raise ConfigError(FIELD, f"{path}: {key} is not an array of equally shaped samples ({err})") from None


def _load(path: Path, client: int | None, split: str, budget: ReadBudget) -> Part:
    """One client file: plain ``x``/``y`` members when present, else PFLlib's ``data`` dict."""
    members = npz_members(path)
    if {"x", "y"} <= members:
        arrays = read_npz(path, ("x", "y"), budget)
    elif "data" in members:
        arrays = read_npz(path, ("data",), budget)["data"]
        if not isinstance(arrays, dict) or not {"x", "y"} <= set(arrays):
            raise ConfigError(FIELD, f"{path}: 'data' is not a dict with 'x' and 'y'", f"expected layout: {LAYOUT}")
    else:
        raise ConfigError(FIELD, f"{path} holds neither a 'data' dict nor 'x'/'y' arrays", f"expected {LAYOUT}")
    x = _as_array(arrays["x"], path, "x")
    if x.dtype.kind == "f" and x.dtype != np.float32:  # the models are float32; an overflow becomes inf, refused later
        with np.errstate(over="ignore"):
            x = x.astype(np.float32)
    return Part(x, _as_array(arrays["y"], path, "y"), str(path), client, split)


def export_npz(data: FederatedData, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``data`` in the npz layout; returns what ``config.json`` holds."""
    x, y = data.x.cpu().numpy(), data.y.cpu().numpy()
    everyone = [*data.clients, *data.new_clients]
    for cid, split in enumerate(everyone):
        for name in ("train", "test", "val"):
            idx = getattr(split, name).cpu().numpy()
            if name != "val" or any(len(s.val) for s in everyone):
                _save(out_dir / name / f"{cid}.npz", x[idx], y[idx])
    if len(data.global_test):
        idx = data.global_test.cpu().numpy()
        _save(out_dir / "global_test.npz", x[idx], y[idx])
    config = {
        "num_clients": len(everyone),
        "num_classes": data.num_classes,
        "dataset": data.name,
        "new_clients": list(range(data.num_clients, len(everyone))),
        "input_shape": list(data.input_shape),
        **(extra or {}),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return config


def _read_config(root: Path, num_clients: int) -> dict[str, Any]:
    path = root / "config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(FIELD, f"{path} is not readable JSON ({err})") from None
    if not isinstance(config, dict):
        raise ConfigError(FIELD, f"{path} does not hold a JSON object")
    classes = config.get("num_classes")
    if classes is not None and (not isinstance(classes, int) or isinstance(classes, bool) or classes < 1):
        raise ConfigError(FIELD, f"{path}: num_classes = {classes!r} is not a positive integer")
    if classes is not None and classes > MAX_CLASSES:  # below it, the model's size check refuses what cannot fit
        raise ConfigError(
            FIELD, f"{path}: num_classes = {classes} is more than {MAX_CLASSES}", "set the number of classes used"
        )
    new = config.get("new_clients", [])
    ok = isinstance(new, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_clients for i in new
    )
    if not ok or len(set(new)) >= num_clients:
        raise ConfigError(
            FIELD,
            f"{path}: new_clients = {new!r} must be distinct client ids in 0..{num_clients - 1}, leaving one to train",
        )
    return config


def _inferred_classes(parts: list[Part], root: Path) -> int:
    """Without ``num_classes`` in config.json: one more than the largest label (PFLlib's convention), at
    most ``MAX_INFERRED_CLASSES``: every class costs the model a row of its head, so one stray label of
    10^9 would otherwise ask for gigabytes before anything could name the file it came from."""
    labels = [p for p in parts if len(p.y) and p.y.dtype.kind in "biuf" and np.isfinite(p.y).all()]
    if not labels:
        return 1
    top = max(labels, key=lambda p: p.y.max())
    largest = top.y.max()
    if largest >= MAX_INFERRED_CLASSES:
        row = int(np.argmax(top.y))
        raise ConfigError(
            FIELD,
            f"{top.where}: label {largest} of sample {row} would make num_classes {int(largest) + 1}, more than the "
            f"{MAX_INFERRED_CLASSES} pfl infers from labels",
            f"set num_classes in {root / 'config.json'} if that many classes is meant, else fix the label",
        )
    return int(largest) + 1


def npz_parts(root: Path) -> tuple[list[Part], int, list[int]]:
    """Read a directory in the npz layout: one Part per (client, split) file, in client order
    (train, test, val), then the server's global test file; plus num_classes and the new-client ids."""
    train_dir = root / "train"
    files = sorted(train_dir.glob("*.npz"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    if not files:
        raise ConfigError(FIELD, f"npz_dir: no client files in {train_dir}", f"expected layout: {LAYOUT}")
    ids = [int(p.stem) for p in files if p.stem.isdigit()]
    if ids != list(range(len(ids))):
        raise ConfigError(FIELD, f"npz_dir: client ids in {train_dir} are not 0..N-1", LAYOUT)
    config = _read_config(root, len(ids))
    parts, budget = [], ReadBudget.from_memory()
    for cid in ids:
        for name in ("train", "test", "val"):
            path = root / name / f"{cid}.npz"
            if path.exists():
                parts.append(_load(path, cid, name, budget))
            elif name == "test":
                raise ConfigError(FIELD, f"npz_dir: {path} is missing", f"expected layout: {LAYOUT}")
    if (root / "global_test.npz").exists():
        parts.append(_load(root / "global_test.npz", None, "global_test", budget))
    num_classes = config.get("num_classes") or _inferred_classes(parts, root)
    return parts, num_classes, list(config.get("new_clients", []))
