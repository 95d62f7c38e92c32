"""The federated dataset: one pool of samples, and per client only index tensors into it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class ClientSplit:
    """Indices into the pool for one client's train / validation / test samples."""

    train: Tensor
    test: Tensor
    val: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def to(self, device: torch.device | str) -> ClientSplit:
        return ClientSplit(self.train.to(device), self.test.to(device), self.val.to(device))


@dataclass
class FederatedData:
    """All samples live once in ``x``/``y``; clients and the server test set are index tensors.

    ``x`` holds float features or int64 token windows (text). ``new_clients`` are held out: never
    trained on, for the new-client protocols. ``client_names`` name natural clients (e.g. roles).
    """

    name: str
    x: Tensor
    y: Tensor
    num_classes: int
    clients: list[ClientSplit]
    global_test: Tensor
    new_clients: list[ClientSplit] = field(default_factory=list)
    client_names: list[str] = field(default_factory=list)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def to(self, device: torch.device | str) -> FederatedData:
        return FederatedData(
            self.name,
            self.x.to(device),
            self.y.to(device),
            self.num_classes,
            [c.to(device) for c in self.clients],
            self.global_test.to(device),
            [c.to(device) for c in self.new_clients],
            list(self.client_names),
        )

    def sizes(self, split: str = "train") -> list[int]:
        return [len(getattr(c, split)) for c in self.clients]
