"""Tests of pfl/methods/fedprox.py."""

from __future__ import annotations

import pytest

from tests.methods.helpers import (
    check_defaults_are_the_paper_config_and_flags_are_declared,
    check_hyperparameters_are_checked_at_their_bounds,
)
from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedprox",)


@pytest.mark.parametrize("name", ["fedprox"])
def test_defaults_are_the_paper_config_and_flags_are_declared(name):
    check_defaults_are_the_paper_config_and_flags_are_declared(name)


BOUNDS = [
    ("fedprox", "mu", 0.0, -0.01),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    check_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad)
