"""Properties every registered method must have, run over the registry (a new method gets them free):
it trains end to end, the same seed gives the same numbers, a round does not depend on the order in
which its clients are trained, and a run resumed from a checkpoint ends with the uninterrupted run's
numbers (through torch.save / torch.load(weights_only=True), as --resume does)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from pfl.federation.loop import comparable_metrics
from pfl.methods import methods
from tests.conftest import make_loop, tiny_config

NAMES = sorted(methods())
TINY = {"rounds": 3, "fraction": 0.5}
# Per-FedAvg's outer step (the paper's β = 0.005) barely moves a 3-round run; a larger one shows it trains.
ARGS = {"perfedavg": {"outer_lr": 0.05}}
# PAGE's and Dap-FL's agents score on validation splits (method.reward_split: validation).
DATA = {"page": {"val_frac": 0.2}, "dapfl": {"val_frac": 0.2}}


def _config(name: str, args: dict | None = None):
    return tiny_config(name, args, trainer=TINY, data=DATA.get(name, {}))


def _state_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", NAMES)
def test_trains_end_to_end_and_is_deterministic(name):
    first = make_loop(_config(name, ARGS.get(name)))
    untrained = first.evaluate()["pm.l_loss.mean"]
    a = first.fit()
    b = make_loop(_config(name, ARGS.get(name))).fit()
    assert comparable_metrics(a) == comparable_metrics(b)
    assert a["metrics"]["pm.l_loss.mean"] < untrained, "training did not lower the personalized models' test loss"


@pytest.mark.parametrize("name", NAMES)
def test_round_does_not_depend_on_client_order(name):
    forward, backward = (make_loop(_config(name)) for _ in range(2))
    train = backward.dispatcher.train  # the local updates run in reversed id order
    backward.dispatcher.train = lambda method, r, cids, payloads: train(method, r, list(reversed(cids)), payloads)
    for _ in range(2):
        forward.run_round(), backward.run_round()
    assert _state_equal(forward.server.state, backward.server.state)
    assert _state_equal(forward.clients, backward.clients)


@pytest.mark.parametrize("name", NAMES)
def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(name):
    straight = make_loop(_config(name))
    straight.run_round()
    buffer = io.BytesIO()
    torch.save(straight.state_dict(), buffer)
    buffer.seek(0)
    resumed = make_loop(_config(name))
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for _ in range(2):
        straight.run_round(), resumed.run_round()
    assert _state_equal(straight.server.state, resumed.server.state)
    assert _state_equal(straight.clients, resumed.clients)
    assert straight.evaluate()["pm.l_acc.mean"] == resumed.evaluate()["pm.l_acc.mean"]


# (has_global_model, has_personal_model) of every method: what the evaluation reports (gm.*, P-models).
GLOBAL_ONLY = ("dapfl", "fedavg", "feddyn", "fedmgda_plus", "fedprox", "fedsam", "scaffold")
PERSONAL_ONLY = ("fedamp", "fedfomo", "fedora", "fedper", "fedrecon", "fedrep", "fesem", "fedu", "ifca", "lgfedavg")
PERSONAL_ONLY += ("local", "pfedhn", "plgu_ghn", "plgu_grep")
FLAGS = {n: (True, False) for n in GLOBAL_ONLY} | {n: (False, True) for n in PERSONAL_ONLY}


@pytest.mark.parametrize("name", NAMES)
def test_declares_what_it_is_evaluated_on_and_describes_itself(name):
    from pfl.methods import method_class

    cls = method_class(name)
    assert (cls.has_global_model, cls.has_personal_model) == FLAGS.get(name, (True, True))
    assert type(cls.has_global_model) is bool and type(cls.has_personal_model) is bool
    assert cls.name == name and isinstance(cls.description, str) and len(cls.description) > 20


CONF = Path(__file__).resolve().parents[1] / "conf" / "method"


@pytest.mark.parametrize("name", NAMES)
def test_class_defaults_are_the_settings_of_its_config_file(name):
    """conf/method/<name>.yaml is the paper's setting, and the class defaults say the same."""
    import yaml

    from pfl.methods import method_class

    conf = dict(yaml.safe_load((CONF / f"{name}.yaml").read_text())["method"])
    default = method_class(conf.pop("name"))()
    assert {k: getattr(default, k) for k in conf} == conf
    if "finetune_epochs" not in conf:  # fixed by the class: no fine-tuning
        assert default.hparams().get("finetune_epochs", 0) == 0
