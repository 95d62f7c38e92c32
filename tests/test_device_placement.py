"""Every registered method trains, is evaluated (every protocol, held-out clients included) and resumes
on a stand-in for a CUDA device (tests/helpers/device_tags.py): no tensor of the host meets one of the training
device where CUDA would refuse it. Sequentially and, where the method's fits stack, in lockstep (the
vectorized path a CUDA run takes by default)."""

from __future__ import annotations

import pytest

from pfl.methods.registry import methods
from tests.conftest import tiny_config
from tests.helpers.device_tags import is_on_device, loop_on_device, training_device

FAST_AGENTS = {"warmup": 1, "ddpg_batch_size": 2}  # PAGE's and Dap-FL's agents act and learn in round 2
# FedALA's first aggregation passes over the data until its losses settle (up to 100 passes): 3 here.
OPTIONS = {"page": FAST_AGENTS, "dapfl": FAST_AGENTS, "fedala": {"max_start_epochs": 3, "num_pre_loss": 2}}
# Options whose code paths the defaults leave out: personalized directions, the server agent acting on
# last round's accuracies and replaying its weights, a client acting on this round's model, the
# authors' action map and warm-up.
VARIANTS = [
    ("fedpg", {"gamma": 0.3, "history_max_age": 1}),
    ("sfedpg", {"gamma": 0.3}),
    ("page", {**FAST_AGENTS, "server_lag": 1, "client_lag": 0, "replay_actions": "mapped"}),
    ("page", {**FAST_AGENTS, "actions": "random"}),
    ("dapfl", {**FAST_AGENTS, "action_map": "clip", "warmup_space": "hparams", "lr_max": 0.5}),
]


# Validation splits (the agents score on them), held-out clients and every evaluation protocol.
DATA = {"val_frac": 0.2, "new_clients": 0.34, "global_test_frac": 0.1}
EVAL = {"protocols": ["local", "sg", "global", "new"], "pm_source": "local_update", "select": "best_val"}


def run_on_device(name: str, options: dict, vectorize: bool) -> None:
    cfg = tiny_config(name, options, data=DATA, eval=EVAL, trainer={"vectorize": vectorize, "rounds": 2})
    if vectorize and cfg.method.vectorize_problems():
        pytest.skip(f"{name}'s clients train one at a time")
    with training_device():
        loop = loop_on_device(cfg)
        for _ in range(2):  # the second round reads what the first one stored
            loop.run_round()
            loop.history.append({"round": loop.round, **loop.evaluate()})
        loop.summary(loop.history[-1])
        model = loop.method.global_state(loop.server)
        assert model is None or is_on_device(model)


@pytest.mark.parametrize("vectorize", [False, True], ids=["sequential", "lockstep"])
@pytest.mark.parametrize("name", sorted(methods()))
def test_every_method_keeps_host_and_device_tensors_apart(name, vectorize):
    run_on_device(name, OPTIONS.get(name, {}), vectorize)


@pytest.mark.parametrize("name, options", VARIANTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(VARIANTS)])
def test_method_options_keep_host_and_device_tensors_apart(name, options):
    run_on_device(name, options, vectorize=True)


@pytest.mark.parametrize("name", sorted(methods()))
def test_a_resumed_run_reads_its_host_made_state_back_on_the_device(name):
    """A resume hands every server and client state tensor back on the training device, host-made
    ones (PAGE's agents and accuracies, S-FedPG's ids) included; the next round reads them there."""

    def config():
        return tiny_config(name, OPTIONS.get(name, {}), data=DATA, eval=EVAL, trainer={"rounds": 3})

    with training_device():
        loop = loop_on_device(config())
        for _ in range(2):
            loop.run_round()
        resumed = loop_on_device(config())
        resumed.checkpointer.load_state_dict(loop.checkpointer.state_dict())
        assert all(is_on_device(t) for t in tensors(resumed.server.state))
        resumed.run_round()
        resumed.evaluate()


def tensors(tree):
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in tensors(v)]
    return [tree] if hasattr(tree, "device") else []


AGGREGATORS = [{"server": {"aggregator": a, "krum_f": 1}} for a in ("median", "trimmed_mean", "krum", "multi_krum")]
OPTIMIZERS = [{"server": {"optimizer": o, "momentum": 0.9}} for o in ("sgd", "adam", "adagrad", "yogi")]
ATTACKS = [{"attack": {"kind": k, "fraction": 0.34}} for k in ("gaussian", "scale")]
# FedPG's server takes no mean of the uploads: no robust aggregator applies to it.
SERVER_CASES = [("fedavg", g) for g in (*AGGREGATORS, {"server": {"aggregator": "norm_clip"}}, *OPTIMIZERS, *ATTACKS)]
SERVER_CASES += [("fedpg", g) for g in (*OPTIMIZERS, *ATTACKS)]


@pytest.mark.parametrize("name, groups", SERVER_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SERVER_CASES)])
def test_robust_aggregators_server_optimizers_and_attacks_keep_to_the_device(name, groups):
    trainer = {"vectorize": False, "rounds": 2, "clients_per_round": 6}  # 6 clients a round: Krum takes f = 1
    cfg = tiny_config(name, data={"val_frac": 0.2}, eval=EVAL, trainer=trainer, **groups)
    with training_device():
        loop = loop_on_device(cfg)
        for _ in range(2):
            loop.run_round()
            loop.evaluate()
        assert is_on_device(loop.server["global"])
