"""Tests of pfl/methods/local.py."""

from __future__ import annotations

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("local",)
    OFFICIAL_CONFIGS = ("local",)
    PAPER_DEFAULTS = ("local",)
