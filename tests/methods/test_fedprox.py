"""Tests of pfl/methods/fedprox.py."""

from __future__ import annotations

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedprox",)
    PAPER_DEFAULTS = ("fedprox",)
    BOUNDS = (("fedprox", "mu", 0.0, -0.01),)
