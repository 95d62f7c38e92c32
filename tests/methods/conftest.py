"""Adds to each method module's test file its ``TestRegistryProperties`` (``registry_properties.properties_of``)
and runs it once per method it names (``METHODS``), or once per entry of the data attribute a property is
marked with (``registry_properties.over``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pfl.models import ModelConfig
from tests.methods.defaults_learn import run_defaults
from tests.methods.registry_properties import properties_of

HERE = Path(__file__).resolve().parent


class MethodTestFile(pytest.Module):
    """``test_<module>.py``: its own tests, then the registry-wide properties of the methods
    ``pfl/methods/<module>.py`` registers."""

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        properties = properties_of(self.path.stem.removeprefix("test_"))
        if properties is not None:  # collected like a class written in the file
            setattr(self.obj, properties.__name__, properties)
        return super().collect()


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.parent != HERE or not module_path.name.startswith("test_"):
        return None
    return MethodTestFile.from_parent(parent, path=module_path)


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
