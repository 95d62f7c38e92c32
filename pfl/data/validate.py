"""One check of every data source at load, before anything is trained.

Loaders return their samples as ``Part``s (one per file, or per client and split), each remembering
where it came from, and ``validate_source`` checks them all before they are pooled. Pooling first
would hide the worst faults: a file whose x has one sample more than its y shifts every later
file's labels by one, silently. Every error names the file and the client.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from pfl.errors import ConfigError

FIELD = "data.root"
FEATURE_KINDS = "biuf"  # bool, ints (token ids), floats
LABEL_KINDS = "biu"
ROWS_PER_CHUNK = 4096  # finiteness is located chunk by chunk, never with a pool-sized mask


@dataclass
class Part:
    """Samples read from one place: ``file`` (a path, or the package bundled data comes from),
    for ``client`` (None: a centralised pool) and ``split`` (train / test / val / global_test / all)."""

    x: np.ndarray
    y: np.ndarray
    file: str
    client: int | str | None = None
    split: str = "all"

    @property
    def where(self) -> str:
        owner = f"client {self.client}, " if self.client is not None else ""
        return f"{self.file} ({owner}{self.split})"


def _fail(part: Part, problem: str, fix: str = "", field: str = FIELD) -> ConfigError:
    return ConfigError(field, f"{part.where}: {problem}", fix)


def _first_bad_row(x: np.ndarray) -> int:
    flat = x.reshape(len(x), -1)
    for start in range(0, len(x), ROWS_PER_CHUNK):
        bad = np.flatnonzero(~np.isfinite(flat[start : start + ROWS_PER_CHUNK]).all(axis=1))
        if len(bad):
            return start + int(bad[0])
    return -1


def _check_features(part: Part, field: str) -> None:
    x = part.x
    if x.dtype.kind not in FEATURE_KINDS:
        raise _fail(part, f"x has dtype {x.dtype}, not numeric", "store features as a float or int array", field=field)
    # A finite float64 sum proves every value finite; only a non-finite sum needs the row-by-row search.
    if x.dtype.kind == "f" and len(x) and not np.isfinite(x.sum(dtype=np.float64)):
        row = _first_bad_row(x)
        if row >= 0:
            raise _fail(part, f"sample {row} has a NaN or infinite feature", "clean or drop that sample", field=field)


def _check_labels(part: Part, num_classes: int, field: str) -> None:
    y = part.y
    if y.dtype.kind == "f":
        integral = np.isfinite(y) & (y == np.round(y))
        if not integral.all():
            row = int(np.flatnonzero(~integral)[0])
            raise _fail(part, f"label {y[row]} of sample {row} is not an integer class id", field=field)
    elif y.dtype.kind not in LABEL_KINDS:
        raise _fail(part, f"y has dtype {y.dtype}, not integer class ids", field=field)
    if len(y):
        out = np.flatnonzero((y < 0) | (y >= num_classes))
        if len(out):
            row = int(out[0])
            raise _fail(
                part,
                f"label {y[row]} of sample {row} is outside [0, {num_classes}) ({len(out)} such labels)",
                "labels must be 0..num_classes-1 (npz: set num_classes in config.json)",
                field=field,
            )


def _check_values(part: Part, field: str) -> None:
    y = part.y
    if y.dtype.kind not in "iuf":
        raise _fail(part, f"y has dtype {y.dtype}, not real-valued targets", field=field)
    bad = np.flatnonzero(~np.isfinite(y.astype(np.float64)))
    if len(bad):
        raise _fail(
            part, f"target {y[bad[0]]} of sample {int(bad[0])} is not finite", "clean or drop that sample", field=field
        )


def validate_source(
    parts: list[Part], num_classes: int, fixed_splits: bool = False, field: str = FIELD, targets: str = "classes"
) -> None:
    """Refuse the source unless, for every part: x and y hold the same number of samples, features
    are numeric and finite, every sample has the shape of the first part's samples, and labels are
    integers in [0, num_classes) (``targets="values"``, regression: finite real numbers). Every
    client must hold samples; with ``fixed_splits`` (the source
    gives each client's train/test split) each client needs a non-empty train and test split, and a
    global test file, when given, must not be empty. Errors name ``field`` (the config key that points
    at the data) and the file and client at fault."""
    reference: Part | None = None
    for part in parts:
        if part.x.ndim < 1 or part.y.ndim != 1:
            raise _fail(
                part,
                f"x has shape {part.x.shape} and y {part.y.shape}",
                "x holds one sample per row; y is a 1-D array of integer labels",
                field=field,
            )
        if len(part.x) != len(part.y):
            raise _fail(
                part,
                f"x holds {len(part.x)} samples but y holds {len(part.y)} labels",
                "every sample needs exactly one label",
                field=field,
            )
        _check_features(part, field)
        if targets == "values":
            _check_values(part, field)
        else:
            _check_labels(part, num_classes, field)
        if reference is None:
            reference = part
        elif part.x.shape[1:] != reference.x.shape[1:]:
            raise _fail(
                part,
                f"samples have shape {part.x.shape[1:]}, but those of {reference.where} have {reference.x.shape[1:]}",
                "every sample of a source must have the same shape",
                field=field,
            )
    _check_clients(parts, fixed_splits, field)


def _check_clients(parts: list[Part], fixed_splits: bool, field: str) -> None:
    sizes: dict[int | str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    files: dict[tuple[int | str, str], str] = {}
    for part in parts:
        if part.split == "global_test" and len(part.y) == 0:
            raise _fail(part, "the server's global test file holds no samples", "fill it or delete it", field=field)
        if part.client is not None:
            sizes[part.client][part.split] += len(part.y)
            files.setdefault((part.client, part.split), part.file)
    for client, by_split in sizes.items():
        if not fixed_splits:
            if sum(by_split.values()) == 0:
                raise ConfigError(field, f"client {client} holds no samples ({files[client, next(iter(by_split))]})")
            continue
        for split in ("train", "test"):
            if by_split[split] == 0:
                raise ConfigError(
                    field,
                    f"client {client} has an empty {split} split ({files.get((client, split), f'no {split} file')})",
                    "every client needs at least one training and one test sample",
                )


def pool_parts(parts: list[Part], targets: str = "classes") -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Concatenate validated parts: the pooled x, y (int64 class ids, or float32 values for
    ``targets="values"``), and each part's indices into them."""
    bounds = np.cumsum([0] + [len(p.y) for p in parts])
    x = np.concatenate([p.x for p in parts])
    y = np.concatenate([p.y for p in parts]).astype(np.float32 if targets == "values" else np.int64)
    return x, y, [np.arange(bounds[k], bounds[k + 1]) for k in range(len(parts))]
