"""Tests of pfl/methods/pgfed.py."""

from __future__ import annotations

import copy

import pytest
import torch

from pfl.methods import methods
from tests.conftest import make_loop, tiny_config
from tests.methods.registry_properties import RegistryProperties
from tests.methods_helpers import CONF, FLAGS, HALF, _full_grad, exchanged_round


class TestRegistryProperties(RegistryProperties):
    METHODS = ("pgfed", "pgfed_ce", "pgfedmo")


@pytest.mark.parametrize("name", ["pgfed", "pgfedmo", "pgfed_ce"])
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


def test_pgfed_alpha_stays_nonnegative_by_default():
    for name in ("pgfed", "pgfedmo", "pgfed_ce"):
        loop = make_loop(tiny_config(name, {"mu": 1.0, "eta2": 100.0}, trainer=HALF))
        for _ in range(3):
            loop.run_round()
        assert float(loop.server["alpha"].min()) == 0.0  # pushed to the bound and held there


@pytest.mark.parametrize("ce_scalar", ["per_client", "mean"])
def test_pgfed_ce_alpha_step_uses_the_server_scalars(ce_scalar):
    mu, eta2 = 0.5, 0.1
    cfg = tiny_config(
        "pgfed_ce",
        {"mu": mu, "eta2": eta2, "ce_scalar": ce_scalar},
        data={"num_clients": 3, "min_samples": 20},
        client={"epochs": 1, "batch_size": 10_000, "lr": 0.05},  # one batch: one α step
    )
    loop = make_loop(cfg)
    exchanged_round(loop)
    w = loop.server["global"].clone()
    p = loop.worker.flat.num_params
    grads, cs = [], []
    for j in range(3):
        g, f = _full_grad(loop, j, loop.clients[j]["personal"])
        grads.append(g)
        cs.append(mu * (f - float(g @ loop.clients[j]["personal"][:p])))
    dots = torch.tensor([mu * float(g @ w[:p]) for g in grads])
    if ce_scalar == "mean":
        dots = torch.full((3,), float(dots.mean()))
    expected = (1 / 3 - eta2 * (torch.tensor(cs) + dots)).clamp_min(0)
    payloads, results = exchanged_round(loop)
    for i in range(3):
        assert payloads[i]["dot"].numel() == (3 if ce_scalar == "per_client" else 1)
        torch.testing.assert_close(results[i]["alpha"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["pgfed", "pgfedmo"])
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


@pytest.mark.parametrize("name", ["pgfed", "pgfedmo", "pgfed_ce"])
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
    ("pgfed", "mu", 0.0, -0.01),
    ("pgfed", "eta2", 0.0, -0.01),
    ("pgfed", "beta", 0.0, -0.01),
    ("pgfed", "beta", 0.99, 1.0),
    ("pgfed", "alpha_init", 0.0, -0.01),
    ("pgfed_ce", "ce_scalar", "mean", "sum"),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})
