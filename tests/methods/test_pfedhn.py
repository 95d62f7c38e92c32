"""Tests of pfl/methods/pfedhn.py."""

from __future__ import annotations

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("pfedhn", "plgu_ghn")
