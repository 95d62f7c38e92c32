"""Data sources, partitions and the federated split."""

from pfl.data.config import DataConfig, ShakespeareConfig, SyntheticConfig, build_data
from pfl.data.federated import ClientSplit, FederatedData

__all__ = ["ClientSplit", "DataConfig", "FederatedData", "ShakespeareConfig", "SyntheticConfig", "build_data"]
