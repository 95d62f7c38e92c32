"""Data sources, partitions and the federated split.

The names below load on first use, so that a light submodule (``pfl.data.sources``' ``is_natural``,
which ``pfl report`` reads) does not import torch through this package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pfl.lazy_names import lazy_names

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


__getattr__ = lazy_names(__name__, _MODULE_OF)
