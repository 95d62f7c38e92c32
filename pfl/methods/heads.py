"""Helpers for methods that treat the classifier head specially (FedRoD). Two network shapes qualify:
an ``nn.Sequential`` whose last module is the linear classifier (mlp, cnn, logreg, timm backbones), or
a module with a ``features(x)`` method and a linear ``head`` registered last, whose forward is
``head(features(x))`` (char_lstm; a user's model opts in the same way)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from torch import Tensor, nn

from pfl.errors import ConfigError


def split_head(net: nn.Module) -> tuple[Callable[[Tensor], Tensor], nn.Linear]:
    """(features, head) of a network whose output is ``head(features(x))`` with a linear head."""
    if isinstance(net, nn.Sequential) and isinstance(net[-1], nn.Linear):
        # A plain Sequential of the same children: slicing (``net[:-1]``) would call the class's own
        # constructor, which a user's subclass (``MyNet(input_shape, num_classes)``) does not take empty.
        body = list(net.named_children())[:-1]
        return nn.Sequential(OrderedDict(body)), net[-1]
    head, features = getattr(net, "head", None), getattr(net, "features", None)
    if isinstance(head, nn.Linear) and callable(features):
        # The layout's head slice is the last parametrised layer: the head must be it.
        params = list(net.parameters())
        own = list(head.parameters())
        if all(a is b for a, b in zip(params[-len(own) :], own, strict=True)):
            return features, head
    raise ConfigError(
        "model.name",
        "this method needs a model whose output is a linear classifier on features: an nn.Sequential "
        "ending in nn.Linear, or a module with features(x) and a linear `head` registered last",
        "use mlp, cnn, logreg, char_lstm or a timm backbone, or give your model features() and head",
    )
