"""What PAGE and Dap-FL share: their agents' hyper-parameters (``DDPGParams``, the options of every
``DDPGMethod``), DDPG agents kept as plain state dicts, the client action → (learning rate, epochs)
mapping with its warm-up and replay options, and the split the agents are scored on (``reward_split``).

An agent's whole state (networks, Adam moments, replay rows, OU noise, counters, generator) lives in
the client's or the server's state dict, so it is checkpointed with the federation and a resumed
run takes the same actions. ``AgentPool`` loads a state dict into a scratch agent of the same
configuration (one per configuration, reused like the worker's one model): the pool is a pure
cache, every call to ``load`` restores everything the agent does next.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal, get_args, get_type_hints

import torch
from torch import Tensor

from pfl.engine.fit_spec import EvalStats
from pfl.errors import ConfigError, require
from pfl.methods.base import ClientContext, Method
from pfl.optim.ddpg import ACTION_MAPS, DDPGAgent, DDPGConfig, client_action_to_hparams
from pfl.seeding import torch_generator

WarmupSpace = Literal["agent", "hparams"]
ReplayActions = Literal["agent", "mapped"]
WARMUP_SPACES, REPLAY_ACTIONS = get_args(WarmupSpace), get_args(ReplayActions)
EpochRounding = Literal["round", "floor"]
ActionMap = Literal["linear", "clip"]  # pfl.optim.ddpg.ACTION_MAPS
Init = Literal["fan_in", "code"]  # pfl.optim.ddpg.INIT_SCHEMES
# What the agents' states and rewards are scored on: the clients' validation splits (and their union
# on the server), or the papers' choice, the local test splits (and the global test set) reported.
RewardSplit = Literal["validation", "test"]
VAL_FIX = "set data.val_frac > 0 (e.g. 0.1), or method.reward_split: test (the paper: tunes on the test set)"


class AgentPool:
    """Scratch DDPG agents, one per configuration, into which saved agents are loaded. Per thread:
    under ``trainer.vectorize`` each client's local update runs in a thread of its own and keeps its
    loaded agent across its fit (``pfl.engine.lockstep``), so clients never share a scratch agent."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def _scratch(self) -> dict[str, DDPGAgent]:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = {}
        return scratch

    def new(self, config: DDPGConfig, seed: int) -> DDPGAgent:
        """A freshly initialised agent (its first state dict is what ``load`` restores later)."""
        return DDPGAgent(config, seed)

    def load(self, config: DDPGConfig, state: dict[str, Any]) -> DDPGAgent:
        """The agent saved in ``state``. The returned object is shared: save it (``state_dict``)
        before loading another agent of the same configuration."""
        key = repr(sorted(config.to_dict().items()))
        agent = self._scratch.get(key)
        if agent is None:
            agent = self._scratch[key] = DDPGAgent(config, 0)
        agent.load_state_dict(state)
        return agent


def learn_after_warmup(agent: DDPGAgent) -> None:
    """One critic and one actor step, once the agent has acted past its warm-up (the authors' code
    updates from the first round whose action came from the actor)."""
    if agent.acts > agent.config.warmup:
        agent.learn()


def check_warmup(warmup: int, rounds: int) -> None:
    """Refuse a warm-up as long as the run: the agents would never act, and the run would be the
    random-actions control under the method's name."""
    require(
        warmup < rounds,
        "method.warmup",
        f"{warmup} warm-up rounds of random actions leave no round of the {rounds}-round run to the agents",
        "lower method.warmup well under trainer.rounds (about a tenth), or set method.actions: random",
    )


def client_split(reward_split: str) -> str:
    """The client split (``ClientContext.evaluate``'s ``on``) the agents are scored on."""
    return "val" if reward_split == "validation" else "test"


def agent_score(client: ClientContext, state: Tensor, reward_split: str, method: str) -> EvalStats:
    """``state`` scored on the client's ``reward_split`` split for its agent; a client without a
    validation split is refused by name."""
    if reward_split == "validation":
        require(
            len(client.val_idx) > 0,
            "data.val_frac",
            f"{method}'s agents score on validation splits (method.reward_split: validation); "
            f"client {client.cid} has none",
            VAL_FIX,
        )
    return client.evaluate(state, client_split(reward_split))


def uniform_action(dim: int, *keys: int | str) -> Tensor:
    """An action uniform in [−1, 1]^dim from a generator keyed by ``keys`` (run seed, who, round, …),
    so a resumed run draws the same actions."""
    return 2.0 * torch.rand(dim, generator=torch_generator(*keys)) - 1.0


@dataclass
class HparamRange:
    """Client actions (2 values in [−1, 1]) as a local learning rate and a number of local epochs.

    ``action_map``: "linear" (the default: [−1, 1] onto [lr_min, lr_max] and onto 1…epoch_max) or
    "clip" (the authors' code: clip((a + 1)/2, lr_min, lr_max), which saturates); see
    ``pfl.optim.ddpg.client_action_to_hparams``.
    ``rounding``: the clip map's epoch rounding, "round" or "floor" (the authors' code); the linear
    map has its own equal-width bins, so it takes only the default.
    ``warmup_space``: "agent" — warm-up actions are uniform in the agent's [−1, 1]² (with the linear
    map: uniform over the range; with the clip map: lr = lr_max, and independently epochs =
    epoch_max, with probability 1 − lr_max); "hparams" (clip map only) — the authors' code: uniform
    in [lr_min, lr_max] for both components, obtained from the same uniform draw u = (a + 1)/2 as
    u' = lr_min + u (lr_max − lr_min), stored as a' = 2u' − 1 (which maps back to the same
    hyper-parameters).
    ``replay``: "agent" stores the agent-space action (standard DDPG); "mapped" stores (lr, epochs)
    as the authors' code does.
    """

    lr_min: float
    lr_max: float
    epoch_max: int
    rounding: str = "round"
    warmup_space: str = "agent"
    replay: str = "agent"
    action_map: str = "linear"

    def __post_init__(self) -> None:
        require(
            0 < self.lr_min <= self.lr_max, "method.lr_min", f"need 0 < lr_min <= lr_max ({self.lr_min}, {self.lr_max})"
        )
        require(
            self.action_map in ACTION_MAPS,
            "method.action_map",
            f"unknown {self.action_map!r}",
            f"choose one of {', '.join(ACTION_MAPS)}",
        )
        clip = self.action_map == "clip"
        require(
            self.lr_max <= 1 or not clip,
            "method.lr_max",
            f"must be <= 1 with action_map clip (got {self.lr_max})",
            "(a + 1)/2 never exceeds 1; action_map linear reaches any lr_max",
        )
        require(self.epoch_max >= 1, "method.epoch_max", f"must be >= 1 (got {self.epoch_max})")
        require(
            self.rounding in ("round", "floor"), "method.epoch_rounding", f"unknown {self.rounding!r}", "round | floor"
        )
        require(
            self.warmup_space in WARMUP_SPACES,
            "method.warmup_space",
            f"unknown {self.warmup_space!r}",
            f"choose one of {', '.join(WARMUP_SPACES)}",
        )
        require(
            self.replay in REPLAY_ACTIONS,
            "method.replay_actions",
            f"unknown {self.replay!r}",
            f"choose one of {', '.join(REPLAY_ACTIONS)}",
        )
        require(
            clip or self.rounding == "round",
            "method.epoch_rounding",
            f"{self.rounding!r} is a rounding of action_map clip",
            "the linear map bins the epochs itself: leave epoch_rounding at round, or set action_map: clip",
        )
        require(
            clip or self.warmup_space == "agent",
            "method.warmup_space",
            f"{self.warmup_space!r} is the warm-up of action_map clip",
            "with action_map linear agent-space warm-up is already uniform over the range: use agent",
        )

    def hparams(self, action: Tensor) -> tuple[float, int]:
        return client_action_to_hparams(
            action, self.lr_min, self.lr_max, self.epoch_max, self.rounding, self.action_map
        )

    def act(self, agent: DDPGAgent, state: Tensor) -> Tensor:
        """The agent's exploring action, with warm-up draws moved to ``warmup_space``."""
        warm = agent.in_warmup
        a = agent.act(state)
        if warm and self.warmup_space == "hparams":
            u = self.lr_min + (a + 1.0) / 2.0 * (self.lr_max - self.lr_min)
            a = 2.0 * u - 1.0
        return a

    def replayed(self, action: Tensor, lr: float, epochs: int) -> Tensor:
        """What goes into the replay buffer for this action."""
        return action if self.replay == "agent" else torch.tensor([lr, float(epochs)])


# The DDPG agent's defaults are DDPGConfig's: DDPGParams names them once more only as its own fields.
AGENT_DEFAULTS = {f.name: f.default for f in fields(DDPGConfig) if f.default is not MISSING}
# DDPGConfig's fields that DDPGParams holds under the same name and passes to each agent as they are.
AGENT_FIELDS = ("tau", "gamma", "buffer_size", "warmup", "ou_theta", "ou_sigma", "ou_dt", "eps_decay_steps", "init")


@dataclass(frozen=True)
class DDPGParams:
    """The hyper-parameters PAGE's client agents and Dap-FL's agents share: the range their actions
    map onto, the DDPG agent's settings and the split they are scored on. Defaults are PAGE's
    Synthetic settings; the DDPG ones follow PAGE's appendix C.2 and the authors' code
    (github.com/ivy-h7/PAGE).

    Args:
        lr_min: lower end of the local learning-rate range.
        lr_max: upper end of the local learning-rate range.
        epoch_max: most local epochs an action can choose.
        hidden: the two hidden widths of actor and critic (null: [40, 30]).
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critic.
        tau: soft target-network update rate.
        gamma: discount factor.
        buffer_size: replay buffer rows.
        ddpg_batch_size: replay mini-batch size.
        warmup: rounds of uniform random actions before the actors act and learn.
        ou_theta: OU noise mean reversion θ.
        ou_sigma: OU noise scale σ.
        eps_decay_steps: exploration noise scale 1 − k/eps_decay_steps (0: no decay).
        init: network initialisation: fan_in (Lillicrap et al.) or code (the authors' code).
        epoch_rounding: round or floor (the authors' code) of the clip map's epochs.
        warmup_space: agent (uniform in the agent's box) or hparams (clip map: the authors' code).
        replay_actions: agent (the agent's action) or mapped (the (lr, epochs) it gave) in the replay buffer.
        action_map: linear (onto the whole range) or clip (the authors' code).
        ou_dt: OU time step (1: Lillicrap et al.; the authors' code: 0.01).
        reward_split: what the agents' states and rewards are scored on: validation (the clients'
            validation splits and their union) or test (the local test splits and the global test
            set, the papers' choice; flagged in reports).
    """

    lr_min: float = 1e-3
    lr_max: float = 0.1
    epoch_max: int = 20
    hidden: list[int] | None = None
    actor_lr: float = AGENT_DEFAULTS["actor_lr"]
    critic_lr: float = AGENT_DEFAULTS["critic_lr"]
    tau: float = AGENT_DEFAULTS["tau"]
    gamma: float = AGENT_DEFAULTS["gamma"]
    buffer_size: int = AGENT_DEFAULTS["buffer_size"]
    ddpg_batch_size: int = AGENT_DEFAULTS["batch_size"]
    warmup: int = AGENT_DEFAULTS["warmup"]
    ou_theta: float = AGENT_DEFAULTS["ou_theta"]
    ou_sigma: float = AGENT_DEFAULTS["ou_sigma"]
    eps_decay_steps: int = AGENT_DEFAULTS["eps_decay_steps"]
    init: Init = AGENT_DEFAULTS["init"]
    epoch_rounding: EpochRounding = "round"
    warmup_space: WarmupSpace = "agent"
    replay_actions: ReplayActions = "agent"
    action_map: ActionMap = "linear"
    ou_dt: float = AGENT_DEFAULTS["ou_dt"]
    reward_split: RewardSplit = "validation"

    @property
    def widths(self) -> tuple[int, ...]:
        return AGENT_DEFAULTS["hidden"] if self.hidden is None else tuple(self.hidden)

    def range(self) -> HparamRange:
        """The client actions' map onto (learning rate, epochs); checks the range options."""
        return HparamRange(
            self.lr_min,
            self.lr_max,
            self.epoch_max,
            self.epoch_rounding,
            self.warmup_space,
            self.replay_actions,
            self.action_map,
        )

    def agent(
        self,
        state_dim: int,
        action_dim: int,
        *,
        noise: bool,
        actor_lr: float | None = None,
        critic_lr: float | None = None,
        prefix: str = "",
    ) -> DDPGConfig:
        """A DDPGConfig of these settings (``actor_lr`` / ``critic_lr``: another agent's, e.g. PAGE's
        server agent, whose options are named ``<prefix>actor_lr``); its validation errors name the
        method's own fields."""
        names = {"batch_size": "ddpg_batch_size", "actor_lr": f"{prefix}actor_lr", "critic_lr": f"{prefix}critic_lr"}
        try:
            return DDPGConfig(
                state_dim=state_dim,
                action_dim=action_dim,
                hidden=self.widths,
                actor_lr=self.actor_lr if actor_lr is None else actor_lr,
                critic_lr=self.critic_lr if critic_lr is None else critic_lr,
                batch_size=self.ddpg_batch_size,
                noise=noise,
                **{name: getattr(self, name) for name in AGENT_FIELDS},
            )
        except ConfigError as err:
            key = err.field.removeprefix("ddpg.")
            raise ConfigError(f"method.{names.get(key, key)}", err.problem, err.fix) from None


class DDPGMethod(Method):
    """A method whose agents ``DDPGParams`` configures. Its options are that dataclass's fields, flat
    (``method.actor_lr``, ``method.warmup``, ...) and declared there only: this ``__init__`` shows
    jsonargparse their signature, and a subclass passes them on with ``**kwargs`` (naming a field in
    its own signature changes its default, as Dap-FL does). The values are kept as attributes of the
    same names (``hparams``), as ``self.ddpg`` and as the client actions' range ``self.range``."""

    def __init__(self, **kwargs: Any):
        self.ddpg = DDPGParams(**kwargs)
        for f in fields(DDPGParams):
            setattr(self, f.name, getattr(self.ddpg, f.name))
        self.hidden = list(self.ddpg.widths)
        self.range = self.ddpg.range()


_TYPES = get_type_hints(DDPGParams)  # resolved: jsonargparse validates against them
DDPGMethod.__init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=_TYPES[f.name])
        for f in fields(DDPGParams)
    ]
)
DDPGMethod.__init__.__annotations__ = {f.name: _TYPES[f.name] for f in fields(DDPGParams)}
DDPGMethod.__init__.__doc__ = DDPGParams.__doc__
