"""Tests of pfl/methods/fedmgda.py."""

from __future__ import annotations

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedmgda_plus",)
