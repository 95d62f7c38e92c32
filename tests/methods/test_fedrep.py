"""Tests of pfl/methods/fedrep.py."""

from __future__ import annotations

import copy

import pytest
import torch

from pfl.methods import methods
from pfl.methods.base import ClientContext
from tests.conftest import make_loop, tiny_config
from tests.methods.registry_properties import RegistryProperties
from tests.methods_helpers import CONF, FLAGS, HALF, SYNTHETIC, _fit


class TestRegistryProperties(RegistryProperties):
    METHODS = ("fedrep",)


@pytest.mark.parametrize("name", ["fedrep"])
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


@pytest.mark.parametrize("data", [{}, SYNTHETIC])
def test_fedrep_head_epochs_leave_the_body_untouched(monkeypatch, data):
    calls = []
    original = ClientContext.fit

    def spy(self, start, **kw):
        out = original(self, start, **kw)
        calls.append((kw.get("purpose", "train"), start.clone(), out.clone()))
        return out

    monkeypatch.setattr(ClientContext, "fit", spy)
    loop = make_loop(tiny_config("fedrep", {"head_epochs": 2}, trainer=HALF, data=data))
    loop.run_round()
    head = loop.worker.flat.layout.tail(1)
    body = slice(0, head.start)
    heads = [c for c in calls if c[0] == "head"]
    bodies = [c for c in calls if c[0] == "train"]
    assert heads and len(heads) == len(bodies)
    for (_, s, o), (_, s2, o2) in zip(heads, bodies, strict=True):
        assert torch.equal(o[body], s[body]) and not torch.equal(o[head], s[head])
        assert torch.equal(s2, o) and torch.equal(o2[head], s2[head]) and not torch.equal(o2[body], s2[body])


def test_fedrep_one_head_epoch_trains_the_head_before_the_body():
    a, b = _fit("fedrep", {"head_epochs": 0}), _fit("fedrep", {"head_epochs": 1})
    assert not torch.equal(a.server["global"], b.server["global"])


@pytest.mark.parametrize("head_epochs", [0, 2])
def test_fedrep_fits_the_head_only_when_asked(head_epochs):
    """No empty head fit at head_epochs 0: it would add a 0.0 loss to the round's mean train loss."""
    loop = make_loop(tiny_config("fedrep", {"head_epochs": head_epochs}))
    ctx = loop.client(1)
    loop.method.local_update(ctx, loop.method.payload(loop.server, 1))
    batches = len(list(ctx.batches()))
    assert [f.steps for f in ctx.fits] == [head_epochs * batches] * (head_epochs > 0) + [batches]


def test_fedrep_new_client_learns_its_head_on_the_frozen_body_then_optionally_the_body():
    for adapt_body in (False, True):
        data = {"num_clients": 8, "new_clients": 0.25}
        loop = make_loop(tiny_config("fedrep", {"adapt_body": adapt_body}, data=data))
        loop.run_round()
        n = loop.server.num_clients
        ctx = ClientContext(n, loop.round, loop.worker, {}, loop.init_state)
        head = loop.worker.flat.layout.head
        adapted = loop.method.adapt_new_client(loop.server, ctx, 2)
        assert not torch.equal(adapted[head], loop.init_state[head])
        assert torch.equal(adapted[: head.start], loop.server["global"][: head.start]) != adapt_body


@pytest.mark.parametrize("name", ["fedrep"])
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


@pytest.mark.parametrize("name", ["fedrep"])
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
    ("fedrep", "head_epochs", 0, -1),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})
