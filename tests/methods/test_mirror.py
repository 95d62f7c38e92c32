"""The method tests mirror the method modules: ``pfl/methods/<module>.py`` is tested by
``tests/methods/test_<module>.py``, whose ``TestRegistryProperties`` names exactly the methods the module
registers, so every registered method gets the registry-wide properties and a mutation target is a file."""

from __future__ import annotations

import importlib
from pathlib import Path

from pfl.methods import method_class, methods
from tests.methods.defaults_learn import floors
from tests.methods.registry_properties import RegistryProperties

HERE = Path(__file__).resolve().parent


def _registered_by_module() -> dict[str, set[str]]:
    by_module: dict[str, set[str]] = {}
    for name in methods():
        by_module.setdefault(method_class(name).__module__.rsplit(".", 1)[-1], set()).add(name)
    return by_module


def test_every_method_module_has_its_test_file_checking_exactly_its_methods():
    for module, names in _registered_by_module().items():
        path = HERE / f"test_{module}.py"
        assert path.exists(), f"pfl/methods/{module}.py registers {sorted(names)} but {path.name} is missing"
        tests = importlib.import_module(f"tests.methods.test_{module}")
        checked = getattr(tests, "TestRegistryProperties", None)
        assert checked is not None and issubclass(checked, RegistryProperties), (
            f"{path.name}: no TestRegistryProperties"
        )
        assert set(checked.METHODS) == names, f"{path.name} checks {sorted(checked.METHODS)}, not {sorted(names)}"


def test_the_floor_is_well_above_chance(fedavg_run):
    reference, classes = fedavg_run
    assert all(floor >= 3.0 / classes for floor in floors(reference, classes).values())
