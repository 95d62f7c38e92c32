"""Data sources, partitions and the federated split.

The names below load on first use, so that a light submodule (``pfl.data.sources``' ``is_natural``,
which ``pfl report`` reads) does not import torch through this package."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pfl.data.config import build_data
    from pfl.data.federated import ClientSplit, FederatedData
    from pfl.data.settings import DataConfig, ShakespeareConfig, SyntheticConfig

_MODULE_OF = {
    "build_data": "config",
    "ClientSplit": "federated",
    "FederatedData": "federated",
    "DataConfig": "settings",
    "ShakespeareConfig": "settings",
    "SyntheticConfig": "settings",
}

__all__ = [
    "ClientSplit",
    "DataConfig",
    "FederatedData",
    "ShakespeareConfig",
    "SyntheticConfig",
    "build_data",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'pfl.data' has no attribute {name!r}")
    value = getattr(import_module(f"pfl.data.{_MODULE_OF[name]}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value
