"""Tests of pfl/methods/fedbabu.py."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import (
    HALF,
    check_defaults_are_the_paper_config_and_flags_are_declared,
    check_every_baseline_of_the_pgfed_code_has_an_official_config,
    check_hyperparameters_are_checked_at_their_bounds,
    check_registered_runs_and_resumes_identically,
    exchanged_round,
)
from tests.methods.registry_properties import RegistryProperties


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedbabu",)


@pytest.mark.parametrize("name", ["fedbabu"])
def test_registered_runs_and_resumes_identically(name):
    check_registered_runs_and_resumes_identically(name)


def test_fedbabu_head_stays_at_init_and_only_the_body_is_exchanged():
    loop = make_loop(tiny_config("fedbabu", trainer=HALF))
    head = loop.worker.flat.layout.tail(1)
    for _ in range(3):
        payloads, results = exchanged_round(loop)
    assert torch.equal(loop.server["global"][head], loop.init_state[head])
    assert not torch.equal(loop.server["global"][: head.start], loop.init_state[: head.start])
    for r in results.values():
        assert r.state.numel() == head.start  # body only (the MLP has no buffers)
    personal = loop.method.personal_state(loop.server, loop.client(0))  # fine-tuned: the head moves
    assert not torch.equal(personal[head], loop.init_state[head])


@pytest.mark.parametrize("name", ["fedbabu"])
def test_every_baseline_of_the_pgfed_code_has_an_official_config(name):
    check_every_baseline_of_the_pgfed_code_has_an_official_config(name)


@pytest.mark.parametrize("name", ["fedbabu"])
def test_defaults_are_the_paper_config_and_flags_are_declared(name):
    check_defaults_are_the_paper_config_and_flags_are_declared(name)


BOUNDS = [
    ("fedbabu", "head_layers", 0, -1),
    ("fedbabu", "finetune_epochs", 0, -1),
    ("fedbabu", "finetune_lr", 1e-6, 0.0),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    check_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad)
