"""Tests of pfl/methods/rl_tuning.py, what PAGE and Dap-FL share: the agent pool, learning after the
warm-up, the client action → (lr, epochs) range with its warm-up and replay options, the phase timers, the
agents' options (DDPGParams) and the warm-up check on their configs."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import fields
from typing import get_args

import pytest
import torch
import yaml
from jsonargparse import ArgumentError

from pfl.errors import ConfigError
from pfl.methods import rl_tuning
from pfl.methods.dapfl import DapFL
from pfl.methods.page import PAGE
from pfl.methods.rl_tuning import (
    AgentPool,
    DDPGParams,
    HparamRange,
    check_warmup,
    learn_after_warmup,
    uniform_action,
)
from pfl.optim import ddpg
from pfl.optim.ddpg import DDPGAgent, DDPGConfig
from pfl.runner.args import build_fit_parser
from tests.methods.helpers import REPO_ROOT as ROOT
from tests.methods.helpers import method_options


def _config(**kw) -> DDPGConfig:
    return DDPGConfig(**{"state_dim": 2, "action_dim": 2, "batch_size": 1, "buffer_size": 8, **kw})


def test_the_pool_restores_saved_agents_into_one_shared_scratch_agent_per_configuration():
    pool, config = AgentPool(), _config()
    a, b = DDPGAgent(config, seed=1), DDPGAgent(config, seed=2)
    for _ in range(3):
        b.act(torch.zeros(2))
    saved_a, saved_b = a.state_dict(), b.state_dict()
    first = pool.load(config, saved_a)
    assert first.acts == 0 and torch.equal(first.act(torch.zeros(2), explore=False), a.act(torch.zeros(2), False))
    second = pool.load(config, saved_b)
    assert second is first  # one scratch agent per configuration
    assert second.acts == 3 and torch.equal(second.generator.get_state(), b.generator.get_state())
    assert pool.load(_config(hidden=(8, 8)), DDPGAgent(_config(hidden=(8, 8)), seed=0).state_dict()) is not first


def test_each_thread_keeps_its_own_scratch_agent():
    """Under ``trainer.vectorize`` each client's update runs in a thread of its own and keeps the agent it
    loaded across its fit while the other clients load theirs: a load in one thread leaves another's be."""
    import threading

    pool, config = AgentPool(), _config()
    saved = [DDPGAgent(config, seed=s).state_dict() for s in (1, 2)]
    for _ in range(3):
        pool.load(config, saved[1]).act(torch.zeros(2))  # this thread's agent: acted three times
    mine = pool.load(config, saved[1])
    loaded, other_loaded, resume = [], threading.Event(), threading.Event()

    def client() -> None:
        agent = pool.load(config, saved[0])
        other_loaded.set()
        resume.wait(10)
        loaded.append((agent, agent.acts, pool.load(config, saved[0])))

    thread = threading.Thread(target=client)
    thread.start()
    other_loaded.wait(10)
    assert pool.load(config, saved[1]) is mine and mine.acts == 0  # this thread's scratch, reloaded
    mine.act(torch.zeros(2))
    resume.set()
    thread.join()
    ((agent, acts, again),) = loaded
    assert agent is not mine and again is agent and acts == 0  # the other thread's, untouched by this one


def test_learning_starts_with_the_first_action_that_came_from_the_actor():
    agent = DDPGAgent(_config(warmup=2), seed=0)
    agent.remember(torch.zeros(2), torch.zeros(2), 1.0, torch.ones(2))
    for _ in range(2):  # the warm-up's random actions
        agent.act(torch.zeros(2))
        learn_after_warmup(agent)
    assert agent.learn_steps == 0
    agent.act(torch.zeros(2))  # from the actor
    learn_after_warmup(agent)
    assert agent.learn_steps == 1


def test_range_defaults_are_the_papers_reading():
    r = HparamRange(0.001, 0.1, 5)
    assert (r.rounding, r.warmup_space, r.replay, r.action_map) == ("round", "agent", "agent", "linear")
    assert r.hparams(torch.zeros(2)) == (pytest.approx(0.0505), 3)  # the middle of both ranges


def test_range_edges():
    HparamRange(0.1, 0.1, 1)  # one learning rate, one epoch
    HparamRange(0.1, 1.0, 3, action_map="clip")  # lr_max = 1: (a + 1)/2 reaches it
    assert HparamRange(0.1, 1.5, 3).hparams(torch.ones(2)) == (1.5, 3)  # the linear map reaches any lr_max
    for args, field in (((0.0, 0.1, 1), "method.lr_min"), ((0.2, 0.1, 1), "method.lr_min")):
        with pytest.raises(ConfigError, match=field):
            HparamRange(*args)
    with pytest.raises(ConfigError, match="method.lr_max"):
        HparamRange(0.1, 1.5, 1, action_map="clip")
    with pytest.raises(ConfigError, match="method.epoch_max"):
        HparamRange(0.1, 0.5, 0)


def test_warmup_in_hparam_space_draws_the_learning_rate_uniformly_in_its_range():
    """The authors' code: u' = lr_min + u (lr_max − lr_min) from the same uniform draw u = (a + 1)/2,
    stored as a' = 2u' − 1; after the warm-up the actor's action is used as it is."""
    lo, hi = 0.01, 0.2
    agent, twin = DDPGAgent(_config(warmup=1), seed=3), DDPGAgent(_config(warmup=1), seed=3)
    r = HparamRange(lo, hi, 4, warmup_space="hparams", action_map="clip")
    a, raw = r.act(agent, torch.zeros(2)), twin.act(torch.zeros(2))
    expected = 2.0 * (lo + (raw + 1.0) / 2.0 * (hi - lo)) - 1.0
    torch.testing.assert_close(a, expected)
    assert bool(((a + 1) / 2 >= lo).all()) and bool(((a + 1) / 2 <= hi).all())
    torch.testing.assert_close(r.act(agent, torch.zeros(2)), twin.act(torch.zeros(2)))  # past the warm-up
    plain = HparamRange(lo, hi, 4)
    agent, twin = DDPGAgent(_config(warmup=1), seed=3), DDPGAgent(_config(warmup=1), seed=3)
    torch.testing.assert_close(plain.act(agent, torch.zeros(2)), twin.act(torch.zeros(2)))  # agent space: as drawn


def test_replay_stores_the_agents_action_or_the_mapped_hyper_parameters():
    action = torch.tensor([0.3, -0.5])
    assert HparamRange(0.01, 0.5, 4).replayed(action, 0.2, 3) is action
    mapped = HparamRange(0.01, 0.5, 4, replay="mapped").replayed(action, 0.2, 3)
    assert mapped.tolist() == pytest.approx([0.2, 3.0])


def test_the_clip_maps_own_options_are_refused_with_the_linear_map():
    assert HparamRange(0.01, 0.2, 4, "floor", "hparams", action_map="clip").hparams(torch.ones(2)) == (0.2, 4)
    for kwargs, field in (
        ({"rounding": "floor"}, "method.epoch_rounding"),
        ({"warmup_space": "hparams"}, "method.warmup_space"),
        ({"action_map": "log"}, "method.action_map"),
    ):
        with pytest.raises(ConfigError, match=field):
            HparamRange(0.01, 0.2, 4, **kwargs)


def test_range_maps_with_the_chosen_action_map():
    a = torch.tensor([0.0, 0.0])
    assert HparamRange(0.01, 0.19, 9).hparams(a) == (pytest.approx(0.1), 5)
    assert HparamRange(0.01, 0.19, 9, action_map="clip").hparams(a) == (0.19, 9)  # the code saturates


def test_a_warmup_as_long_as_the_run_is_refused():
    check_warmup(5, 6)
    check_warmup(0, 1)
    for warmup, rounds in ((35, 30), (30, 30)):
        with pytest.raises(ConfigError, match="method.warmup"):
            check_warmup(warmup, rounds)


def test_uniform_actions_are_keyed_in_the_box_and_spread():
    draws = torch.stack([uniform_action(2, 0, "client", 3, r) for r in range(400)])
    assert torch.equal(uniform_action(2, 0, "client", 3, 7), draws[7])  # the same keys, the same action
    assert float(draws.min()) >= -1 and float(draws.max()) <= 1
    assert float(draws.min()) < -0.95 and float(draws.max()) > 0.95 and abs(float(draws.mean())) < 0.1


# -- PAGE's and Dap-FL's shared agent options (DDPGParams, DDPGMethod) --
def test_page_and_dapfl_take_their_agents_options_from_the_one_ddpg_params():
    shared = {f.name: f.default for f in fields(DDPGParams)}
    dapfl_own = {"actor_lr": 1e-4, "critic_lr": 1e-3, "tau": 0.001, "eps_decay_steps": 0}  # the Dap-FL code's
    assert method_options(PAGE).items() >= shared.items()
    assert method_options(DapFL).items() >= (shared | dapfl_own).items()
    for cls, expected in ((PAGE, shared), (DapFL, shared | dapfl_own)):
        method = cls(warmup=3, lr_max=0.2)
        assert method.ddpg == DDPGParams(**{**expected, "warmup": 3, "lr_max": 0.2})
        assert method.hparams().items() >= {**expected, "warmup": 3, "lr_max": 0.2, "hidden": [40, 30]}.items()
        assert method.range == HparamRange(1e-3, 0.2, 20) and method.warmup == 3


def test_ddpg_params_errors_name_the_methods_own_fields():
    params = DDPGParams(ddpg_batch_size=0)
    with pytest.raises(ConfigError, match=r"^method\.ddpg_batch_size: must be >= 1"):
        params.agent(1, 2, noise=True)
    with pytest.raises(ConfigError, match=r"^method\.server_critic_lr: must be > 0"):
        DDPGParams().agent(3, 3, noise=False, actor_lr=1.0, critic_lr=0.0, prefix="server_")
    agent = DDPGParams(hidden=[8, 4], tau=0.5).agent(3, 2, noise=False, actor_lr=0.25)
    assert (agent.state_dim, agent.action_dim, agent.hidden, agent.noise) == (3, 2, (8, 4), False)
    assert (agent.actor_lr, agent.critic_lr, agent.tau, agent.batch_size) == (0.25, 5e-3, 0.5, 32)
    for cls in (PAGE, DapFL):
        with pytest.raises(ConfigError, match="method.ddpg_batch_size"):
            cls(ddpg_batch_size=0)
        with pytest.raises(ConfigError, match="method.epoch_max"):
            cls(epoch_max=0)


def test_every_agent_setting_the_params_hold_reaches_the_agent():
    shared = {f.name for f in fields(DDPGParams)} & {f.name for f in fields(DDPGConfig)}
    assert set(rl_tuning.AGENT_FIELDS) == shared - {"hidden", "actor_lr", "critic_lr"}  # those are passed apart
    values = {"tau": 0.5, "gamma": 0.9, "buffer_size": 100, "warmup": 2, "ou_theta": 0.3, "ou_sigma": 0.1}
    values |= {"ou_dt": 0.5, "eps_decay_steps": 7, "init": "code"}
    agent = DDPGParams(**values).agent(3, 2, noise=True)
    assert {name: getattr(agent, name) for name in values} == values


def test_page_and_dapfl_ddpg_choices_are_literals_their_parser_validates():
    """Every choice among the shared agent options is a Literal in the signature jsonargparse reads."""
    signature = inspect.signature(rl_tuning.DDPGMethod.__init__).parameters
    expected = {
        "epoch_rounding": ("round", "floor"),
        "action_map": ddpg.ACTION_MAPS,
        "init": ddpg.INIT_SCHEMES,
        "warmup_space": ("agent", "hparams"),
        "replay_actions": ("agent", "mapped"),
        "reward_split": ("validation", "test"),
    }
    assert {name: get_args(signature[name].annotation) for name in expected} == expected
    for name in ("page", "dapfl"):
        with pytest.raises(ArgumentError):
            build_fit_parser(name).parse_args(["--method.epoch_rounding", "ceil"])


def test_page_and_dapfl_ddpg_params_are_frozen_and_documented_in_their_help():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DapFL().ddpg.lr_min = 0.5  # type: ignore[misc]
    for name in ("page", "dapfl"):
        help_text = " ".join(build_fit_parser(name).format_help().split())
        assert "Adam learning rate of the actor" in help_text and "OU noise mean reversion" in help_text


# -- the warm-up check and the range in PAGE's and Dap-FL's configs --
def _parse(*files, **extra):
    from pfl.runner.args import parse_fit_args

    argv = [a for f in files for a in ("--config", f)] + [a for k, v in extra.items() for a in (f"--{k}", str(v))]
    return parse_fit_args(argv)[0]


def test_a_warmup_as_long_as_the_run_is_refused_before_it_starts():
    # The Shakespeare analogue (30 rounds) with PAGE's per-dataset agents (35 warm-up rounds)
    with pytest.raises(ConfigError, match="method.warmup"):
        _parse("conf/experiment/page_embedded_shakespeare.yaml", "conf/method/page_shakespeare.yaml")
    with pytest.raises(ConfigError, match="method.warmup"):
        _parse("conf/experiment/page_embedded_synthetic.yaml", "conf/method/dapfl.yaml", **{"trainer.rounds": 35})
    _parse("conf/experiment/page_embedded_synthetic.yaml", "conf/method/dapfl.yaml", **{"trainer.rounds": 36})
    _parse("conf/experiment/page_embedded_shakespeare.yaml", "conf/method/page_short.yaml")
    _parse("conf/experiment/page_embedded_synthetic.yaml", "conf/method/dapfl_short.yaml")
    for control in ("fixed", "random"):  # no agent acts: the warm-up does not matter
        _parse("conf/experiment/page_embedded_shakespeare.yaml", "conf/method/page_shakespeare.yaml", **{
            "method.actions": control
        })  # fmt: skip
    with pytest.raises(ConfigError, match="method.warmup"):
        _parse("conf/experiment/page_embedded_synthetic.yaml", "conf/method/page_short.yaml", **{"trainer.rounds": 5})


def test_short_configs_put_the_baselines_in_the_middle_of_the_range_and_dapfl_gets_pages_ceilings():
    from pfl.methods.rl_tuning import HparamRange

    keys = ("lr_min", "lr_max", "epoch_max")
    for page, dap in (("page", "dapfl"), ("page_short", "dapfl_short")):
        a, b = (yaml.safe_load((ROOT / f"conf/method/{n}.yaml").read_text())["method"] for n in (page, dap))
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
        assert a["action_map"] == b["action_map"] == "linear"
    for experiment in ("page_embedded_synthetic", "page_embedded_digits"):
        cfg = _parse(f"conf/experiment/{experiment}.yaml", "conf/method/page_short.yaml")
        m, c = cfg.method, cfg.client
        assert m.lr_min < c.lr < m.lr_max and 1 < c.epochs < m.epoch_max  # inside the range, not at its ceiling
        mid = HparamRange(m.lr_min, m.lr_max, m.epoch_max).hparams(torch.zeros(2))
        assert mid == (pytest.approx(c.lr), c.epochs)
        assert cfg.data.val_frac > 0
