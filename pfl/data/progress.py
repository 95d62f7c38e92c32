"""A progress bar for the slow part of loading a large source (decoding many images one by one).

Shown on a terminal only (tqdm turns itself off when stderr is not a TTY: logs, sweep workers),
only by the first process of a multi-process run, and only for sources of ``MIN_ITEMS`` samples or
more, where reading takes long enough to need one. It stays on screen when done, as a record of the
load time, above the round bar.
"""

from __future__ import annotations

import os

from tqdm.auto import tqdm

MIN_ITEMS = 2000


def progress(total: int, desc: str, unit: str = "img") -> tqdm:
    """A bar over ``total`` items (``with progress(n, "reading x") as bar: ... bar.update(k)``)."""
    first_rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0"
    show = total >= MIN_ITEMS and first_rank
    return tqdm(total=total, desc=desc, unit=unit, disable=None if show else True, dynamic_ncols=True)
