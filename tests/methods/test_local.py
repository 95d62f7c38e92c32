"""Tests of pfl/methods/local.py."""

from __future__ import annotations

import pytest

from tests.methods.helpers import (
    check_defaults_are_the_paper_config_and_flags_are_declared,
    check_every_baseline_of_the_pgfed_code_has_an_official_config,
)
from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("local",)


@pytest.mark.parametrize("name", ["local"])
def test_every_baseline_of_the_pgfed_code_has_an_official_config(name):
    check_every_baseline_of_the_pgfed_code_has_an_official_config(name)


@pytest.mark.parametrize("name", ["local"])
def test_defaults_are_the_paper_config_and_flags_are_declared(name):
    check_defaults_are_the_paper_config_and_flags_are_declared(name)
