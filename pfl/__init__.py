"""pfl: personalized federated learning on PyTorch Lightning.

``pfl.fit``, ``pfl.load``, ``pfl.compare`` and ``pfl.Run`` (``pfl.api``) are imported on first use, so
``import pfl`` stays cheap (no torch) for the command line and for subprocesses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Run", "compare", "fit", "load"]

if TYPE_CHECKING:
    from pfl.api import Run, compare, fit, load


def __getattr__(name: str) -> Any:
    if name in __all__:
        import pfl.api

        return getattr(pfl.api, name)
    raise AttributeError(f"module 'pfl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
