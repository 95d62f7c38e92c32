"""Tests of pfl/methods/fedala.py."""

from __future__ import annotations

import pytest

from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedala",)


BOUNDS = [
    ("fedala", "eta", 0.0, -0.01),
    ("fedala", "rand_percent", 0.5, 0.0),
    ("fedala", "rand_percent", 100.0, 100.01),
    ("fedala", "layer_idx", 0, -1),
    ("fedala", "threshold", 0.0, -0.01),
    ("fedala", "num_pre_loss", 1, 0),
    ("fedala", "max_start_epochs", 1, 0),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})
