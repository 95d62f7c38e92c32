"""DDPG (Lillicrap et al., 2016) as a small, CPU-friendly, checkpointable agent (PAGE, Dap-FL).

One agent = actor μ(s) and critic Q(s, a), their target copies μ', Q', two Adam optimizers, a
preallocated ring replay buffer, Ornstein–Uhlenbeck exploration noise and one torch.Generator from
which every random draw comes (weights, warm-up actions, noise, mini-batches); torch's global RNG is
never touched.

    actor:  s → 40 → ReLU → 30 → ReLU → action_dim → tanh          (a ∈ [−1, 1]^action_dim)
    critic: s → 40 → ReLU → concat(·, a) → 30 → ReLU → 1           (the action enters at layer 2)

``learn()`` takes one critic step and then one actor step on a mini-batch drawn without replacement:

    y            = r + γ · (1 − done) · Q'(s', μ'(s'))
    critic loss  = mean (Q(s, a) − y)²
    actor loss   = −mean Q(s, μ(s))          (with the critic just updated)
    θ'           ← τ θ + (1 − τ) θ'          (both targets, after both steps)

``act(s)`` exploration: the first ``warmup`` exploring calls return U[−1, 1] actions (the actor is not
consulted); after that a = clamp(μ(s) + ε_k · x_k, −1, 1), where x_k is the OU process
x ← x + θ(m − x)·dt + σ·√dt·N(0, I) and ε_k = max(0, 1 − k / eps_decay_steps) for the k-th exploring
actor action (k = 0, 1, …; ``eps_decay_steps = 0`` keeps ε = 1, as in the authors' Dap-FL code).
``noise=False`` (PAGE's server agent) returns μ(s) after the warm-up. See docs/ddpg.md for the
defaults and where the paper and the authors' code differ.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pfl.errors import require
from pfl.seeding import torch_generator

INIT_SCHEMES = ("fan_in", "code")


@dataclass
class DDPGConfig:
    """DDPG hyper-parameters; defaults are PAGE's Synthetic settings (appendix C.2 / authors' code).

    ``ou_mu``, ``ou_dt``: OU mean and time step. dt = 1 is Lillicrap et al.'s process
    x ← x + θ(m − x) + σ·N(0, I): stationary std σ/√(1 − (1 − θ)²) ≈ 0.38 of the box's half-width for
    θ = 0.15, σ = 0.2, reached within ~10 actions. The authors' code's dt = 1e-2 moves x by σ√dt = 0.02
    per action (std ≈ 0.1 after 25 actions), too little to leave a corner of the box in a run.
    ``init``: "fan_in" (Lillicrap et al.: hidden weights and biases U(±1/√fan_in), final layer
    U(±final_init)) or "code" (the authors' code: hidden weights U(±1/√fan_out), final weights
    U(±final_init), biases PyTorch's default U(±1/√fan_in)).
    ``eps_decay_steps = 0``: no decay, ε stays 1.
    """

    state_dim: int
    action_dim: int
    hidden: tuple[int, int] = (40, 30)
    actor_lr: float = 5e-4
    critic_lr: float = 5e-3
    tau: float = 0.005
    gamma: float = 0.99
    buffer_size: int = 60000
    batch_size: int = 32
    warmup: int = 35
    noise: bool = True
    ou_theta: float = 0.15
    ou_sigma: float = 0.2
    eps_decay_steps: int = 500
    ou_mu: float = 0.0
    ou_dt: float = 1.0
    init: str = "fan_in"
    final_init: float = 3e-3

    def __post_init__(self) -> None:
        self.hidden = tuple(int(h) for h in self.hidden)
        require(self.state_dim >= 1, "ddpg.state_dim", f"must be >= 1 (got {self.state_dim})")
        require(self.action_dim >= 1, "ddpg.action_dim", f"must be >= 1 (got {self.action_dim})")
        require(
            len(self.hidden) == 2 and min(self.hidden) >= 1,
            "ddpg.hidden",
            f"must be two positive widths (got {self.hidden})",
            "the critic takes the action at its second layer, so there are exactly two hidden layers",
        )
        require(self.actor_lr > 0, "ddpg.actor_lr", f"must be > 0 (got {self.actor_lr})")
        require(self.critic_lr > 0, "ddpg.critic_lr", f"must be > 0 (got {self.critic_lr})")
        require(0.0 <= self.tau <= 1.0, "ddpg.tau", f"must be in [0, 1] (got {self.tau})")
        require(0.0 <= self.gamma <= 1.0, "ddpg.gamma", f"must be in [0, 1] (got {self.gamma})")
        require(self.batch_size >= 1, "ddpg.batch_size", f"must be >= 1 (got {self.batch_size})")
        require(
            self.buffer_size >= self.batch_size,
            "ddpg.buffer_size",
            f"must be >= batch_size (got {self.buffer_size} < {self.batch_size})",
        )
        require(self.warmup >= 0, "ddpg.warmup", f"must be >= 0 (got {self.warmup})")
        require(self.ou_theta >= 0, "ddpg.ou_theta", f"must be >= 0 (got {self.ou_theta})")
        require(self.ou_sigma >= 0, "ddpg.ou_sigma", f"must be >= 0 (got {self.ou_sigma})")
        require(self.ou_dt > 0, "ddpg.ou_dt", f"must be > 0 (got {self.ou_dt})")
        require(
            self.eps_decay_steps >= 0,
            "ddpg.eps_decay_steps",
            f"must be >= 0 (got {self.eps_decay_steps})",
            "0 keeps ε = 1",
        )
        require(self.init in INIT_SCHEMES, "ddpg.init", f"unknown scheme {self.init!r}", f"use one of {INIT_SCHEMES}")
        require(self.final_init > 0, "ddpg.final_init", f"must be > 0 (got {self.final_init})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d


# --------------------------------------------------------------------------- networks


class Actor(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, hidden: tuple[int, int]):
        super().__init__()
        # Built on the meta device: nn.Linear's own initialisation would draw from the global RNG.
        self.fc1 = nn.Linear(state_dim, hidden[0], device="meta")
        self.fc2 = nn.Linear(hidden[0], hidden[1], device="meta")
        self.fc3 = nn.Linear(hidden[1], action_dim, device="meta")

    def forward(self, state: Tensor) -> Tensor:
        return torch.tanh(self.fc3(F.relu(self.fc2(F.relu(self.fc1(state))))))


class Critic(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, hidden: tuple[int, int]):
        super().__init__()
        self.fc1 = nn.Linear(state_dim, hidden[0], device="meta")
        self.fc2 = nn.Linear(hidden[0] + action_dim, hidden[1], device="meta")
        self.fc3 = nn.Linear(hidden[1], 1, device="meta")

    def forward(self, state: Tensor, action: Tensor) -> Tensor:
        h = F.relu(self.fc1(state))
        h = F.relu(self.fc2(torch.cat([h, action], dim=-1)))
        return self.fc3(h).squeeze(-1)


def _init_layers(net: nn.Module, scheme: str, final_init: float, generator: torch.Generator) -> None:
    """Fill a freshly built (meta) network's fc1, fc2, fc3 from ``generator``; see DDPGConfig.init."""
    net.to_empty(device="cpu")
    with torch.no_grad():
        for name in ("fc1", "fc2", "fc3"):
            layer: nn.Linear = getattr(net, name)
            fan_out, fan_in = layer.weight.shape
            bias_bound = 1.0 / math.sqrt(fan_in)  # PyTorch's default bias bound and the fan-in rule
            if name == "fc3":
                w_bound = final_init
                if scheme == "fan_in":
                    bias_bound = final_init
            else:
                w_bound = 1.0 / math.sqrt(fan_in if scheme == "fan_in" else fan_out)
            layer.weight.uniform_(-w_bound, w_bound, generator=generator)
            layer.bias.uniform_(-bias_bound, bias_bound, generator=generator)


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """θ' ← τ θ + (1 − τ) θ' for every parameter; τ = 1 copies exactly, τ = 0 leaves θ' unchanged."""
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters(), strict=True):
            t.lerp_(s, tau)  # lerp is exact at both ends (weight 0 and 1)


# --------------------------------------------------------------------------- replay and noise


def sample_without_replacement(n: int, k: int, generator: torch.Generator) -> list[int]:
    """k distinct integers of range(n), every k-subset equally likely (Floyd's algorithm).

    O(k) work and one draw of k uniforms, where a permutation of the whole buffer would cost O(n)
    (about 0.7 ms for n = 60 000 on a CPU, more than the rest of a learn() step)."""
    require(0 <= k <= n, "ddpg.batch_size", f"cannot draw {k} distinct rows from {n}")
    u = torch.rand(k, generator=generator, dtype=torch.float64).tolist()
    chosen: set[int] = set()
    out: list[int] = []
    for j, uj in zip(range(n - k, n), u, strict=True):
        t = min(int(uj * (j + 1)), j)  # uniform on {0, …, j}
        pick = j if t in chosen else t
        chosen.add(pick)
        out.append(pick)
    return out


class ReplayBuffer:
    """Ring buffer of (s, a, r, s', done) in preallocated tensors; the oldest row is overwritten first."""

    def __init__(self, capacity: int, state_dim: int, action_dim: int, device: torch.device):
        self.capacity = capacity
        self.states = torch.zeros(capacity, state_dim, device=device)
        self.actions = torch.zeros(capacity, action_dim, device=device)
        self.rewards = torch.zeros(capacity, device=device)
        self.next_states = torch.zeros(capacity, state_dim, device=device)
        self.dones = torch.zeros(capacity, device=device)  # 1.0 where the episode ended
        self.pos = 0  # next row to write
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, state: Tensor, action: Tensor, reward: float, next_state: Tensor, done: bool) -> None:
        i = self.pos
        self.states[i] = state
        self.actions[i] = action
        self.rewards[i] = reward
        self.next_states[i] = next_state
        self.dones[i] = float(done)
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``batch_size`` distinct rows, uniformly (as the authors' code, which uses random.sample)."""
        idx = torch.tensor(sample_without_replacement(self.size, batch_size, generator), device=self.states.device)
        return self.states[idx], self.actions[idx], self.rewards[idx], self.next_states[idx], self.dones[idx]

    def state_dict(self) -> dict[str, Any]:
        n = self.size  # rows past `size` were never written: leave them out of checkpoints
        return {
            "states": self.states[:n].clone(),
            "actions": self.actions[:n].clone(),
            "rewards": self.rewards[:n].clone(),
            "next_states": self.next_states[:n].clone(),
            "dones": self.dones[:n].clone(),
            "pos": self.pos,
            "size": self.size,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        n = int(d["size"])
        require(0 <= n <= self.capacity, "ddpg.buffer", f"holds {n} rows but the capacity is {self.capacity}")
        for name in ("states", "actions", "rewards", "next_states", "dones"):
            dst = getattr(self, name)
            dst.zero_()
            dst[:n] = d[name].to(dst.device, dst.dtype)
        self.size, self.pos = n, int(d["pos"])


class OUNoise:
    """Ornstein–Uhlenbeck process x ← x + θ(m − x)·dt + σ·√dt·ξ, ξ ~ N(0, I); starts at m.

    As an AR(1) chain: lag-1 autocorrelation 1 − θ·dt, stationary variance σ²·dt / (1 − (1 − θ·dt)²).
    """

    def __init__(self, size: int, theta: float, sigma: float, mu: float = 0.0, dt: float = 1.0):
        self.size, self.theta, self.sigma, self.mu, self.dt = size, theta, sigma, mu, dt
        self.x = torch.full((size,), float(mu))

    def reset(self) -> None:
        self.x = torch.full((self.size,), float(self.mu))

    def sample(self, generator: torch.Generator) -> Tensor:
        xi = torch.randn(self.size, generator=generator)
        self.x = self.x + self.theta * (self.mu - self.x) * self.dt + self.sigma * math.sqrt(self.dt) * xi
        return self.x.clone()


# --------------------------------------------------------------------------- agent


# An agent's state dict holds its networks and Adam moments as two flat float32 tensors: a checkpoint
# of N agents then has a few records per agent, not ~60 small tensors (torch.save and the weights_only
# load pay per record: PAGE's client agents made its checkpoints cost 10 times those of Ditto).
NETWORKS = ("actor", "critic", "actor_target", "critic_target")
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")  # per parameter, in this order


def _pack(tensors: list[Tensor]) -> Tensor:
    """One flat float32 copy of ``tensors`` (all float32), in order."""
    for t in tensors:
        require(t.dtype == torch.float32, "ddpg.state", f"packs float32 tensors only (got {t.dtype})")
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors]) if tensors else torch.zeros(0)


def _unpack(flat: Tensor, shapes: list[torch.Size]) -> list[Tensor]:
    """``_pack`` undone: tensors of ``shapes``, views of ``flat``."""
    sizes = [math.prod(shape) for shape in shapes]
    require(
        flat.dim() == 1 and flat.numel() == sum(sizes),
        "ddpg.state",
        f"a packed state of {flat.numel()} numbers where this agent has {sum(sizes)}",
        "load the agent with the configuration it was saved with",
    )
    parts = flat.split(sizes)  # as many parts as shapes: the sizes add up to the numel checked above
    return [parts[i].reshape(shape) for i, shape in enumerate(shapes)]


def _optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Adam's step counts and moments packed (parameters in index order, ``ADAM_STATE`` each), the
    indices of the parameters that have them (none before the first step), and the learning rates."""
    sd = opt.state_dict()
    params = sorted(sd["state"])
    for k in params:
        require(set(sd["state"][k]) == set(ADAM_STATE), "ddpg.state", f"Adam state {sorted(sd['state'][k])}")
    return {
        "packed": _pack([sd["state"][k][name] for k in params for name in ADAM_STATE]),
        "params": [int(k) for k in params],
        "lr": [float(g["lr"]) for g in sd["param_groups"]],
    }


def _load_optimizer_state(opt: torch.optim.Optimizer, d: dict[str, Any]) -> None:
    live = opt.state_dict()  # param_groups (indices, betas, ...) come from the live optimizer
    groups = [dict(g, lr=lr) for g, lr in zip(live["param_groups"], d["lr"], strict=True)]
    if "packed" in d:
        shapes = [p.shape for g in opt.param_groups for p in g["params"]]
        params = [int(k) for k in d["params"]]
        require(all(0 <= k < len(shapes) for k in params), "ddpg.state", f"Adam state of parameters {params}")
        wanted = [torch.Size(()) if name == "step" else shapes[k] for k in params for name in ADAM_STATE]
        parts = iter(_unpack(d["packed"], wanted))
        state = {k: {name: next(parts).clone() for name in ADAM_STATE} for k in params}
    else:  # an agent saved by an earlier version of pfl: one tensor per entry
        state = {int(k): dict(s) for k, s in d["state"].items()}
    opt.load_state_dict({"state": state, "param_groups": groups})


class DDPGAgent:
    """One DDPG learner; see the module docstring for the update rules.

    All randomness comes from ``self.generator`` = pfl.seeding.torch_generator(seed, "ddpg") on the
    CPU; networks and replay tensors live on ``device``.
    """

    def __init__(self, config: DDPGConfig, seed: int, device: torch.device | str = "cpu"):
        c = self.config = config
        self.device = torch.device(device)
        self.generator = torch_generator(seed, "ddpg")
        self.actor = Actor(c.state_dim, c.action_dim, c.hidden)
        self.critic = Critic(c.state_dim, c.action_dim, c.hidden)
        _init_layers(self.actor, c.init, c.final_init, self.generator)
        _init_layers(self.critic, c.init, c.final_init, self.generator)
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.actor_target = Actor(c.state_dim, c.action_dim, c.hidden).to_empty(device=self.device)
        self.critic_target = Critic(c.state_dim, c.action_dim, c.hidden).to_empty(device=self.device)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.critic_target.load_state_dict(self.critic.state_dict())
        for p in (*self.actor_target.parameters(), *self.critic_target.parameters()):
            p.requires_grad_(False)
        # fused: one kernel per step instead of one per tensor (learn() about 20% faster on a CPU)
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=c.actor_lr, fused=True)
        self.critic_optim = torch.optim.Adam(self.critic.parameters(), lr=c.critic_lr, fused=True)
        self.buffer = ReplayBuffer(c.buffer_size, c.state_dim, c.action_dim, self.device)
        self.noise = OUNoise(c.action_dim, c.ou_theta, c.ou_sigma, c.ou_mu, c.ou_dt)
        self.acts = 0  # exploring act() calls so far, warm-up included
        self.explore_steps = 0  # exploring actor actions so far (after warm-up): drives ε
        self.learn_steps = 0

    # ----------------------------------------------------------------- acting

    @property
    def epsilon(self) -> float:
        """Noise scale of the next exploring actor action: max(0, 1 − k / eps_decay_steps)."""
        n = self.config.eps_decay_steps
        return 1.0 if n == 0 else max(0.0, 1.0 - self.explore_steps / n)

    @property
    def in_warmup(self) -> bool:
        """True while the next exploring act() returns a uniform random action."""
        return self.acts < self.config.warmup

    def _vector(self, x: Tensor | float, dim: int, field: str) -> Tensor:
        t = torch.as_tensor(x, dtype=torch.float32).to(self.device)
        require(t.shape == (dim,), field, f"expected shape ({dim},), got {tuple(t.shape)}")
        return t

    def act(self, state: Tensor, explore: bool = True) -> Tensor:
        """An action in [−1, 1]^action_dim for one state of shape (state_dim,).

        explore=True: uniform random during the warm-up, else μ(s) + ε·OU clamped (μ(s) when
        ``noise`` is off). explore=False: μ(s), and no counter, noise or generator state moves.
        """
        s = self._vector(state, self.config.state_dim, "ddpg.state")
        if explore and self.in_warmup:
            self.acts += 1
            u = torch.rand(self.config.action_dim, generator=self.generator)
            return (2.0 * u - 1.0).to(self.device)
        with torch.no_grad():
            a = self.actor(s.unsqueeze(0)).squeeze(0)
        if not explore:
            return a
        self.acts += 1
        if self.config.noise:
            a = (a + self.epsilon * self.noise.sample(self.generator).to(self.device)).clamp(-1.0, 1.0)
        self.explore_steps += 1
        return a

    def reset_noise(self) -> None:
        """Restart the OU process at its mean (the start of a new episode)."""
        self.noise.reset()

    # ----------------------------------------------------------------- learning

    def remember(
        self, state: Tensor, action: Tensor, reward: float | Tensor, next_state: Tensor, done: bool = False
    ) -> None:
        """Store one transition; ``action`` is the agent-space action (what ``act`` returned)."""
        c = self.config
        self.buffer.add(
            self._vector(state, c.state_dim, "ddpg.state"),
            self._vector(action, c.action_dim, "ddpg.action"),
            float(reward),
            self._vector(next_state, c.state_dim, "ddpg.next_state"),
            bool(done),
        )

    def learn(self) -> dict[str, float]:
        """One critic step and one actor step, then the soft target updates; {} until the buffer
        holds ``batch_size`` transitions. Returns {"critic_loss", "actor_loss"}."""
        c = self.config
        if len(self.buffer) < c.batch_size:
            return {}
        s, a, r, s2, done = self.buffer.sample(c.batch_size, self.generator)
        with torch.no_grad():
            y = r + c.gamma * (1.0 - done) * self.critic_target(s2, self.actor_target(s2))
        critic_loss = F.mse_loss(self.critic(s, a), y)
        self.critic_optim.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optim.step()

        actor_loss = -self.critic(s, self.actor(s)).mean()
        self.actor_optim.zero_grad(set_to_none=True)
        actor_loss.backward()  # also fills critic grads; the next critic step clears them first
        self.actor_optim.step()

        soft_update(self.actor_target, self.actor, c.tau)
        soft_update(self.critic_target, self.critic, c.tau)
        self.learn_steps += 1
        return {"critic_loss": critic_loss.item(), "actor_loss": actor_loss.item()}

    # ----------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (cloned tensors) with only tensors, ints, floats, bools, str, lists and dicts,
        so ``torch.load(weights_only=True)`` reads it back."""
        return {
            "config": json.dumps(self.config.to_dict()),  # one string: one record to unpickle
            "networks": _pack([t for name in NETWORKS for t in getattr(self, name).state_dict().values()]),
            "actor_optim": _optimizer_state(self.actor_optim),
            "critic_optim": _optimizer_state(self.critic_optim),
            "buffer": self.buffer.state_dict(),
            "noise": {"x": self.noise.x.clone()},
            "acts": self.acts,
            "explore_steps": self.explore_steps,
            "learn_steps": self.learn_steps,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore everything ``state_dict`` saved; the configs must be equal."""
        saved = json.loads(d["config"]) if isinstance(d["config"], str) else d["config"]  # earlier pfl: a dict
        mine = self.config.to_dict()  # plain JSON values already (hidden a list), as saved
        for f in fields(DDPGConfig):
            require(
                saved.get(f.name) == mine[f.name],
                f"ddpg.{f.name}",
                f"the saved agent has {saved.get(f.name)!r}, this one {mine[f.name]!r}",
                "build the agent with the configuration it was saved with",
            )
        if "networks" in d:
            live = {name: getattr(self, name).state_dict() for name in NETWORKS}
            parts = iter(_unpack(d["networks"], [t.shape for sd in live.values() for t in sd.values()]))
            for name, sd in live.items():
                getattr(self, name).load_state_dict({key: next(parts) for key in sd})
        else:  # an agent saved by an earlier version of pfl: one dict per network
            for name in NETWORKS:
                getattr(self, name).load_state_dict(d[name])
        _load_optimizer_state(self.actor_optim, d["actor_optim"])
        _load_optimizer_state(self.critic_optim, d["critic_optim"])
        self.buffer.load_state_dict(d["buffer"])
        self.noise.x = d["noise"]["x"].detach().clone().cpu()
        self.acts, self.explore_steps, self.learn_steps = int(d["acts"]), int(d["explore_steps"]), int(d["learn_steps"])
        self.generator.set_state(d["generator"].cpu())


# --------------------------------------------------------------------------- PAGE action mappings


def to_unit(a: Tensor) -> Tensor:
    """(a + 1) / 2: a tanh action in [−1, 1] to [0, 1]."""
    return (a + 1.0) / 2.0


ACTION_MAPS = ("linear", "clip")


def _check_range(lr_min: float, lr_max: float, epoch_max: int) -> None:
    require(0 < lr_min <= lr_max, "page.lr_min", f"need 0 < lr_min <= lr_max (got {lr_min}, {lr_max})")
    require(epoch_max >= 1, "page.epoch_max", f"must be >= 1 (got {epoch_max})")


def linear_action_to_hparams(a: Tensor, lr_min: float, lr_max: float, epoch_max: int) -> tuple[float, int]:
    """PAGE client action (2 values in [−1, 1]) → (lr, epochs), affine over the whole box (pfl's default).

        u      = (a + 1) / 2                                  ∈ [0, 1]²
        lr     = lr_min + u₀ · (lr_max − lr_min)              ∈ [lr_min, lr_max]
        epochs = min(epoch_max, 1 + ⌊u₁ · epoch_max⌋)         ∈ {1, …, epoch_max}

    a = −1 gives (lr_min, 1), a = +1 gives (lr_max, epoch_max), a = 0 the middle of both ranges; each
    epoch count takes an equal share (2 / epoch_max) of [−1, 1], so a uniform action is a uniform
    epoch count. Computed in float64.
    """
    require(a.numel() == 2, "page.client_action", f"expected 2 values (lr, epochs), got {a.numel()}")
    _check_range(lr_min, lr_max, epoch_max)
    u = to_unit(a.detach().reshape(2).to(dtype=torch.float64, device="cpu")).clamp(0.0, 1.0)
    lr = lr_min + float(u[0]) * (lr_max - lr_min)
    return lr, min(epoch_max, 1 + math.floor(float(u[1]) * epoch_max))


def clip_action_to_hparams(
    a: Tensor, lr_min: float, lr_max: float, epoch_max: int, rounding: str = "round"
) -> tuple[float, int]:
    """PAGE client action (2 values in [−1, 1]) → (lr, epochs) as the authors' code maps it.

        u      = clip((a + 1) / 2, lr_min, lr_max)          (both components, as the authors' code)
        lr     = u₀                                          ∈ [lr_min, lr_max]
        epochs = max(1, R(u₁ · epoch_max / lr_max))          ∈ [1, epoch_max]

    R = round half up ("round": the formula's epochs read as the nearest integer) or floor ("floor":
    the authors' code, github.com/ivy-h7/PAGE, which truncates with int() and also truncates the
    scale int(epoch_max / lr_max)). Only u₁ ∈ [lr_min, lr_max] varies the epochs, i.e.
    a₁ ∈ [2·lr_min − 1, 2·lr_max − 1] ([−0.998, −0.8] for PAGE's Synthetic range); every larger a₁
    gives epoch_max, and likewise lr_max for a₀ (90 % of the box). Computed in float64.
    """
    require(a.numel() == 2, "page.client_action", f"expected 2 values (lr, epochs), got {a.numel()}")
    _check_range(lr_min, lr_max, epoch_max)
    require(
        lr_max <= 1,
        "page.lr_max",
        f"must be <= 1 (got {lr_max})",
        "(a + 1) / 2 never exceeds 1, so larger is unreachable",
    )
    require(rounding in ("round", "floor"), "page.epoch_rounding", f"unknown {rounding!r}", "use 'round' or 'floor'")
    u = to_unit(a.detach().reshape(2).to(dtype=torch.float64, device="cpu")).clamp(lr_min, lr_max)
    lr = float(u[0])
    if rounding == "round":
        epochs = math.floor(float(u[1]) * epoch_max / lr_max + 0.5)
    else:
        epochs = math.floor(float(u[1]) * int(epoch_max / lr_max))
    return lr, max(1, int(epochs))


def client_action_to_hparams(
    a: Tensor, lr_min: float, lr_max: float, epoch_max: int, rounding: str = "round", action_map: str = "linear"
) -> tuple[float, int]:
    """PAGE client action → (lr, epochs): ``action_map`` "linear" (``linear_action_to_hparams``, the
    default) or "clip" (``clip_action_to_hparams``, the authors' code; ``rounding`` applies to it)."""
    require(action_map in ACTION_MAPS, "page.action_map", f"unknown {action_map!r}", f"use one of {ACTION_MAPS}")
    if action_map == "clip":
        return clip_action_to_hparams(a, lr_min, lr_max, epoch_max, rounding)
    return linear_action_to_hparams(a, lr_min, lr_max, epoch_max)


def server_action_to_weights(a: Tensor) -> Tensor:
    """PAGE server action (K values in [−1, 1]) → aggregation weights w = u / Σu with u = (a + 1)/2;
    uniform 1/K when Σu = 0 (every a_k = −1)."""
    require(a.dim() == 1 and a.numel() >= 1, "page.server_action", f"expected shape (K,), got {tuple(a.shape)}")
    u = to_unit(a).clamp_min(0.0)  # tanh is ≥ −1, the clamp only guards rounding
    total = u.sum()
    uniform = torch.full_like(u, 1.0 / u.numel())
    return torch.where(total > 0, u / total.clamp_min(torch.finfo(u.dtype).tiny), uniform)
