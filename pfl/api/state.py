"""What a run changes in the calling process, put back: ``pfl.fit`` and ``Run.model()`` leave the caller's
random draws, thread count and warnings filters as they found them."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


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
