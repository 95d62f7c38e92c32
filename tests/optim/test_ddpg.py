"""DDPG agent (pfl.optim.ddpg): update rules as identities, exploration schedule, checkpoint round trip,
PAGE's action mappings, and a toy bandit it must solve."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
import torch.nn.functional as F

from pfl.errors import ConfigError
from pfl.optim.ddpg import (
    DDPGAgent,
    DDPGConfig,
    OUNoise,
    ReplayBuffer,
    client_action_to_hparams,
    clip_action_to_hparams,
    linear_action_to_hparams,
    sample_without_replacement,
    server_action_to_weights,
    soft_update,
    to_unit,
)


def params(agent: DDPGAgent) -> list[torch.Tensor]:
    nets = (agent.actor, agent.critic, agent.actor_target, agent.critic_target)
    return [p.detach().clone() for net in nets for p in net.parameters()]


def fill(agent: DDPGAgent, n: int, seed: int = 0, done_every: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    c = agent.config
    for i in range(n):
        s, s2 = torch.rand(c.state_dim, generator=g), torch.rand(c.state_dim, generator=g)
        a = torch.rand(c.action_dim, generator=g) * 2 - 1
        done = done_every > 0 and i % done_every == 0
        agent.remember(s, a, float(torch.rand(1, generator=g)), s2, done)


# --------------------------------------------------------------------------- config and networks


@pytest.mark.parametrize(
    "field, value",
    [
        ("state_dim", 0),
        ("hidden", (40,)),
        ("hidden", (40, 0)),
        ("actor_lr", 0.0),
        ("tau", 1.5),
        ("gamma", -0.1),
        ("buffer_size", 16),
        ("warmup", -1),
        ("ou_sigma", -0.2),
        ("ou_dt", 0.0),
        ("eps_decay_steps", -1),
        ("init", "xavier"),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=f"ddpg.{field}"):
        DDPGConfig(**{"state_dim": 2, "action_dim": 1, field: value})


def test_architecture_critic_takes_action_at_second_layer():
    agent = DDPGAgent(DDPGConfig(state_dim=3, action_dim=2), seed=0)
    shapes = [tuple(p.shape) for p in agent.actor.parameters()]
    assert shapes == [(40, 3), (40,), (30, 40), (30,), (2, 30), (2,)]
    shapes = [tuple(p.shape) for p in agent.critic.parameters()]
    assert shapes == [(40, 3), (40,), (30, 42), (30,), (1, 30), (1,)]
    # the actor ends in tanh: even huge inputs stay in [-1, 1]
    out = agent.actor(torch.randn(64, 3, generator=torch.Generator().manual_seed(0)) * 1e4)
    assert out.abs().max() <= 1.0


def test_init_is_seeded_exact_targets_and_no_global_rng():
    before = torch.get_rng_state()
    a, b, c = (DDPGAgent(DDPGConfig(state_dim=2, action_dim=1), seed=s) for s in (5, 5, 6))
    fill(a, 40)
    a.act(torch.zeros(2))
    a.learn()
    assert torch.equal(torch.get_rng_state(), before), "the agent must not draw from torch's global RNG"
    assert all(torch.equal(x, y) for x, y in zip(params(b), params(DDPGAgent(b.config, seed=5)), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(params(b), params(c), strict=True))
    for online, target in ((b.actor, b.actor_target), (b.critic, b.critic_target)):
        assert all(torch.equal(p, q) for p, q in zip(online.parameters(), target.parameters(), strict=True))


@pytest.mark.parametrize("scheme", ["fan_in", "code"])
def test_init_bounds(scheme):
    agent = DDPGAgent(DDPGConfig(state_dim=50, action_dim=3, hidden=(200, 100), init=scheme), seed=0)
    for net in (agent.actor, agent.critic):
        for name in ("fc1", "fc2"):
            w = getattr(net, name).weight
            fan_out, fan_in = w.shape
            bound = 1 / math.sqrt(fan_in if scheme == "fan_in" else fan_out)
            assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
        assert net.fc3.weight.abs().max() <= 3e-3
        assert (net.fc3.bias.abs().max() <= 3e-3) == (scheme == "fan_in")


# --------------------------------------------------------------------------- acting


def test_warmup_actions_are_uniform_and_ignore_the_actor():
    cfg = DDPGConfig(state_dim=2, action_dim=1, warmup=3000, noise=False)
    a, b = DDPGAgent(cfg, seed=1), DDPGAgent(cfg, seed=1)
    g = torch.Generator().manual_seed(0)
    acts = []
    for _ in range(cfg.warmup):
        s1, s2 = torch.rand(2, generator=g) * 10, -torch.rand(2, generator=g) * 10
        x = a.act(s1)
        assert torch.equal(x, b.act(s2)), "warm-up actions must not depend on the state"
        if len(acts) < 20:
            assert not torch.equal(x, a.actor(s1).detach())
        acts.append(x)
    x = torch.cat(acts)
    assert abs(x.mean().item()) < 0.03 and abs(x.var().item() - 1 / 3) < 0.02
    assert x.min() >= -1 and x.max() <= 1 and x.min() < -0.99 and x.max() > 0.99
    assert not a.in_warmup
    s = torch.tensor([0.3, -0.7])
    assert torch.equal(a.act(s), a.actor(s).detach()), "after the warm-up (no noise) act is the actor"


def test_warmup_counts_exploring_calls_only():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=2, warmup=3), seed=0)
    s = torch.tensor([0.1, 0.2])
    gen = agent.generator.get_state()
    greedy = agent.act(s, explore=False)
    assert torch.equal(greedy, agent.actor(s).detach())
    assert agent.acts == 0 and torch.equal(agent.generator.get_state(), gen), "explore=False must change nothing"
    for _ in range(3):
        assert agent.in_warmup
        agent.act(s)
    assert not agent.in_warmup and agent.explore_steps == 0 and agent.epsilon == 1.0


def test_epsilon_decays_linearly_and_scales_the_ou_noise():
    cfg = DDPGConfig(state_dim=2, action_dim=2, warmup=3, eps_decay_steps=10, ou_dt=1.0)
    agent = DDPGAgent(cfg, seed=0)
    s = torch.tensor([0.5, -0.5])
    for _ in range(cfg.warmup):
        agent.act(s)
    mu = agent.actor(s).detach()
    for k in range(14):
        eps = max(0.0, 1 - k / 10)
        assert agent.epsilon == pytest.approx(eps, abs=1e-12)
        a = agent.act(s)
        expected = (mu + eps * agent.noise.x).clamp(-1, 1)
        assert torch.allclose(a, expected, atol=1e-7)
    assert agent.epsilon == 0.0 and torch.equal(agent.act(s), mu)


def test_zero_decay_steps_keeps_epsilon_one():
    agent = DDPGAgent(DDPGConfig(state_dim=1, action_dim=1, warmup=0, eps_decay_steps=0), seed=0)
    for _ in range(20):
        agent.act(torch.zeros(1))
    assert agent.epsilon == 1.0


def test_no_noise_agent_is_deterministic_after_warmup():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=3, warmup=2, noise=False), seed=0)
    s = torch.tensor([0.2, 0.9])
    agent.act(s), agent.act(s)
    gen = agent.generator.get_state()
    for _ in range(5):
        assert torch.equal(agent.act(s), agent.actor(s).detach())
    assert torch.equal(agent.generator.get_state(), gen)


def test_ou_step_formula():
    noise = OUNoise(size=3, theta=0.15, sigma=0.2, mu=0.5, dt=0.1)
    noise.x = torch.tensor([0.0, 1.0, -2.0])
    g = torch.Generator().manual_seed(3)
    xi = torch.randn(3, generator=torch.Generator().manual_seed(3))
    x0 = noise.x.clone()
    x1 = noise.sample(g)
    assert torch.allclose(x1, x0 + 0.15 * (0.5 - x0) * 0.1 + 0.2 * math.sqrt(0.1) * xi)


def test_ou_stationary_statistics():
    theta, sigma, dt = 0.15, 0.2, 1.0
    noise = OUNoise(size=1, theta=theta, sigma=sigma, dt=dt)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([noise.sample(g) for _ in range(16000)])[1000:]
    rho = 1 - theta * dt
    var = sigma**2 * dt / (1 - rho**2)
    lag1 = torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1].item()
    assert abs(lag1 - rho) < 0.02
    assert abs(x.var().item() / var - 1) < 0.12
    assert abs(x.mean().item()) < 0.1


# --------------------------------------------------------------------------- replay buffer


def test_ring_buffer_overwrites_oldest():
    buf = ReplayBuffer(5, state_dim=1, action_dim=1, device=torch.device("cpu"))
    for i in range(7):
        buf.add(torch.tensor([float(i)]), torch.tensor([0.0]), float(i), torch.tensor([i + 1.0]), i == 6)
    assert buf.rewards.tolist() == [5, 6, 2, 3, 4]
    assert buf.next_states[:, 0].tolist() == [6, 7, 3, 4, 5]
    assert buf.dones.tolist() == [0, 1, 0, 0, 0]
    assert (buf.pos, len(buf)) == (2, 5)


def test_sample_without_replacement_is_uniform_and_distinct():
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(10)
    for _ in range(6000):
        idx = sample_without_replacement(10, 3, g)
        assert len(set(idx)) == 3 and all(0 <= i < 10 for i in idx)
        counts[idx] += 1
    assert torch.allclose(counts / 6000, torch.full((10,), 0.3), atol=0.02)
    assert sorted(sample_without_replacement(7, 7, g)) == list(range(7))


# --------------------------------------------------------------------------- learning


def test_learn_waits_for_a_batch_then_steps_each_optimizer_once():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1, batch_size=8), seed=0)
    fill(agent, 7)
    assert agent.learn() == {}
    fill(agent, 1)
    for n in (1, 2, 3):
        out = agent.learn()
        assert set(out) == {"critic_loss", "actor_loss"}
        for opt in (agent.actor_optim, agent.critic_optim):
            assert all(float(s["step"]) == n for s in opt.state.values())
    assert agent.learn_steps == 3


def test_losses_are_bellman_mse_then_actor_on_updated_critic():
    cfg = DDPGConfig(state_dim=3, action_dim=2, batch_size=12, gamma=0.9, tau=0.3)
    agent = DDPGAgent(cfg, seed=0)
    fill(agent, 12, done_every=3)  # the batch is the whole buffer, so the mean loss is order-free
    # move targets away from the online nets so that a mix-up would show
    for p in (*agent.actor_target.parameters(), *agent.critic_target.parameters()):
        p.data.add_(0.05)
    b = agent.buffer
    s, a, r, s2, d = (x[:12].clone() for x in (b.states, b.actions, b.rewards, b.next_states, b.dones))
    critic0, actor0 = copy.deepcopy(agent.critic), copy.deepcopy(agent.actor)
    actor_t0, critic_t0 = copy.deepcopy(agent.actor_target), copy.deepcopy(agent.critic_target)
    with torch.no_grad():
        y = r + 0.9 * (1 - d) * critic_t0(s2, actor_t0(s2))
        expected_critic = F.mse_loss(critic0(s, a), y).item()
    out = agent.learn()
    assert out["critic_loss"] == pytest.approx(expected_critic, rel=1e-6)
    with torch.no_grad():
        expected_actor = -agent.critic(s, actor0(s)).mean().item()
    assert out["actor_loss"] == pytest.approx(expected_actor, rel=1e-6)
    # targets moved by exactly τ towards the updated online nets
    for t0, t, online in ((actor_t0, agent.actor_target, agent.actor), (critic_t0, agent.critic_target, agent.critic)):
        for p0, p, q in zip(t0.parameters(), t.parameters(), online.parameters(), strict=True):
            assert torch.allclose(p, 0.7 * p0 + 0.3 * q, atol=1e-6)


def test_soft_update_endpoints():
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    for p in (*src.parameters(), *tgt.parameters()):
        p.data.copy_(torch.randn(p.shape, generator=g))
    before = [p.clone() for p in tgt.parameters()]
    soft_update(tgt, src, 0.0)
    assert all(torch.equal(p, q) for p, q in zip(tgt.parameters(), before, strict=True))
    soft_update(tgt, src, 1.0)
    assert all(torch.equal(p, q) for p, q in zip(tgt.parameters(), src.parameters(), strict=True))


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_agent_targets_with_tau_zero_and_one(tau):
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1, batch_size=4, tau=tau), seed=0)
    initial = [p.clone() for p in (*agent.actor_target.parameters(), *agent.critic_target.parameters())]
    fill(agent, 10)
    for _ in range(3):
        agent.learn()
    targets = [*agent.actor_target.parameters(), *agent.critic_target.parameters()]
    online = [*agent.actor.parameters(), *agent.critic.parameters()]
    assert not all(torch.equal(p, q) for p, q in zip(online, initial, strict=True))
    reference = online if tau == 1.0 else initial
    assert all(torch.equal(p, q) for p, q in zip(targets, reference, strict=True))


# --------------------------------------------------------------------------- checkpointing


def roundtrip(d: dict) -> dict:
    buf = io.BytesIO()
    torch.save(d, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def assert_plain(x, path="state") -> None:
    if isinstance(x, dict):
        for k, v in x.items():
            assert isinstance(k, str), f"{path}: key {k!r} is not a str"
            assert_plain(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            assert_plain(v, f"{path}[{i}]")
    else:
        assert type(x) in (torch.Tensor, int, float, bool, str), f"{path}: {type(x).__name__}"


def assert_same(x, y) -> None:
    if isinstance(x, dict):
        assert x.keys() == y.keys()
        for k in x:
            assert_same(x[k], y[k])
    elif isinstance(x, list):
        assert len(x) == len(y)
        for u, v in zip(x, y, strict=True):
            assert_same(u, v)
    elif isinstance(x, torch.Tensor):
        assert x.dtype == y.dtype and torch.equal(x, y)
    else:
        assert type(x) is type(y) and x == y


def step_env(agent: DDPGAgent, g: torch.Generator, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    a = agent.act(state)
    nxt = torch.rand(agent.config.state_dim, generator=g)
    reward = -float(((a - state[: agent.config.action_dim]) ** 2).sum())
    agent.remember(state, a, reward, nxt, done=bool(torch.rand(1, generator=g) < 0.1))
    return a, nxt, agent.learn()


def test_state_dict_is_plain_and_survives_weights_only_load():
    agent = DDPGAgent(DDPGConfig(state_dim=3, action_dim=2, warmup=5, batch_size=4), seed=0)
    g, s = torch.Generator().manual_seed(0), torch.zeros(3)
    for _ in range(12):
        _, s, _ = step_env(agent, g, s)
    d = agent.state_dict()
    assert_plain(d)
    assert_same(d, roundtrip(d))
    assert d["buffer"]["states"].shape == (12, 3), "unwritten buffer rows stay out of the checkpoint"


@pytest.mark.parametrize("buffer_size", [40, 60000])  # 40: the ring has wrapped around at the save
def test_restore_reproduces_actions_and_learning_bit_for_bit(buffer_size):
    cfg = DDPGConfig(state_dim=3, action_dim=2, buffer_size=buffer_size, warmup=10, eps_decay_steps=30, ou_dt=0.5)
    a = DDPGAgent(cfg, seed=0)
    g, s = torch.Generator().manual_seed(0), torch.rand(3)
    for _ in range(45):
        _, s, _ = step_env(a, g, s)
    b = DDPGAgent(cfg, seed=123)  # another seed: everything must come from the state dict
    b.load_state_dict(roundtrip(a.state_dict()))
    g_b = torch.Generator()
    g_b.set_state(g.get_state())
    s_b = s.clone()
    for _ in range(40):
        act_a, s, loss_a = step_env(a, g, s)
        act_b, s_b, loss_b = step_env(b, g_b, s_b)
        assert torch.equal(act_a, act_b) and loss_a == loss_b
    assert all(torch.equal(x, y) for x, y in zip(params(a), params(b), strict=True))
    assert_same(a.state_dict(), b.state_dict())


def tensors_in(tree) -> int:
    if isinstance(tree, dict):
        return sum(tensors_in(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(tensors_in(v) for v in tree)
    return int(isinstance(tree, torch.Tensor))


def test_state_dict_packs_networks_and_adam_moments_into_few_tensors():
    """A checkpoint of many agents pays per tensor: networks and moments are one flat tensor each."""
    agent = DDPGAgent(DDPGConfig(state_dim=3, action_dim=2, warmup=2, batch_size=4), seed=0)
    fresh = agent.state_dict()
    nets = (agent.actor, agent.critic, agent.actor_target, agent.critic_target)
    assert fresh["networks"].shape == (sum(p.numel() for net in nets for p in net.parameters()),)
    assert fresh["actor_optim"]["packed"].numel() == 0 and fresh["actor_optim"]["params"] == []
    g, s = torch.Generator().manual_seed(0), torch.zeros(3)
    for _ in range(8):
        _, s, _ = step_env(agent, g, s)
    d = agent.state_dict()
    actor = list(agent.actor.parameters())
    assert d["actor_optim"]["params"] == list(range(len(actor)))
    assert d["actor_optim"]["packed"].numel() == sum(1 + 2 * p.numel() for p in actor)  # step, exp_avg, exp_avg_sq
    assert isinstance(d["config"], str) and tensors_in(d) == 10


def earlier_layout(agent: DDPGAgent) -> dict:
    """The state dict as earlier versions of pfl wrote it: one dict per network and per optimizer."""
    d = agent.state_dict()
    d["config"] = agent.config.to_dict()
    del d["networks"]
    for name in ("actor", "critic", "actor_target", "critic_target"):
        d[name] = {k: v.clone() for k, v in getattr(agent, name).state_dict().items()}
    for name in ("actor_optim", "critic_optim"):
        sd = getattr(agent, name).state_dict()
        d[name] = {
            "state": {str(k): {n: v.clone() for n, v in st.items()} for k, st in sd["state"].items()},
            "lr": [g["lr"] for g in sd["param_groups"]],
        }
    return d


def test_an_agent_saved_in_the_earlier_layout_loads_and_acts_the_same():
    cfg = DDPGConfig(state_dim=3, action_dim=2, warmup=3, batch_size=4)
    a = DDPGAgent(cfg, seed=0)
    g, s = torch.Generator().manual_seed(0), torch.rand(3)
    for _ in range(10):
        _, s, _ = step_env(a, g, s)
    b = DDPGAgent(cfg, seed=7)
    b.load_state_dict(roundtrip(earlier_layout(a)))
    assert_same(a.state_dict(), b.state_dict())
    g_b = torch.Generator()
    g_b.set_state(g.get_state())
    s_b = s.clone()
    for _ in range(5):
        act_a, s, loss_a = step_env(a, g, s)
        act_b, s_b, loss_b = step_env(b, g_b, s_b)
        assert torch.equal(act_a, act_b) and loss_a == loss_b


@pytest.mark.parametrize("part", ["networks", "actor_optim", "optim_index"])
def test_a_packed_state_of_another_size_is_refused(part):
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1, warmup=1, batch_size=2), seed=0)
    fill(agent, 4)
    agent.learn()
    d = agent.state_dict()
    if part == "networks":
        d["networks"] = d["networks"][:-1]
    elif part == "actor_optim":
        d["actor_optim"]["packed"] = torch.cat([d["actor_optim"]["packed"], torch.zeros(1)])
    else:  # a parameter index one past the actor's last one
        d["actor_optim"]["params"][-1] = len(list(agent.actor.parameters()))
    with pytest.raises(ConfigError, match="ddpg.state"):
        DDPGAgent(agent.config, seed=0).load_state_dict(d)


def test_restored_adam_moments_are_not_views_of_the_saved_state():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1, warmup=1, batch_size=2), seed=0)
    fill(agent, 4)
    agent.learn()
    d = agent.state_dict()
    kept = d["actor_optim"]["packed"].clone()
    other = DDPGAgent(agent.config, seed=0)
    other.load_state_dict(d)
    other.learn()
    assert torch.equal(d["actor_optim"]["packed"], kept)  # learning after a load leaves the saved state as it was


def test_load_rejects_a_different_config():
    d = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1), seed=0).state_dict()
    other = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1, tau=0.01), seed=0)
    with pytest.raises(ConfigError, match="ddpg.tau"):
        other.load_state_dict(d)


# --------------------------------------------------------------------------- toy problem


def test_solves_a_one_step_continuous_bandit():
    """s ~ U[-1, 1]², reward −(a − a*)² with a* = 0.5·s₀, one-step episodes (done). The untrained
    actor (≈ 0) is off by E|a*| = 0.25; after 400 act/remember/learn steps it must be within 0.05
    (seed 0 reaches 0.019; seeds 1 and 2 reach 0.048 and 0.055)."""
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1), seed=0)
    env = torch.Generator().manual_seed(1000)
    test_states = torch.rand(256, 2, generator=torch.Generator().manual_seed(7)) * 2 - 1

    def error() -> float:
        with torch.no_grad():
            return (agent.actor(test_states).squeeze(-1) - 0.5 * test_states[:, 0]).abs().mean().item()

    assert error() > 0.2
    for _ in range(400):
        s = torch.rand(2, generator=env) * 2 - 1
        a = agent.act(s)
        agent.remember(s, a, -float((a[0] - 0.5 * s[0]) ** 2), s, done=True)
        agent.learn()
    assert error() < 0.05


# --------------------------------------------------------------------------- PAGE mappings


def test_to_unit():
    assert torch.equal(to_unit(torch.tensor([-1.0, 0.0, 1.0])), torch.tensor([0.0, 0.5, 1.0]))


def test_clip_action_to_hparams_is_the_authors_code_mapping():
    lr_min, lr_max, epoch_max = 1e-3, 0.1, 20

    def f(*args, **kwargs):
        return client_action_to_hparams(*args, **kwargs, action_map="clip")

    assert f(torch.tensor([-1.0, -1.0]), lr_min, lr_max, epoch_max) == (lr_min, 1)  # 0.2 epochs -> at least 1
    assert f(torch.tensor([1.0, 1.0]), lr_min, lr_max, epoch_max) == (lr_max, epoch_max)
    assert f(torch.tensor([0.3, 0.5]), lr_min, lr_max, epoch_max) == (lr_max, epoch_max)  # clipped at lr_max
    lr, epochs = f(torch.tensor([-0.9, -0.9]), lr_min, lr_max, epoch_max)  # u = 0.05 -> 0.05 * 200 = 10
    assert lr == pytest.approx(0.05, rel=1e-6) and epochs == 10
    a1 = 2 * 0.0474 - 1  # u = 0.0474 -> 9.48 epochs
    assert f(torch.tensor([0.0, a1]), lr_min, lr_max, epoch_max)[1] == 9
    a1 = 2 * 0.0476 - 1  # 9.52 epochs: round -> 10, the authors' int() -> 9
    assert f(torch.tensor([0.0, a1]), lr_min, lr_max, epoch_max)[1] == 10
    assert f(torch.tensor([0.0, a1]), lr_min, lr_max, epoch_max, rounding="floor")[1] == 9
    with pytest.raises(ConfigError, match="page.lr_min"):
        f(torch.zeros(2), 0.2, 0.1, 20)
    with pytest.raises(ConfigError, match="page.client_action"):
        f(torch.zeros(3), lr_min, lr_max, epoch_max)


def test_linear_map_reaches_both_ends_and_the_middle_of_the_lr_and_epoch_ranges():
    for lr_min, lr_max, epoch_max, middle in ((0.01, 0.19, 9, 5), (1e-3, 0.1, 20, 11), (0.01, 1.99, 1, 1)):
        f = client_action_to_hparams  # the default map
        assert f(torch.tensor([-1.0, -1.0]), lr_min, lr_max, epoch_max) == (lr_min, 1)
        assert f(torch.tensor([1.0, 1.0]), lr_min, lr_max, epoch_max) == (pytest.approx(lr_max, rel=1e-12), epoch_max)
        lr, epochs = f(torch.zeros(2), lr_min, lr_max, epoch_max)
        assert lr == pytest.approx((lr_min + lr_max) / 2, rel=1e-12) and epochs == middle
        lr, _ = f(torch.tensor([-0.5, 0.0]), lr_min, lr_max, epoch_max)
        assert lr == pytest.approx(lr_min + 0.25 * (lr_max - lr_min), rel=1e-6)  # affine in between


def test_linear_map_gives_every_epoch_count_an_equal_share_of_the_box():
    a = torch.linspace(-1, 1, 9001)
    epochs = [linear_action_to_hparams(torch.stack([x, x]), 0.01, 0.19, 9)[1] for x in a]
    counts = torch.bincount(torch.tensor(epochs), minlength=10)[1:]
    assert int(counts.min()) >= 999 and int(counts.max()) <= 1001  # 9001 points over 9 equal bins
    assert epochs == sorted(epochs)  # monotone in the action
    # the boundaries between counts sit at u = k / epoch_max
    for offset, epochs in ((-1e-9, 3), (1e-9, 4)):
        a = torch.tensor([0.0, 2 * (3 / 9) - 1 + offset], dtype=torch.float64)
        assert linear_action_to_hparams(a, 0.01, 0.19, 9)[1] == epochs


def _code_mapping(a: torch.Tensor, lr_min: float, lr_max: float, epoch_max: int, rounding: str) -> tuple:
    """The authors' code's mapping written out: u = clip((a + 1)/2, lr_min, lr_max) in float64."""
    u0 = min(max((float(a[0].double()) + 1.0) / 2.0, lr_min), lr_max)
    u1 = min(max((float(a[1].double()) + 1.0) / 2.0, lr_min), lr_max)
    e = math.floor(u1 * epoch_max / lr_max + 0.5) if rounding == "round" else math.floor(u1 * int(epoch_max / lr_max))
    return u0, max(1, int(e))


@pytest.mark.parametrize("rounding", ["round", "floor"])
def test_the_authors_clip_mapping_is_kept_bit_for_bit_as_an_option(rounding):
    g = torch.Generator().manual_seed(0)
    actions = torch.rand(2000, 2, generator=g) * 2 - 1
    actions[:100] = actions[:100] * 0.1 - 0.9  # many inside the unclipped sliver a ∈ [−0.998, −0.8]
    for a in actions:
        want = _code_mapping(a, 1e-3, 0.1, 20, rounding)
        assert client_action_to_hparams(a, 1e-3, 0.1, 20, rounding, action_map="clip") == want
        assert clip_action_to_hparams(a, 1e-3, 0.1, 20, rounding) == want
    with pytest.raises(ConfigError, match="page.action_map"):
        client_action_to_hparams(torch.zeros(2), 1e-3, 0.1, 20, action_map="log")


def test_linear_map_holds_actions_outside_the_box_at_the_ends():
    assert linear_action_to_hparams(torch.tensor([1.5, 3.0]), 0.01, 0.19, 9) == (pytest.approx(0.19), 9)
    assert linear_action_to_hparams(torch.tensor([-3.0, -1.5]), 0.01, 0.19, 9) == (0.01, 1)


def test_linear_map_refuses_bad_input_and_takes_any_lr_max():
    assert linear_action_to_hparams(torch.ones(2), 0.5, 3.0, 2) == (3.0, 2)  # lr_max > 1 is reachable here
    with pytest.raises(ConfigError, match="page.client_action"):
        linear_action_to_hparams(torch.zeros(3), 0.01, 0.1, 2)
    with pytest.raises(ConfigError, match="page.lr_min"):
        linear_action_to_hparams(torch.zeros(2), 0.2, 0.1, 2)
    with pytest.raises(ConfigError, match="page.epoch_max"):
        linear_action_to_hparams(torch.zeros(2), 0.01, 0.1, 0)


def test_exploration_noise_spreads_a_short_runs_actions_over_the_range():
    """50 exploring actions of a fresh agent (its actor says ≈ 0 everywhere): the default OU noise moves
    the learning rate over most of the range and visits most epoch counts. The authors' dt = 0.01 moves
    the action by 0.02 per step and stays near the actor's choice."""
    state = torch.zeros(1)

    def spread(**settings):
        agent = DDPGAgent(DDPGConfig(state_dim=1, action_dim=2, warmup=0, **settings), seed=0)
        mapped = [client_action_to_hparams(agent.act(state), 0.01, 0.19, 9) for _ in range(50)]
        lrs = [lr for lr, _ in mapped]
        return (max(lrs) - min(lrs)) / 0.18, len({e for _, e in mapped})

    lr_share, epoch_counts = spread()
    assert lr_share >= 0.4 and epoch_counts >= 6  # 0.44-0.89 and 6-8 over agent seeds 0-4
    lr_share, epoch_counts = spread(ou_dt=1e-2)
    assert lr_share < 0.2 and epoch_counts <= 3  # 0.06-0.12 and 2


def test_server_action_to_weights():
    a = torch.tensor([-1.0, 0.0, 1.0, 0.5])
    w = server_action_to_weights(a)
    u = torch.tensor([0.0, 0.5, 1.0, 0.75])
    assert torch.allclose(w, u / u.sum()) and w.sum().item() == pytest.approx(1.0)
    assert torch.equal(server_action_to_weights(-torch.ones(4)), torch.full((4,), 0.25))
    assert torch.allclose(server_action_to_weights(torch.full((5,), 0.3)), torch.full((5,), 0.2))
    with pytest.raises(ConfigError, match="page.server_action"):
        server_action_to_weights(torch.zeros(2, 2))


# --------------------------------------------------------------------------- edges (mutation run)


def test_defaults_are_pages_synthetic_settings():
    c = DDPGConfig(state_dim=2, action_dim=1)
    expected = {
        "hidden": [40, 30], "actor_lr": 5e-4, "critic_lr": 5e-3, "tau": 0.005, "gamma": 0.99,
        "buffer_size": 60000, "batch_size": 32, "warmup": 35, "noise": True, "ou_theta": 0.15, "ou_sigma": 0.2,
        "eps_decay_steps": 500, "ou_mu": 0.0, "ou_dt": 1.0, "init": "fan_in", "final_init": 3e-3,
    }  # fmt: skip
    assert {k: v for k, v in c.to_dict().items() if k in expected} == expected
    assert OUNoise(2, theta=0.15, sigma=0.2).dt == 1.0


@pytest.mark.parametrize(
    "settings",
    [
        {"hidden": (1, 1)},
        {"gamma": 0.0},
        {"gamma": 1.0},
        {"batch_size": 1, "buffer_size": 1},
        {"ou_theta": 0.0, "ou_sigma": 0.0},
    ],
)
def test_edge_settings_are_accepted(settings):
    agent = DDPGAgent(DDPGConfig(**{"state_dim": 2, "action_dim": 1, "warmup": 0, "batch_size": 2, **settings}), seed=0)
    fill(agent, 2)
    agent.act(torch.zeros(2))
    assert agent.learn()


@pytest.mark.parametrize("field, value", [("critic_lr", 0.0), ("final_init", 0.0), ("gamma", 1.5), ("batch_size", 0)])
def test_settings_just_outside_the_range_are_refused(field, value):
    with pytest.raises(ConfigError, match=f"ddpg.{field}"):
        DDPGConfig(**{"state_dim": 2, "action_dim": 1, field: value})


def test_the_critic_scores_one_unbatched_pair_like_a_batch_of_one():
    agent = DDPGAgent(DDPGConfig(state_dim=3, action_dim=2), seed=0)
    s, a = torch.rand(3), torch.rand(2) * 2 - 1
    q = agent.critic(s, a)
    assert q.shape == ()
    torch.testing.assert_close(q, agent.critic(s[None], a[None])[0])


@pytest.mark.parametrize("scheme", ["fan_in", "code"])
def test_hidden_biases_are_pytorchs_default_uniform(scheme):
    agent = DDPGAgent(DDPGConfig(state_dim=4, action_dim=1, hidden=(400, 400), init=scheme), seed=0)
    for net in (agent.actor, agent.critic):
        b = net.fc2.bias.detach()
        bound = 1 / math.sqrt(net.fc2.weight.shape[1])
        assert b.abs().max() <= bound and b.max() > 0.95 * bound and b.min() < -0.95 * bound


def test_target_networks_take_no_gradient():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1), seed=0)
    assert not any(p.requires_grad for net in (agent.actor_target, agent.critic_target) for p in net.parameters())
    assert all(p.requires_grad for net in (agent.actor, agent.critic) for p in net.parameters())


def test_drawing_no_rows_is_allowed():
    assert sample_without_replacement(5, 0, torch.Generator().manual_seed(0)) == []
    assert sample_without_replacement(0, 0, torch.Generator().manual_seed(0)) == []


def test_a_fresh_agents_empty_buffer_round_trips():
    config = DDPGConfig(state_dim=2, action_dim=1)
    fresh = DDPGAgent(config, seed=0).state_dict()
    other = DDPGAgent(config, seed=1)
    fill(other, 3)
    other.load_state_dict(fresh)
    assert len(other.buffer) == 0 and other.buffer.pos == 0


def test_a_changed_learning_rate_is_restored():
    config = DDPGConfig(state_dim=2, action_dim=1)
    agent = DDPGAgent(config, seed=0)
    agent.actor_optim.param_groups[0]["lr"] = 1e-2  # e.g. a schedule moved it
    other = DDPGAgent(config, seed=0)
    other.load_state_dict(agent.state_dict())
    assert other.actor_optim.param_groups[0]["lr"] == 1e-2 and other.critic_optim.param_groups[0]["lr"] == 5e-3


def test_every_exploring_call_after_the_warmup_counts_once():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1, warmup=2), seed=0)
    for _ in range(5):
        agent.act(torch.zeros(2))
    agent.act(torch.zeros(2), explore=False)
    assert agent.acts == 5 and agent.explore_steps == 3


def test_noisy_actions_are_clamped_to_the_unit_box():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=4, warmup=0, ou_sigma=100.0, eps_decay_steps=0), seed=0)
    actions = torch.stack([agent.act(torch.zeros(2)) for _ in range(20)])
    assert actions.abs().max() == 1.0
    assert (actions == 1.0).any() and (actions == -1.0).any()


def test_a_transition_is_not_terminal_unless_said_so():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=1), seed=0)
    agent.remember(torch.zeros(2), torch.zeros(1), 1.0, torch.ones(2))
    assert float(agent.buffer.dones[0]) == 0.0


def test_reset_noise_restarts_the_ou_process_at_its_mean():
    agent = DDPGAgent(DDPGConfig(state_dim=2, action_dim=3, warmup=0, ou_mu=0.25), seed=0)
    for _ in range(3):
        agent.act(torch.zeros(2))
    assert not torch.equal(agent.noise.x, torch.full((3,), 0.25))
    agent.reset_noise()
    assert torch.equal(agent.noise.x, torch.full((3,), 0.25))


def test_action_mapping_edges():
    clip = clip_action_to_hparams
    assert clip(torch.tensor([0.0, 1.0]), 0.3, 0.3, 1) == (0.3, 1)  # lr_min = lr_max, 1 epoch
    assert clip(torch.tensor([1.0, -1.0]), 0.1, 1.0, 4) == (1.0, 1)  # lr_max = 1
    lr, _ = clip(torch.tensor([-0.9, 0.9]), 0.001, 1.0, 5)
    assert lr == pytest.approx(0.05)  # the first component is the learning rate
    for kwargs, field in (({"lr_min": 0.0}, "page.lr_min"), ({"lr_max": 1.5}, "page.lr_max")):
        with pytest.raises(ConfigError, match=field):
            clip(torch.zeros(2), **{"lr_min": 0.1, "lr_max": 0.5, "epoch_max": 2, **kwargs})


def test_server_weights_for_one_client_and_for_a_small_total():
    assert server_action_to_weights(torch.tensor([0.3])).tolist() == [1.0]
    torch.testing.assert_close(server_action_to_weights(torch.tensor([-0.8, -1.0])), torch.tensor([1.0, 0.0]))


def test_an_agent_stays_on_the_host_when_its_state_and_inputs_come_from_the_training_device():
    """A resumed run or a spilled client store hands PAGE's and Dap-FL's agents their saved state and
    observations on the training device; the agent (host networks, host generator) reads them and
    answers on the host."""
    from pfl.federation.store import tree_map
    from tests.helpers.device_tags import is_on_device, training_device

    c = DDPGConfig(state_dim=2, action_dim=2, warmup=1, batch_size=2)
    saved = DDPGAgent(c, 0)
    fill(saved, 3)
    with training_device() as dev:
        state = tree_map(lambda t: t.to(dev), saved.state_dict())
        agent = DDPGAgent(c, 5)
        agent.load_state_dict(state)
        obs = torch.tensor([0.5, 0.25], device=dev)
        actions = [agent.act(obs) for _ in range(2)]  # the warm-up's, then the actor's
        agent.remember(obs, actions[-1].to(dev), torch.tensor(1.0, device=dev), obs)
        assert agent.learn() and not any(is_on_device(a) for a in actions)
        assert not any(is_on_device(t) for t in params(agent)) and not any(is_on_device(t) for t in agent.buffer.states)
