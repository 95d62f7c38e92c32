"""Dap-FL's agents read the split ``method.reward_split`` names, as PAGE's do (pfl.methods.rl_tuning)."""

from __future__ import annotations

import pytest
import torch

from pfl.errors import ConfigError
from pfl.methods.dapfl import DapFL
from pfl.methods.page import PAGE
from tests.conftest import make_loop, tiny_config
from tests.methods_helpers import exchanged_round

FAST = {"warmup": 2, "ddpg_batch_size": 2, "lr_min": 0.01, "lr_max": 0.1, "epoch_max": 3}
VAL = {"val_frac": 0.2}


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
