"""How much memory the process may still take, so that a data file or model too large for it is
refused with one line before it is allocated (an allocation past it dies with a traceback, or
the kernel kills the process)."""

from __future__ import annotations

import os
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux's MemAvailable, else free physical pages);
    None where the system does not say."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def gigabytes(n: int) -> str:
    """``n`` bytes for a message: ``25.6 GB``, ``0.001 GB``."""
    return f"{n / 1e9:.3g} GB"
