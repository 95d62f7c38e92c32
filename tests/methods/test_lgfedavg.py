"""Tests of pfl/methods/lgfedavg.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from pfl.methods import methods
from tests.conftest import make_loop, tiny_config
from tests.methods.registry_properties import RegistryProperties
from tests.methods_helpers import CONF, FLAGS, HALF, SYNTHETIC, _fit, _one_client_loop, exchanged_round
from tests.methods_reference import drawn_batches, flat_params, initial_net


class TestRegistryProperties(RegistryProperties):
    METHODS = ("lgfedavg",)


@pytest.mark.parametrize("name", ["lgfedavg"])
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


def test_lgfedavg_with_all_layers_global_is_fedavg():
    a, b = _fit("fedavg"), _fit("lgfedavg", {"global_layers": 2})  # the tiny MLP has 2 layers
    assert torch.equal(a.server["global"], b.server["global"])
    assert a.evaluate()["pm.l_acc.mean"] == b.evaluate()["pm.l_acc.mean"]


def test_lgfedavg_shares_only_its_global_layers():
    loop = make_loop(tiny_config("lgfedavg", {"global_layers": 1}, trainer=HALF))
    head = loop.worker.flat.layout.head
    for _ in range(2):
        payloads, uploads = exchanged_round(loop)
    for cid, u in uploads.items():
        assert u.state.numel() == head.stop - head.start  # the classifier only
        assert torch.equal(payloads[cid]["shared"], payloads[next(iter(payloads))]["shared"])
    total = sum(u.weight for u in uploads.values())
    mean = sum(u.state * (u.weight / total) for u in uploads.values())
    torch.testing.assert_close(loop.server["global"][head], mean)
    assert torch.equal(loop.server["global"][: head.start], loop.init_state[: head.start])  # never averaged
    bodies = [loop.clients[c]["personal"][: head.start] for c in uploads]
    assert not torch.equal(bodies[0], bodies[1])  # each representation stays with its client
    for cid in uploads:
        pm = loop.method.personal_state(loop.server, loop.client(cid))
        assert torch.equal(pm[head], loop.server["global"][head])
        assert torch.equal(pm[: head.start], loop.clients[cid]["personal"][: head.start])


@pytest.mark.parametrize("data", [{}, SYNTHETIC])
def test_lgfedavg_alternating_steps_match_the_authors_loop(data):
    args = {"global_layers": 1, "alternate": True}
    cfg, loop = _one_client_loop("lgfedavg", args, data={**data, "num_clients": 1}, momentum=0.9)
    net = initial_net(cfg, loop)
    head, body = list(net[-1].parameters()), [p for m in list(net)[:-1] for p in m.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    data, idx = loop.worker.data, loop.worker.data.clients[0].train
    for b in drawn_batches(cfg.seed, 0, 0, "train", idx, 16):
        for frozen in (head, body):
            opt.zero_grad()
            F.cross_entropy(net(data.x[b]), data.y[b]).backward()
            for p in frozen:
                p.grad.zero_()  # zeroed, not None: momentum still moves the frozen part
            opt.step()
    torch.testing.assert_close(loop.clients[0]["personal"], flat_params(net), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lgfedavg"])
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


@pytest.mark.parametrize("name", ["lgfedavg"])
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
    ("lgfedavg", "global_layers", 0, -1),
]


@pytest.mark.parametrize(("name", "field", "ok", "bad"), BOUNDS)
def test_hyperparameters_are_checked_at_their_bounds(name, field, ok, bad):
    from pfl.errors import ConfigError
    from pfl.methods import method_class

    cls = method_class(name)
    assert getattr(cls(**{field: ok}), field) == ok
    with pytest.raises(ConfigError, match=f"method.{field}"):
        cls(**{field: bad})
