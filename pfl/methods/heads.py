"""Helpers for methods that treat the classifier head specially (FedRoD): the network must be an
``nn.Sequential`` whose last module is the linear classifier."""

from __future__ import annotations

from torch import nn

from pfl.errors import ConfigError


def split_head(net: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """(body, head) of a Sequential classifier ending in nn.Linear."""
    if not isinstance(net, nn.Sequential) or not isinstance(net[-1], nn.Linear):
        raise ConfigError(
            "model.name", "this method needs a model whose last layer is a linear classifier", "use mlp, cnn or logreg"
        )
    return net[:-1], net[-1]
