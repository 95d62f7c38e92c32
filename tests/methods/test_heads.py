"""Tests of pfl/methods/heads.py."""

from __future__ import annotations

import pytest
import torch
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


class _UsersNet(nn.Sequential):
    """docs/models.md's shape of a user's model: an nn.Sequential subclass whose constructor needs arguments."""

    def __init__(self, input_shape, num_classes):
        super().__init__(nn.Flatten(), nn.Linear(input_shape[0], 6), nn.ReLU(), nn.Linear(6, num_classes))


def test_split_head_of_a_sequential_subclass_keeps_its_layers_without_calling_its_constructor():
    net = _UsersNet((5,), 3)
    body, head = split_head(net)
    assert head is net[3]
    assert list(body) == [net[0], net[1], net[2]]  # the same modules: trained in place
    x = torch.randn(4, 5)
    torch.testing.assert_close(head(body(x)), net(x))
