"""Data sources, partitions and the federated split."""

from pfl.data.config import build_data
from pfl.data.federated import ClientSplit, FederatedData
from pfl.data.settings import DataConfig, ShakespeareConfig, SyntheticConfig

__all__ = ["ClientSplit", "DataConfig", "FederatedData", "ShakespeareConfig", "SyntheticConfig", "build_data"]
