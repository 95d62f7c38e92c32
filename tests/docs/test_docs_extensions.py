"""The "Adding one" examples of docs/methods.md (an aggregator), docs/data.md (a data source) and
docs/metrics.md (an evaluation protocol) run as printed: each block is executed as a user's module
(no edit of pfl), found by its import path, validated from its registry, and does what its page says."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from pfl.config import AGGREGATORS, PROTOCOLS, ServerConfig, validate
from pfl.data import build_data
from pfl.data.sources import SOURCES
from pfl.errors import ConfigError
from pfl.federation.loop import comparable_metrics
from pfl.federation.robust import RobustRule
from pfl.federation.transforms import UploadStep, apply_transforms
from pfl.methods import Upload
from pfl.methods.fedavg import FedAvg
from tests.conftest import make_loop, tiny_config

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKER = "<!-- runnable: tests/docs/test_docs_extensions.py executes this block as the module "
HALF = {"rounds": 2, "fraction": 0.5}  # 6 clients, 3 a round


def runnable_block(text: str, module: str) -> str:
    """The ```python block right after the page's runnable marker for ``module``."""
    found = re.search(re.escape(MARKER + module) + r"[^\n]*\n```python\n(.*?)\n```", text, re.S)
    assert found, f"the page lost its runnable block for {module} (the marker and the python block after it)"
    return found.group(1)


def load_block(monkeypatch, page: str, module_name: str) -> types.ModuleType:
    """The page's block executed as the user's module ``module_name`` (importable by that name)."""
    path = DOCS / page
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, module_name, module)
    exec(compile(runnable_block(path.read_text(encoding="utf-8"), module_name), str(path), "exec"), module.__dict__)
    return module


@pytest.fixture(autouse=True)
def fresh_registries(monkeypatch):
    """Entries registered by a test leave with it."""
    for registry in (AGGREGATORS, SOURCES, PROTOCOLS):
        monkeypatch.setattr(registry, "_entries", registry.entries())


# -- docs/methods.md: an aggregator ---------------------------------------------------------------
@pytest.fixture
def my_rules(monkeypatch) -> types.ModuleType:
    return load_block(monkeypatch, "methods.md", "my_rules")


def test_the_page_aggregator_drops_the_upload_farthest_from_the_median(my_rules):
    rows = [[1.0, 0.0], [2.0, 1.0], [40.0, -30.0], [3.0, 2.0]]
    uploads = {c: Upload(torch.tensor(r), weight=1.0) for c, r in zip((4, 1, 9, 2), rows, strict=True)}
    kept = RobustRule(ServerConfig(aggregator="my_rules.farthest_out")).apply(uploads, FedAvg(), None)  # type: ignore[arg-type]
    assert kept == {c: uploads[c] for c in (1, 2, 4)}  # client 9 is the far one
    assert AGGREGATORS.get("my_rules.farthest_out") is AGGREGATORS.get("farthest_out")


def test_the_page_aggregator_trains_by_its_import_path(my_rules):
    cfg = tiny_config("fedavg", trainer=HALF, server={"aggregator": "my_rules.farthest_out"})
    validate(cfg)
    loop = make_loop(cfg)
    gen = torch.Generator().manual_seed(0)
    uploads = {c: Upload(torch.randn(loop.server.layout.size, generator=gen), float(c + 1)) for c in (0, 2, 5)}
    uploads[2] = Upload(uploads[2].state * 50, 3.0)
    transformed = apply_transforms(loop.transforms, uploads, UploadStep(loop.method, loop.server, {}, 0))
    loop.aggregate(transformed.received, transformed.combined)
    expected = (1 * uploads[0].state + 6 * uploads[5].state) / 7  # FedAvg's weighted mean of the two kept
    torch.testing.assert_close(loop.server["global"], expected, rtol=0, atol=1e-6)
    loop.fit()


def test_the_page_aggregator_checks_the_clients_per_round(my_rules):
    cfg = tiny_config("fedavg", trainer={"clients_per_round": 1}, server={"aggregator": "my_rules.farthest_out"})
    with pytest.raises(ConfigError, match=r"^server.aggregator: farthest_out drops one upload .* \(1 per round\)"):
        make_loop(cfg)


def test_a_taken_aggregator_name_is_refused_in_one_line(my_rules, monkeypatch):
    load_block(monkeypatch, "methods.md", "my_rules")  # the same module imported again replaces itself
    with pytest.raises(ValueError, match=r"^two aggregators are named 'median': pfl.federation.robust.median and "):
        AGGREGATORS.add("median", AGGREGATORS.get("farthest_out"))
    assert "\n" not in str(pytest.raises(ValueError, AGGREGATORS.add, "mean", AGGREGATORS.get("median")).value)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("medain", "server.aggregator: unknown aggregator 'medain' (did you mean median?)"),
        ("my_rules.nowhere", "server.aggregator: cannot import 'my_rules.nowhere'"),
        ("my_rules.at_least_two", "server.aggregator: 'my_rules.at_least_two' is not a registered aggregator"),
    ],
)
def test_an_unknown_aggregator_is_refused_before_training(my_rules, name, message):
    with pytest.raises(ConfigError) as err:
        validate(tiny_config("fedavg", server={"aggregator": name}))
    assert str(err.value).startswith(message)


# -- docs/data.md: a data source ------------------------------------------------------------------
@pytest.fixture
def my_sources(monkeypatch) -> types.ModuleType:
    return load_block(monkeypatch, "data.md", "my_sources")


def test_the_page_source_gives_its_clients_by_its_import_path(my_sources):
    cfg = tiny_config("fedavg", trainer=HALF, data={"source": "my_sources.blobs"})
    validate(cfg)
    data, again = build_data(cfg.data, seed=0), build_data(cfg.data, seed=0)
    assert data.num_clients == 6 and data.num_classes == 3
    assert torch.equal(data.x, again.x) and torch.equal(data.y, again.y)  # the seed's generator only
    sizes = [len(c.train) + len(c.test) + len(c.val) for c in data.clients]
    # natural: the source's 60 samples a client, not a partition of a pool; 10 % of each to the global test
    assert sizes == [54] * 6 and len(data.global_test) == 36
    means = [float(data.x[torch.cat([c.train, c.test])].mean()) for c in data.clients]
    assert means == sorted(means)  # client k is shifted by 0.5·k
    summary = make_loop(cfg).fit()
    assert summary["metrics"]["pm.l_acc.mean"] > 1 / 3


def test_the_page_source_flags_drive_validation(my_sources):
    with pytest.raises(ConfigError, match="data.big_client_frac: my_sources.blobs is naturally federated"):
        validate(tiny_config("fedavg", data={"source": "my_sources.blobs", "big_client_frac": 0.3}))
    with pytest.raises(ConfigError, match="data.rotation_groups: blobs has no images to rotate"):
        validate(tiny_config("fedavg", data={"source": "blobs", "rotation_groups": 2}))
    with pytest.raises(ConfigError, match=r"data.source: unknown data source 'blob' \(did you mean blobs\?\)"):
        validate(tiny_config("fedavg", data={"source": "blob"}))


def test_a_taken_source_name_is_refused_in_one_line(my_sources):
    with pytest.raises(ValueError, match=r"^two data sources are named 'digits': pfl.data.sources._bundled.<locals>"):
        SOURCES.add("digits", SOURCES.get("blobs"))


def test_the_built_in_sources_keep_their_flags():
    entries = SOURCES.entries()
    natural = {"synthetic", "shakespeare", "leaf_shakespeare", "femnist", "npz_dir", "synthetic_regression"}
    assert {n for n, e in entries.items() if e.natural} == natural
    assert {n for n, e in entries.items() if not e.rotatable} == {"synthetic", "shakespeare", "leaf_shakespeare"}
    on_disk = {"mnist", "fmnist", "cifar10", "cifar100", "tiny_imagenet", "gtsrb"}
    assert {n for n, e in entries.items() if e.official_test} == on_disk
    assert {n for n, e in entries.items() if e.needs_root} == on_disk | {"leaf_shakespeare", "femnist", "npz_dir"}


# -- docs/metrics.md: an evaluation protocol -------------------------------------------------------
@pytest.fixture
def my_protocols(monkeypatch) -> types.ModuleType:
    return load_block(monkeypatch, "metrics.md", "my_protocols")


def test_the_page_protocol_adds_its_key_and_changes_no_other(my_protocols):
    plain = make_loop(tiny_config("fedavg", trainer=HALF))
    cfg = tiny_config("fedavg", trainer=HALF, eval={"protocols": ["local", "global", "new", "my_protocols.train_fit"]})
    validate(cfg)
    loop = make_loop(cfg)
    base, extended = comparable_metrics(plain.fit()), comparable_metrics(loop.fit())
    train_fit = extended.pop("train_fit.acc.mean")
    assert extended == base
    state = loop.method.global_state(loop.server)  # FedAvg's P-model is its global model
    accuracies = [loop.worker.evaluate(state, c.train).acc for c in loop.worker.data.clients]
    assert train_fit == loop.history[-1]["train_fit.acc.mean"] == pytest.approx(np.mean(accuracies), abs=1e-12)


def test_a_protocol_keeps_to_its_own_prefix_and_name(my_protocols, monkeypatch):
    from pfl.metrics import protocol

    @protocol("stray")
    def stray(ctx):
        return {"pm.l_acc.mean": 1.0}

    loop = make_loop(tiny_config("fedavg", trainer=HALF, eval={"protocols": ["local", "stray"]}))
    with pytest.raises(
        ValueError, match=r"^protocol 'stray' returned keys outside its prefix 'stray.': \['pm.l_acc.mean'\]"
    ):
        loop.fit()
    with pytest.raises(ValueError, match=r"^two protocols are named 'local': "):
        protocol("local")(stray)
    with pytest.raises(ConfigError, match=r"eval.protocols: unknown protocol 'globl' \(did you mean global\?\)"):
        validate(tiny_config("fedavg", eval={"protocols": ["local", "globl"]}))
