"""Tests of pfl/methods/heads.py."""

from __future__ import annotations

import pytest
from torch import nn

from pfl.errors import ConfigError
from pfl.methods.heads import split_head


class _HeadFirst(nn.Module):
    """head(features(x)) with the head registered before the body: the layout's head slice would be
    the body's last layer, so FedRoD must refuse it."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 3)
        self.body = nn.Linear(5, 4)

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.features(x))


class _HeadOnly(nn.Module):
    """A linear ``head`` registered last but no ``features`` to feed it: nothing to split."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(5, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.body(x))


def test_split_head_refuses_a_model_it_cannot_split_with_the_field_named():
    ends_in_relu = nn.Sequential(nn.Flatten(), nn.Linear(5, 4), nn.ReLU())  # a Linear, but not last
    for net in (_HeadFirst(), _HeadOnly(), nn.Sequential(nn.Linear(5, 4), nn.ReLU()), ends_in_relu, nn.LSTM(3, 4)):
        with pytest.raises(ConfigError, match="model.name"):
            split_head(net)
