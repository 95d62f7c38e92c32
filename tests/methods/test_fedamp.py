"""Tests of pfl/methods/fedamp.py."""

from __future__ import annotations

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedamp",)
