"""Tests of pfl/methods/pgfed.py."""

from __future__ import annotations

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("pgfed", "pgfed_ce", "pgfedmo")
