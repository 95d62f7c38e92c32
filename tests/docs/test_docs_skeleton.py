"""The complete method of docs/methods.md runs as printed: executed as a user's module (no edit of
pfl, no registration), it trains end to end through its import path, equals FedAvg bit for bit with
μ = 0, departs from it with μ > 0, and then equals pfl's own FedProx."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch

from pfl.errors import ConfigError
from pfl.federation.loop import comparable_metrics
from pfl.methods import class_path, method_class, methods
from tests.conftest import make_loop, tiny_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "methods.md"
MARKER = "<!-- runnable: tests/docs/test_docs_skeleton.py"
MODULE = "prox_pull"  # the file name the page tells the reader to save it under
TRAINER = {"rounds": 2, "fraction": 0.5}


def runnable_block(text: str) -> str:
    """The ```python block right after the page's runnable marker."""
    found = re.search(re.escape(MARKER) + r"[^\n]*\n```python\n(.*?)\n```", text, re.S)
    assert found, f"docs/methods.md lost its runnable block (the {MARKER!r} marker and the python block after it)"
    return found.group(1)


@pytest.fixture
def prox_pull(monkeypatch) -> type:
    """The block executed as the user's module ``prox_pull``, importable as ``prox_pull.ProxPull``."""
    module = types.ModuleType(MODULE)
    module.__file__ = str(DOC)
    monkeypatch.setitem(sys.modules, MODULE, module)
    exec(compile(runnable_block(DOC.read_text(encoding="utf-8")), str(DOC), "exec"), module.__dict__)
    return module.ProxPull


def run(method: str, args: dict | None = None) -> tuple[dict, torch.Tensor]:
    loop = make_loop(tiny_config(method, args, trainer=TRAINER))
    summary = loop.fit()
    return comparable_metrics(summary), loop.server["global"]


def test_the_page_method_runs_by_its_import_path_and_is_not_registered(prox_pull):
    path = f"{MODULE}.{prox_pull.__qualname__}"
    assert method_class(path) is prox_pull and class_path(prox_pull) == path  # what config.yaml records
    assert prox_pull.name not in methods()
    with pytest.raises(ConfigError, match="method.mu: must be >= 0"):
        prox_pull(mu=-1.0)


def test_the_page_method_is_fedavg_at_mu_0_and_fedprox_otherwise(prox_pull):
    path = f"{MODULE}.{prox_pull.__qualname__}"
    fedavg_metrics, fedavg_global = run("fedavg")
    zero_metrics, zero_global = run(path, {"mu": 0.0})
    assert torch.equal(zero_global, fedavg_global)
    assert zero_metrics == fedavg_metrics

    pulled_metrics, pulled_global = run(path, {"mu": 0.5})
    fedprox_metrics, fedprox_global = run("fedprox", {"mu": 0.5})
    assert not torch.equal(pulled_global, fedavg_global)
    assert torch.equal(pulled_global, fedprox_global)
    assert pulled_metrics == fedprox_metrics


def test_the_runnable_block_is_found_only_after_its_marker():
    page = f"```python\nfirst = 1\n```\n{MARKER} -->\n```python\nsecond = 2\n```\n"
    assert runnable_block(page) == "second = 2"
    with pytest.raises(AssertionError, match="lost its runnable block"):
        runnable_block("```python\nfirst = 1\n```\n")
