"""Tests of pfl/methods/fedper.py."""

from __future__ import annotations

import copy

import pytest
import torch

from pfl.methods import methods
from tests.conftest import make_loop, tiny_config
from tests.methods.registry_properties import RegistryProperties
from tests.methods_helpers import CONF, FLAGS, HALF, _fit


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedper",)


@pytest.mark.parametrize("name", ["fedper"])
def test_registered_runs_and_resumes_identically(name):
    assert name in methods()
    cfg = tiny_config(name, trainer=HALF)
    a = make_loop(cfg)
    a.run_round(), a.run_round()
    b = make_loop(cfg)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    a.run_round(), b.run_round()
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]
    for key, value in a.server.state.items():
        assert torch.equal(value, b.server[key]), key


def test_fedper_without_personal_layers_is_fedavg():
    a, b = _fit("fedavg"), _fit("fedper", {"personal_layers": 0})
    assert torch.equal(a.server["global"], b.server["global"])
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]
    c = _fit("fedper", {"personal_layers": 1})
    assert not torch.equal(a.server["global"], c.server["global"])


@pytest.mark.parametrize("name", ["fedper"])
def test_every_baseline_of_the_pgfed_code_has_an_official_config(name):
    import yaml

    from pfl.methods import method_class

    conf = yaml.safe_load((CONF / f"{name}_official.yaml").read_text())
    args = dict(conf["method"])
    method = method_class(args.pop("name"))(**args)
    assert conf["client"]["drop_last"] is True  # their loaders drop the last incomplete batch
    if hasattr(method, "client_momentum") and name not in ("perfedavg", "pfedme"):
        assert method.client_momentum in (0.0, 0.9)  # stated, so --client.momentum cannot change it
    paper = yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"]
    assert paper["name"] == conf["method"]["name"] and paper != conf["method"]


@pytest.mark.parametrize("name", ["fedper"])
def test_defaults_are_the_paper_config_and_flags_are_declared(name):
    import yaml

    from pfl.methods import method_class

    conf = dict(yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"])
    cls = method_class(conf.pop("name"))
    default = cls()
    assert {k: getattr(default, k) for k in conf} == conf  # the class defaults are the paper's, as documented
    hparams = default.hparams()
    assert hparams.items() >= conf.items()
    inherited = {k: v for k, v in hparams.items() if k not in conf}  # fixed by the subclass: reported neutral
    assert inherited.items() <= {"finetune_epochs": 0, "share_buffers": True}.items()
    assert (cls.has_global_model, cls.has_personal_model) == FLAGS[name]
    assert cls.name == name and len(cls.description) > 20


BOUNDS = [
    ("fedper", "personal_layers", 0, -1),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})
