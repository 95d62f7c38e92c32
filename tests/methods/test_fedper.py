"""Tests of pfl/methods/fedper.py."""

from __future__ import annotations

import pytest
import torch

from tests.methods.helpers import (
    _fit,
    check_defaults_are_the_paper_config_and_flags_are_declared,
    check_every_baseline_of_the_pgfed_code_has_an_official_config,
    check_hyperparameters_are_checked_at_their_bounds,
    check_registered_runs_and_resumes_identically,
)
from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedper",)


@pytest.mark.parametrize("name", ["fedper"])
def test_registered_runs_and_resumes_identically(name):
    check_registered_runs_and_resumes_identically(name)


def test_fedper_without_personal_layers_is_fedavg():
    a, b = _fit("fedavg"), _fit("fedper", {"personal_layers": 0})
    assert torch.equal(a.server["global"], b.server["global"])
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]
    c = _fit("fedper", {"personal_layers": 1})
    assert not torch.equal(a.server["global"], c.server["global"])


@pytest.mark.parametrize("name", ["fedper"])
def test_every_baseline_of_the_pgfed_code_has_an_official_config(name):
    check_every_baseline_of_the_pgfed_code_has_an_official_config(name)


@pytest.mark.parametrize("name", ["fedper"])
def test_defaults_are_the_paper_config_and_flags_are_declared(name):
    check_defaults_are_the_paper_config_and_flags_are_declared(name)


BOUNDS = [
    ("fedper", "personal_layers", 0, -1),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    check_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad)
