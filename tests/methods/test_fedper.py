"""Tests of pfl/methods/fedper.py."""

from __future__ import annotations

import torch

from tests.methods.helpers import (
    _fit,
)


def test_fedper_without_personal_layers_is_fedavg():
    a, b = _fit("fedavg"), _fit("fedper", {"personal_layers": 0})
    assert torch.equal(a.server["global"], b.server["global"])
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]
    c = _fit("fedper", {"personal_layers": 1})
    assert not torch.equal(a.server["global"], c.server["global"])
