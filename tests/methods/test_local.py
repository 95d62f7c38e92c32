"""Tests of pfl/methods/local.py."""

from __future__ import annotations

import pytest

from tests.methods.registry_properties import RegistryProperties
from tests.methods_helpers import CONF, FLAGS


class TestRegistryProperties(RegistryProperties):
    METHODS = ("local",)


@pytest.mark.parametrize("name", ["local"])
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


@pytest.mark.parametrize("name", ["local"])
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
