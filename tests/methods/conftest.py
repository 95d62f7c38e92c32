"""Runs each method file's ``TestRegistryProperties`` once per method it names (``METHODS``)."""

from __future__ import annotations

import pytest

from pfl.models import ModelConfig
from tests.methods.defaults_learn import run_defaults


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    methods = getattr(metafunc.cls, "METHODS", None)
    if methods is not None and "name" in metafunc.fixturenames:
        metafunc.parametrize("name", methods)


@pytest.fixture(scope="session")
def fedavg_run() -> tuple[dict[str, float], int]:
    """FedAvg's defaults on the short default experiment: the reference every method's floor comes from."""
    return run_defaults("fedavg")


@pytest.fixture
def bn_model() -> ModelConfig:
    """The MLP with one BatchNorm layer (tests/methods/helpers.py's ``bn_mlp``): a model with float buffers."""
    return ModelConfig(name="tests.methods.helpers:bn_mlp")
