"""Tests of pfl/methods/fedamp.py."""

from __future__ import annotations

import pytest

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedamp",)


BOUNDS = [
    ("fedamp", "alpha_k", 1e-6, 0.0),
    ("fedamp", "alpha_k", 1.0, float("inf")),
    ("fedamp", "sigma", 1e-6, 0.0),
    ("fedamp", "lam", 0.0, -0.01),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})
