"""A restricted unpickler for the two data formats that are pickles: the ``data`` member of a
PFLlib ``.npz`` file and CIFAR's python batches.

A pickle is a program: ``GLOBAL``/``STACK_GLOBAL`` fetch any importable callable and ``REDUCE``
calls it, so ``pickle.load`` on a downloaded file can run anything (``os.system``, ``open``...).
These formats only ever hold containers, numbers, strings and numpy arrays. Containers, numbers,
strings, bytes and None have their own opcodes and need no global at all; numpy arrays, dtypes and
scalars need the handful of globals in ``ALLOWED``. Every other global is refused before it is
imported or called, with a ConfigError naming the file and the global (``module.name``).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from pfl.errors import ConfigError

try:  # numpy >= 2 keeps its internals in numpy._core; numpy 1.x in numpy.core
    from numpy._core.multiarray import _reconstruct, scalar
    from numpy._core.numeric import _frombuffer
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct, scalar
    from numpy.core.numeric import _frombuffer

# dtype kinds an array in these formats may have: bool, ints, floats, complex, and object for the
# container array that numpy wraps around a pickled dict (its items go through this unpickler too).
DTYPE_KINDS = "biufcO"


def _dtype(*args: Any) -> np.dtype:
    dtype = np.dtype(*args)
    if dtype.kind not in DTYPE_KINDS:
        raise pickle.UnpicklingError(f"dtype {dtype} is not numeric")
    return dtype


def _latin1(text: Any, encoding: Any = "latin1") -> bytes:
    """Python 3 writes ``bytes`` in protocol-2 pickles as ``_codecs.encode(text, 'latin1')``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is admitted only to rebuild bytes from latin-1 text")
    return text.encode("latin1")


ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _latin1,
}
for _module in ("numpy.core", "numpy._core"):  # files written by numpy 1.x and 2.x
    ALLOWED[(f"{_module}.multiarray", "_reconstruct")] = _reconstruct
    ALLOWED[(f"{_module}.multiarray", "scalar")] = scalar
    ALLOWED[(f"{_module}.numeric", "_frombuffer")] = _frombuffer


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a global outside ``ALLOWED``; nothing was imported or called."""

    def __init__(self, module: str, name: str):
        self.qualname = f"{module}.{name}"
        super().__init__(f"refused global {self.qualname}")


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise RefusedGlobal(module, name) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of this format")


def restricted_load(
    stream: BinaryIO | bytes, file: Path | str, encoding: str = "ASCII", field: str = "data.root"
) -> Any:
    """Unpickle ``stream`` (read from ``file``) admitting only containers, numbers, strings and numpy
    arrays. A refused global or an unreadable pickle is a ConfigError naming ``file``."""
    if isinstance(stream, bytes):
        stream = io.BytesIO(stream)
    try:
        return RestrictedUnpickler(stream, encoding=encoding).load()
    except RefusedGlobal as err:
        raise ConfigError(
            field,
            f"{file} holds a pickled {err.qualname}, which is not data (arrays, numbers, strings, containers); "
            "pfl refuses to unpickle code",
            "use a file written by the original tool, or re-export it from a trusted copy",
        ) from None
    except Exception as err:  # a damaged pickle fails in many ways; each means the same to the user
        raise ConfigError(field, f"{file} is not a readable pickle ({type(err).__name__}: {err})") from None
