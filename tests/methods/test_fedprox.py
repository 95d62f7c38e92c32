"""Tests of pfl/methods/fedprox.py."""

from __future__ import annotations

import pytest

from tests.methods.registry_properties import RegistryProperties
from tests.methods_helpers import CONF, FLAGS


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedprox",)


@pytest.mark.parametrize("name", ["fedprox"])
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
    ("fedprox", "mu", 0.0, -0.01),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})
