"""Tests of pfl/methods/plgu.py."""

from __future__ import annotations

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("plgu_grep", "plgu_lf")
