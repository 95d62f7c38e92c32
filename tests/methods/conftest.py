"""Runs each method file's ``TestRegistryProperties`` once per method it names (``METHODS``), or once per
entry of the data attribute a property is marked with (``registry_properties.over``)."""

from __future__ import annotations

import pytest

from pfl.models import ModelConfig
from tests.methods.defaults_learn import run_defaults


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if getattr(metafunc.cls, "METHODS", None) is None or "name" not in metafunc.fixturenames:
        return
    attribute, argnames = getattr(metafunc.function, "parametrized_by", ("METHODS", "name"))
    metafunc.parametrize(argnames, getattr(metafunc.cls, attribute))


@pytest.fixture(scope="session")
def fedavg_run() -> tuple[dict[str, float], int]:
    """FedAvg's defaults on the short default experiment: the reference every method's floor comes from."""
    return run_defaults("fedavg")


@pytest.fixture
def bn_model() -> ModelConfig:
    """The MLP with one BatchNorm layer (tests/methods/helpers.py's ``bn_mlp``): a model with float buffers."""
    return ModelConfig(name="tests.methods.helpers:bn_mlp")
