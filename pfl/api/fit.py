"""``pfl.fit``: ``python -m pfl fit`` from Python, one path with the command line (its parsing, validation,
errors and run folder), leaving the calling process as it found it."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from os import PathLike
from typing import Any

import numpy as np
import torch

from pfl.api.overrides import to_argv
from pfl.api.runs import Run, load
from pfl.runner.experiment import run_argv


def fit(config: str | PathLike | Sequence[str | PathLike] | None = None, **overrides: Any) -> Run:
    """Run an experiment as ``python -m pfl fit --config CONFIG --KEY VALUE ...`` does; returns its ``Run``.

    ``config``: a YAML file or a list of them (later wins). ``overrides``: the command line's keys, dotted
    (``**{"method.lam": 0.5}``) or as groups (``trainer={"rounds": 20}``); ``method="ditto"`` chooses the
    method. Bad input raises ``pfl.errors.ConfigError`` naming the field, before anything is written.
    """
    argv = to_argv(config, overrides)
    with preserved_global_state():
        summary = run_argv(argv)
    return load(summary["run_dir"])


@contextmanager
def preserved_global_state() -> Iterator[None]:
    """Restore what a run changes in the process: torch's thread count and global RNGs (CPU, and CUDA
    when it is in use), numpy's and Python's global RNGs, and the warnings filters. Two fits in one
    process then give what two command-line runs give, and the caller's own random draws go on unchanged."""
    threads = torch.get_num_threads()
    torch_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    numpy_rng = np.random.get_state()
    python_rng = random.getstate()
    with warnings.catch_warnings():  # restores warnings.filters (and showwarning) on exit
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.set_rng_state(torch_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            np.random.set_state(numpy_rng)
            random.setstate(python_rng)
