"""Tests of pfl/methods/dapfl.py."""

from __future__ import annotations

import pytest
import torch
from jsonargparse import ArgumentError

from pfl.errors import ConfigError
from pfl.methods.dapfl import DapFL
from pfl.methods.page import PAGE
from pfl.optim.ddpg import client_action_to_hparams
from pfl.runner.args import build_fit_parser
from tests.conftest import make_loop, tiny_config
from tests.methods.helpers import FAST_AGENTS, RANGE, VAL, exchanged_round, fixed_client_action, reference_round


class FixedDapFL(DapFL):
    def client_action(self, agent, state, client):
        return fixed_client_action(client.cid)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_dapfl_with_fixed_actions_is_weighted_fedavg(weighting):
    cfg = tiny_config("dapfl", FAST_AGENTS, data=VAL)
    cfg.method = FixedDapFL(weighting=weighting, **FAST_AGENTS)
    loop, ref = make_loop(cfg), make_loop(tiny_config("fedavg", data=VAL))
    n = loop.server.num_clients
    hparams = [client_action_to_hparams(fixed_client_action(c), **RANGE) for c in range(n)]
    sizes = [len(loop.worker.split(c).train) for c in range(n)]
    weights = sizes if weighting == "samples" else [1.0] * n
    g = loop.server["global"].clone()
    for _ in range(3):
        loop.run_round()
        g, _ = reference_round(ref, g, hparams, weights)
        assert torch.equal(loop.server["global"], g)


def test_dapfl_reward_is_the_change_of_accuracy_minus_loss():
    loop = make_loop(tiny_config("dapfl", FAST_AGENTS, data=VAL))
    loop.run_round()
    first = {cid: float(s["score"]) for cid, s in loop.clients.items()}
    loop.run_round()
    for cid, s in loop.clients.items():
        buf = s["agent"]["buffer"]
        acc, loss = s["obs"].tolist()
        assert abs(float(s["score"]) - (acc - loss)) < 1e-6
        assert abs(float(buf["rewards"][1]) - (float(s["score"]) - first[cid])) < 1e-5
        assert abs(float(buf["rewards"][0]) - first[cid]) < 1e-5  # the code's last_reward starts at 0
        assert torch.equal(buf["next_states"][0], buf["states"][1])  # the next state is the next round's state


# -- mutation-testing survivors: dapfl --
def test_dapfl_penalty_must_be_positive():
    assert DapFL(penalty=1e-9).penalty == 1e-9
    with pytest.raises(ConfigError, match="method.penalty"):
        DapFL(penalty=0.0)


def test_dapfl_agents_explore_with_noise_after_the_warmup():
    method = DapFL(**{**FAST_AGENTS, "warmup": 0})
    agent = method._pool.new(method.config, 0)
    state = torch.tensor([0.5, 1.0])
    greedy = agent.act(state, explore=False)
    assert not torch.equal(method.client_action(agent, state, None), greedy)


def test_dapfl_states_and_score_add_the_penalty_to_the_losses():
    """A visible penalty (0.5): s^0 = (acc(g), loss(g) + penalty), s^1 = (acc(g), loss(θ) + penalty),
    q = acc(g) − loss(θ) − penalty."""
    from tests.methods.helpers import exchanged_round

    penalty = 0.5
    loop = make_loop(tiny_config("dapfl", {**FAST_AGENTS, "penalty": penalty, "reward_split": "test"}))
    payloads, uploads = exchanged_round(loop)
    for cid, upload in uploads.items():
        ctx, state = loop.client(cid), loop.clients[cid]
        received, trained = ctx.evaluate(payloads[cid]["global"], "test"), ctx.evaluate(upload.state, "test")
        first = torch.tensor([received.acc, received.loss + penalty])
        following = torch.tensor([received.acc, trained.loss + penalty])
        torch.testing.assert_close(state["agent"]["buffer"]["states"][0], first)
        torch.testing.assert_close(state["obs"], following)
        assert abs(float(state["score"]) - (received.acc - trained.loss - penalty)) < 1e-6


def test_dapfl_takes_pages_action_map_and_noise_options():
    with pytest.raises(ConfigError, match="method.action_map"):
        DapFL(action_map="log")
    with pytest.raises(ConfigError, match="method.ou_dt"):
        DapFL(ou_dt=0.0)
    assert DapFL().action_map == "linear" and DapFL().range.action_map == "linear"
    assert DapFL(action_map="clip").range.action_map == "clip"
    assert DapFL().config.ou_dt == 1.0 and DapFL(ou_dt=0.01).config.ou_dt == 0.01


def test_dapfl_refuses_a_warmup_as_long_as_the_run():
    cfg = tiny_config("dapfl", {"warmup": 3}, trainer={"rounds": 3})
    with pytest.raises(ConfigError, match="method.warmup"):
        cfg.method.check_run(cfg)
    cfg = tiny_config("dapfl", {"warmup": 2}, trainer={"rounds": 3}, data=VAL)
    cfg.method.check_run(cfg)


def test_dapfl_weighting_is_a_choice_the_parser_validates():
    parser = build_fit_parser("dapfl")
    assert parser.parse_args(["--method.weighting", "uniform"]).method.weighting == "uniform"
    with pytest.raises(ArgumentError):
        parser.parse_args(["--method.weighting", "sizes"])


# -- the split the agents are scored on (method.reward_split), as PAGE's --
FAST = {"warmup": 2, "ddpg_batch_size": 2, "lr_min": 0.01, "lr_max": 0.1, "epoch_max": 3}


def test_reward_split_defaults_to_validation_and_is_checked():
    assert DapFL().reward_split == PAGE().reward_split == "validation"
    assert DapFL(reward_split="test").reward_split == "test"
    with pytest.raises(
        ConfigError, match=r"method.reward_split: unknown value 'train' \(choose one of validation, test\)"
    ):
        DapFL(reward_split="train")


@pytest.mark.parametrize(("reward_split", "on"), [("validation", "val"), ("test", "test")])
def test_states_and_rewards_read_the_chosen_split(reward_split, on):
    """s = (acc(g), loss(g) + penalty) in round 0, then (acc(g), loss(θ) + penalty); q = acc(g) − loss(θ) −
    penalty, all on the chosen split, which differs from the other one."""
    penalty = 0.5
    loop = make_loop(tiny_config("dapfl", {**FAST, "penalty": penalty, "reward_split": reward_split}, data=VAL))
    payloads, uploads = exchanged_round(loop)
    other = "test" if on == "val" else "val"
    for cid, upload in uploads.items():
        ctx, state = loop.client(cid), loop.clients[cid]
        received, trained = ctx.evaluate(payloads[cid]["global"], on), ctx.evaluate(upload.state, on)
        torch.testing.assert_close(
            state["agent"]["buffer"]["states"][0], torch.tensor([received.acc, received.loss + penalty])
        )
        torch.testing.assert_close(state["obs"], torch.tensor([received.acc, trained.loss + penalty]))
        assert abs(float(state["score"]) - (received.acc - trained.loss - penalty)) < 1e-6
        wrong = ctx.evaluate(upload.state, other)
        assert abs(float(state["obs"][1]) - (wrong.loss + penalty)) > 1e-6  # the two splits tell apart


def test_validation_needs_a_validation_split_before_training():
    cfg = tiny_config("dapfl", FAST)
    with pytest.raises(ConfigError, match=r"data.val_frac: Dap-FL's agents score on validation splits") as err:
        cfg.method.check_run(cfg)
    assert "set data.val_frac > 0 (e.g. 0.1), or method.reward_split: test" in str(err.value)  # the fix
    cfg.method.check_run(tiny_config("dapfl", FAST, data=VAL))
    test_cfg = tiny_config("dapfl", {**FAST, "reward_split": "test"})
    test_cfg.method.check_run(test_cfg)  # the test split needs no validation split
    loop = make_loop(tiny_config("dapfl", FAST))  # built around the check: the first score refuses by name
    with pytest.raises(ConfigError, match="Dap-FL's agents score on validation splits.*client 0 has none"):
        loop.run_round()
