"""Tests of pfl/methods/fedsam.py."""

from __future__ import annotations

import pytest
import torch

from tests.methods.helpers import check_hyperparameters_are_checked_at_their_bounds
from tests.methods.helpers import fit_half_momentum as _fit
from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedsam",)


# -- identities -----------------------------------------------------------------------------------
def test_fedsam_with_rho_zero_is_fedavg_and_with_rho_not():
    fedavg = _fit("fedavg")
    assert torch.equal(fedavg.server["global"], _fit("fedsam", {"rho": 0.0}).server["global"])
    assert not torch.equal(fedavg.server["global"], _fit("fedsam").server["global"])


BOUNDS = [
    ("fedsam", "rho", 0.0, -0.01),
    ("fedsam", "p", 1.0, 0.99),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    check_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad)
