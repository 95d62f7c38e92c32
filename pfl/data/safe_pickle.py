"""A restricted unpickler for the two data formats that are pickles: the ``data`` member of a
PFLlib ``.npz`` file and CIFAR's python batches.

A pickle is a program: ``GLOBAL``/``STACK_GLOBAL`` fetch any importable callable, ``REDUCE`` calls
it and ``BUILD`` calls ``__setstate__`` on (or sets attributes of) whatever is on the stack. Even
numpy's own reconstructors are unsafe with hostile arguments: ``BUILD`` on a dtype rewrites its
flags and fields, so ``numpy.dtype('O8')`` stripped of its flags and handed to
``multiarray.scalar`` with eight file bytes makes those bytes a Python object pointer (a segfault,
or worse). So this unpickler never hands numpy, or anything else, a value the file chose freely:

- globals resolve to inert names (``_Global``), never to the callables themselves, so ``BUILD`` or
  attribute writes cannot reach a function or class;
- ``REDUCE`` runs pfl's own constructor for the name, which checks every argument: dtypes come only
  from an allow-list of plain numeric descriptors (and the object dtype numpy wraps around a
  pickled dict), arrays and scalars only from a byte string of exactly the size their dtype and
  shape need, object arrays only from a list of exactly their size;
- ``BUILD`` is admitted once on a dtype or array that ``REDUCE`` has just made, with a state of the
  form numpy writes; the array's state goes to ``ndarray.__setstate__`` rebuilt from checked
  parts, and the result's dtype and shape are verified;
- opcodes that instantiate classes (``INST``, ``OBJ``, ``NEWOBJ``...), the extension registry,
  persistent ids and out-of-band buffers are refused; ``APPEND``/``SETITEM``/``ADDITEMS`` act only
  on real lists, dicts and sets.

Everything refused is a ConfigError naming the file and what was refused.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from pfl.errors import ConfigError

# plain numeric descriptors (as numpy writes them in a dtype's pickle), and the object dtype of the
# container array numpy wraps around a pickled dict (its items go through this unpickler too)
NUMERIC = {"b1", "?"} | {f"{k}{n}" for k in "iu" for n in (1, 2, 4, 8)} | {"f2", "f4", "f8", "c8", "c16"}
OBJECT = f"O{np.dtype(object).itemsize}"
ENDIAN = {"<", ">", "|", "="}
MAX_NDIM = 32


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a global outside ``ALLOWED``; nothing was imported or called."""

    def __init__(self, module: str, name: str):
        self.qualname = f"{module}.{name}"
        super().__init__(f"refused global {self.qualname}")


class Refused(pickle.UnpicklingError):
    """The pickle asked for something that is not plain data (a state change, a raw object buffer...)."""


def _refuse(condition: bool, what: str) -> None:
    if not condition:
        raise Refused(what)


class _Dtype:
    """A dtype the pickle asked for: a descriptor from the allow-list, and the byte order its
    ``BUILD`` gives (once). Never a numpy dtype the pickle could reach with ``BUILD``."""

    def __init__(self, descr: str):
        self.dtype = np.dtype(descr)

    def __repr__(self) -> str:
        return f"dtype({self.dtype.str!r})"


class _Global:
    """An admitted global: a name and pfl's checked constructor for it (``None``: not callable)."""

    def __init__(self, qualname: str, make: Callable[..., Any] | None):
        self.qualname, self.make = qualname, make

    def __repr__(self) -> str:
        return self.qualname


def _show(value: Any, depth: int = 2) -> str:
    """A short one-line description of a value from the file, for messages (never its full repr)."""
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[:40])
    if isinstance(value, (bool, float, type(None), _Global, _Dtype)) or (type(value) is int and abs(value) < 10**12):
        return repr(value)
    if type(value) is tuple and len(value) <= 9 and depth:
        return "(" + ", ".join(_show(v, depth - 1) for v in value) + ")"
    return f"a {type(value).__name__}"


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):  # Python 2 strings under encoding="bytes"
        return value.decode("latin1")
    return value if isinstance(value, str) else None


def _raw(value: Any) -> bytes | bytearray | None:
    if isinstance(value, str):  # Python 2 strings under encoding="latin1"
        return value.encode("latin1")
    return value if isinstance(value, (bytes, bytearray)) else None


def _shape(value: Any) -> tuple[int, ...]:
    _refuse(
        type(value) is tuple and len(value) <= MAX_NDIM and all(type(n) is int and n >= 0 for n in value),
        f"array shape {_show(value)} is not a tuple of at most {MAX_NDIM} non-negative ints",
    )
    return value


def _numeric(spec: Any, what: str) -> np.dtype:
    _refuse(isinstance(spec, _Dtype), f"{what} needs a dtype, got {type(spec).__name__}")
    _refuse(not spec.dtype.hasobject, f"{what} with dtype {spec.dtype} from raw bytes")
    return spec.dtype


def _sized(data: Any, dtype: np.dtype, shape: tuple[int, ...], what: str) -> bytes | bytearray:
    raw = _raw(data)
    need = math.prod(shape) * dtype.itemsize
    _refuse(raw is not None and len(raw) == need, f"{what} {dtype} {shape} needs {need} bytes of data")
    return raw


def _make_dtype(descr: Any, align: Any = False, copy: Any = False) -> _Dtype:
    text = _text(descr)
    _refuse(type(align) in (bool, int) and type(copy) in (bool, int), "dtype flags that are not bools")
    if text not in NUMERIC and text != OBJECT:
        raise Refused(f"dtype {_show(descr)} is not numeric (pfl reads {', '.join(sorted(NUMERIC))})")
    return _Dtype(text)


def _build_dtype(spec: _Dtype, state: Any) -> None:
    """numpy's dtype state: (version, byte order, subarray, names, fields, elsize, alignment[, flags
    [, metadata]]). Only the byte order is taken; a plain dtype has no subarray, fields or metadata."""
    _refuse(
        isinstance(state, tuple) and len(state) in (7, 8, 9) and type(state[0]) is int and _text(state[1]) in ENDIAN,
        f"a dtype state {_show(state)} that is not numpy's",
    )
    extra = state[2:5] + state[8:]
    _refuse(all(v is None for v in extra), "a dtype state with a subarray, fields or metadata")
    order = _text(state[1])
    if order in "<>":
        spec.dtype = spec.dtype.newbyteorder(order)


def _build_array(array: np.ndarray, state: Any) -> None:
    """numpy's array state: ([1,] shape, dtype, is_fortran, data); rebuilt from checked parts."""
    _refuse(isinstance(state, tuple) and len(state) in (4, 5), f"an array state {_show(state)} that is not numpy's")
    if len(state) == 5:
        _refuse(type(state[0]) is int and state[0] == 1, f"array state version {_show(state[0])}")
        state = state[1:]
    shape, spec, fortran, data = state
    shape = _shape(shape)
    _refuse(isinstance(spec, _Dtype) and type(fortran) in (bool, int), "an array state without a dtype")
    dtype = spec.dtype
    if dtype.hasobject:
        _refuse(type(data) is list and len(data) == math.prod(shape), f"an object array {shape} without its items")
    else:
        data = bytes(_sized(data, dtype, shape, "array"))
    array.__setstate__((1, shape, dtype, bool(fortran), data))
    same = array.dtype.newbyteorder("=") == dtype.newbyteorder("=")  # numpy swaps foreign byte orders to native
    _refuse(same and array.shape == shape, f"an array that did not rebuild as {dtype} {shape}")


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """numpy's placeholder before ``BUILD``: always ``ndarray((0,), 'b')`` in numpy's own pickles."""
    _refuse(
        isinstance(subtype, _Global) and subtype.qualname == "numpy.ndarray" and type(shape) is tuple and shape == (0,),
        "_reconstruct of anything but an empty numpy.ndarray",
    )
    _refuse(_text(typecode) == "b", f"_reconstruct with typecode {_show(typecode)}")
    return np.ndarray((0,), np.int8)


def _frombuffer(buf: Any, spec: Any, shape: Any, order: Any, axis_order: Any = None) -> np.ndarray:
    dtype, shape = _numeric(spec, "an array"), _shape(shape)
    buf = _sized(buf, dtype, shape, "array")
    order = _text(order)
    _refuse(order in ("C", "F", "K"), f"array order {_show(order)}")
    array = np.frombuffer(buf, dtype=dtype)
    if order == "K" and axis_order is not None:
        _refuse(
            isinstance(axis_order, tuple) and sorted(axis_order) == list(range(len(shape))),
            f"axis order {_show(axis_order)}",
        )
        return array.reshape(shape, order="C").transpose(axis_order)
    return array.reshape(shape, order="C" if order == "K" else order)


def _scalar(spec: Any, data: Any) -> np.generic:
    dtype = _numeric(spec, "a scalar")
    return np.frombuffer(_sized(data, dtype, (), "scalar"), dtype=dtype)[0]


def _latin1(text: Any, encoding: Any = "latin1") -> bytes:
    """Python 3 writes ``bytes`` in protocol-2 pickles as ``_codecs.encode(text, 'latin1')``."""
    _refuse(
        isinstance(text, str) and encoding in ("latin1", "latin-1"),
        "_codecs.encode other than to rebuild bytes from latin-1 text",
    )
    return text.encode("latin1")


ALLOWED: dict[tuple[str, str], _Global] = {
    ("numpy", "ndarray"): _Global("numpy.ndarray", None),
    ("numpy", "dtype"): _Global("numpy.dtype", _make_dtype),
    ("_codecs", "encode"): _Global("_codecs.encode", _latin1),
}
for _module in ("numpy.core", "numpy._core"):  # files written by numpy 1.x and 2.x
    for _name, _make in (("multiarray._reconstruct", _reconstruct), ("multiarray.scalar", _scalar)):
        _mod, _, _attr = f"{_module}.{_name}".rpartition(".")
        ALLOWED[(_mod, _attr)] = _Global(f"{_mod}.{_attr}", _make)
    ALLOWED[(f"{_module}.numeric", "_frombuffer")] = _Global(f"{_module}.numeric._frombuffer", _frombuffer)

# opcodes that push, store or fetch plain values (pickle's own handlers); every other opcode is
# either pfl's own handler below or refused (INST, OBJ, NEWOBJ[_EX], EXT1/2/4, [BIN]PERSID, buffers)
_PLAIN = (  # noqa: SIM905 - names read better as words
    "MARK STOP POP POP_MARK DUP FLOAT INT BININT BININT1 LONG BININT2 NONE STRING BINSTRING "
    "SHORT_BINSTRING UNICODE BINUNICODE EMPTY_LIST EMPTY_DICT EMPTY_TUPLE GLOBAL DICT LIST TUPLE GET "
    "BINGET LONG_BINGET PUT BINPUT LONG_BINPUT BINFLOAT BINBYTES SHORT_BINBYTES PROTO TUPLE1 TUPLE2 "
    "TUPLE3 NEWTRUE NEWFALSE LONG1 LONG4 SHORT_BINUNICODE BINUNICODE8 BINBYTES8 EMPTY_SET FROZENSET "
    "STACK_GLOBAL MEMOIZE FRAME"
).split()


class _Dispatch(dict):
    def __missing__(self, opcode: int) -> Callable[[Any], None]:
        raise Refused(f"opcode {bytes([opcode])!r}")


class RestrictedUnpickler(pickle._Unpickler):
    """Python's own unpickler loop with pfl's handlers for globals, ``REDUCE``, ``BUILD`` and the
    container opcodes, and no handler at all for the opcodes plain data never needs."""

    def __init__(self, data: bytes, encoding: str = "ASCII"):
        super().__init__(io.BytesIO(data), encoding=encoding)
        self._size = len(data)
        self._unbuilt: dict[int, Any] = {}  # id -> dtype spec or array that BUILD may still set, once

    def find_class(self, module: str, name: str) -> _Global:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise RefusedGlobal(module, name) from None

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        _refuse(isinstance(func, _Global) and func.make is not None, f"calling {_show(func)}")
        _refuse(type(args) is tuple, f"{func} with arguments that are not a tuple")
        try:
            made = func.make(*args)
        except TypeError as err:
            raise Refused(f"{func} with {len(args)} arguments") from err
        if isinstance(made, _Dtype) or func.make is _reconstruct:
            self._unbuilt[id(made)] = made
        self.stack[-1] = made

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        _refuse(self._unbuilt.pop(id(inst), None) is inst, f"BUILD (__setstate__) on {_show(inst)}")
        (_build_dtype if isinstance(inst, _Dtype) else _build_array)(inst, state)

    def load_bytearray8(self) -> None:
        """Python's own handler allocates the length the file gives before reading; this reads first."""
        (size,) = struct.unpack("<Q", self.read(8))
        data = self.read(size) if size <= self._size else b""
        if len(data) != size:
            raise pickle.UnpicklingError("pickle data was truncated")
        self.append(bytearray(data))

    def _container(self, kind: type) -> Any:
        target = self.stack[-1]
        _refuse(type(target) is kind, f"adding items to a {type(target).__name__}")
        return target

    def load_append(self) -> None:
        value = self.stack.pop()
        self._container(list).append(value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        self._container(list).extend(items)

    def load_setitem(self) -> None:
        value, key = self.stack.pop(), self.stack.pop()
        self._container(dict)[key] = value

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self._container(dict)
        _refuse(len(items) % 2 == 0, "SETITEMS with a key and no value")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def load_additems(self) -> None:
        items = self.pop_mark()
        self._container(set).update(items)

    dispatch = _Dispatch({getattr(pickle, op)[0]: pickle._Unpickler.dispatch[getattr(pickle, op)[0]] for op in _PLAIN})
    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.APPEND[0]] = load_append
    dispatch[pickle.APPENDS[0]] = load_appends
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.ADDITEMS[0]] = load_additems
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8


def restricted_load(
    stream: BinaryIO | bytes, file: Path | str, encoding: str = "ASCII", field: str = "data.root"
) -> Any:
    """Unpickle ``stream`` (read from ``file``) admitting only containers, numbers, strings and numpy
    arrays. A refused global or construct, or an unreadable pickle, is a ConfigError naming ``file``."""
    if not isinstance(stream, bytes):  # whole, so a length field read from the file never sizes a read
        stream = stream.read()
    try:
        return RestrictedUnpickler(stream, encoding=encoding).load()
    except RefusedGlobal as err:
        raise ConfigError(
            field,
            f"{file} holds a pickled {err.qualname}, which is not data (arrays, numbers, strings, containers); "
            "pfl refuses to unpickle code",
            "use a file written by the original tool, or re-export it from a trusted copy",
        ) from None
    except Refused as err:
        raise ConfigError(
            field,
            f"{file} holds a pickle that asks for {err}, which is not plain data; pfl refuses it",
            "use a file written by the original tool, or re-export it from a trusted copy",
        ) from None
    except Exception as err:  # a damaged pickle fails in many ways; each means the same to the user
        raise ConfigError(field, f"{file} is not a readable pickle ({type(err).__name__}: {err})") from None
