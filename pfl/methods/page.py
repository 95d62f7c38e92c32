"""PAGE (Chen et al., WWW 2024): personalization and generalization as a game of DDPG agents.

Each client's agent picks its local learning rate and number of epochs; the server's agent picks the
aggregation weights. Client i in round t (all clients take part, as in the authors' code):

    state     s_i = acc(g, V_i)                        g = the global model received (see "lag")
    action    a_i = agent_i(s_i) ∈ [−1, 1]²  →  (η_i, E_i)   (pfl.optim.ddpg.client_action_to_hparams)
    train     θ_i = E_i epochs of SGD at η_i from g
    reward    r_i = c · 1 / (loss(θ_i, V_i) + penalty)

Server, after the uploads:

    state     S = (acc(θ_k, V))_k                      one entry per client (the last known one for a
                                                       client that did not take part this round)
    action    A = agent_S(S) ∈ [−1, 1]^K  →  w = (A + 1)/2 / Σ (A + 1)/2   (server_action_to_weights)
    aggregate g' = Σ_k w_k θ_k / Σ_k w_k                (over this round's clients)
    reward    R = s · 1 / (loss(g', V) + penalty)

V_i is client i's validation split and V the union of them (``reward_split: validation``); with
``reward_split: test`` (the paper's and its code's choice) V_i is i's local test split and V the
server's global test set, the very sets the results are reported on. ``action_map`` chooses the map
from [−1, 1]² to (η_i, E_i): linear over the range (default) or the authors' clip.
``actions: fixed`` freezes every action at client.lr, client.epochs and the data-size weights
(FedAvg); ``actions: random`` draws uniform actions every round and runs no agent (the controls).

c = ``client_reward_weight`` and s = ``server_reward_weight`` scale each agent's reward (the authors'
code multiplies the rewards by ``c_reward_weight`` / ``s_reward_weight``); the paper's biased
variants PAGE-10:1 (generalization first) and PAGE-1:10 (personalization first) are the ratios s:c.

**Lag.** ``client_lag = 1`` (the authors' code, github.com/ivy-h7/PAGE: a client's agent reads the
accuracy of the model received one round earlier): the state a client acts on in round t
is the local-test accuracy of the global model it received in round t − 1 (round 0: the initial
model's); the accuracy of the model received in round t is measured before training and becomes the
next state, so each transition (s_t, a_t, r_t, s_{t+1}) is stored in round t. ``client_lag = 0``: the
client scores the model it just received and acts on that; the transition of round t − 1 is completed
with it at the start of round t. ``server_lag = 0`` (the paper's workflow: the server's agent acts
after the uploads, step ⑤ after ④): the server acts on this round's accuracies. ``server_lag = 1``
(the authors' code: the server's action is drawn before the clients train): it acts on last round's
accuracies (round 0: the initial model's accuracy for every client) and stores the transition with
this round's accuracies as the next state.

P-model = the model the client trained in its last round (the code's "local model"); G-model = g.
``tune`` lists the factors the agents adjust (the paper's Figure 3 ablation): a factor left out is
held at ``client.lr`` / ``client.epochs`` / data-size weights and an agent with nothing to tune is not
run. See docs/page.md for the defaults, the paper-vs-code options and the overhead metrics.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, ServerContext, State, Upload, weighted_mean
from pfl.methods.registry import register
from pfl.methods.rl_tuning import (
    VAL_FIX,
    AgentPool,
    DDPGMethod,
    agent_score,
    check_warmup,
    learn_after_warmup,
    uniform_action,
)
from pfl.optim.ddpg import DDPGAgent, DDPGConfig, server_action_to_weights
from pfl.seeding import derive_seed

TUNABLE = ("lr", "epochs", "weights")
Actions = Literal["agent", "fixed", "random"]
Lag = Literal[0, 1]  # rounds a state lags behind the model it describes


@register
class PAGE(DDPGMethod):
    """PAGE; the module docstring states the game. Defaults are PAGE's Synthetic settings."""

    name = "page"
    description = "client DDPG agents choose local lr and epochs, a server DDPG agent the aggregation weights"
    averages_uploads = True  # a weighted mean, with the server agent's weights
    has_personal_model = True

    def __init__(
        self,
        client_reward_weight: float = 1.0,
        server_reward_weight: float = 1.0,
        penalty: float = 1e-5,
        client_lag: Lag = 1,
        server_lag: Lag = 0,
        tune: list[str] | None = None,
        server_actor_lr: float = 5e-4,
        server_critic_lr: float = 5e-3,
        actions: Actions = "agent",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)  # the range, the DDPG settings and the reward split (DDPGParams)
        require(client_reward_weight > 0, "method.client_reward_weight", f"must be > 0 (got {client_reward_weight})")
        require(server_reward_weight > 0, "method.server_reward_weight", f"must be > 0 (got {server_reward_weight})")
        require(penalty > 0, "method.penalty", f"must be > 0 (got {penalty})", "it keeps 1/(loss + penalty) finite")
        tune = list(TUNABLE) if tune is None else list(tune)
        unknown = sorted(set(tune) - set(TUNABLE))
        require(not unknown, "method.tune", f"unknown factors {unknown}", f"choose from {', '.join(TUNABLE)}")
        self.client_reward_weight, self.server_reward_weight = client_reward_weight, server_reward_weight
        self.penalty, self.client_lag, self.server_lag, self.tune = penalty, client_lag, server_lag, tune
        self.server_actor_lr, self.server_critic_lr = server_actor_lr, server_critic_lr
        self.actions = actions
        self.client_config = self.ddpg.agent(1, 2, noise=True)
        self.server_config(1)  # validated before any training
        self._pool = AgentPool()
        # (lr, epochs, reward) of the clients trained since the last aggregation, then of the last
        # round: what ``metrics`` reports (a function of the round, so resumed runs report the same).
        self._trained: dict[int, tuple[float, int, float | None]] = {}
        self._last_round: dict[int, tuple[float, int, float | None]] = {}

    # -- configuration ----------------------------------------------------------------------------
    @property
    def tunes_client(self) -> bool:
        """Whether client actions (agent or random) replace client.lr / client.epochs."""
        return self.actions != "fixed" and ("lr" in self.tune or "epochs" in self.tune)

    @property
    def tunes_server(self) -> bool:
        """Whether server actions (agent or random) replace the data-size weights."""
        return self.actions != "fixed" and "weights" in self.tune

    def check_run(self, cfg: Any) -> None:
        if self.actions == "agent" and (self.tunes_client or self.tunes_server):
            check_warmup(self.warmup, cfg.trainer.rounds)

    def _client_score(self, client: ClientContext, state: Tensor) -> Any:
        return agent_score(client, state, self.reward_split, "PAGE")

    def _server_score(self, server: ServerContext, state: Tensor) -> Any:
        return server.evaluate_val(state) if self.reward_split == "validation" else server.evaluate(state)

    def server_config(self, num_clients: int) -> DDPGConfig:
        """The server agent: state and action have one entry per client; no exploration noise."""
        return self.ddpg.agent(
            num_clients,
            num_clients,
            noise=False,
            actor_lr=self.server_actor_lr,
            critic_lr=self.server_critic_lr,
            prefix="server_",
        )

    # -- hooks a test (or a variant) may replace ---------------------------------------------------
    def client_action(self, agent: DDPGAgent, state: Tensor, client: ClientContext) -> Tensor:
        """Client ``client``'s action in [−1, 1]² for ``state``."""
        return self.range.act(agent, state)

    def server_action(self, agent: DDPGAgent, state: Tensor, server: ServerContext) -> Tensor:
        """The server's action in [−1, 1]^K for ``state``."""
        return agent.act(state)

    # -- server -----------------------------------------------------------------------------------
    def init_server(self, server: ServerContext) -> State:
        state: State = {"global": server.init_state.clone()}
        if not self.tunes_server:
            return state
        state["weights"] = torch.full((server.num_clients,), 1.0 / server.num_clients)
        if self.actions == "random":
            return state
        if self.reward_split == "validation":
            require(
                server.val_evaluator is not None,
                "data.val_frac",
                "PAGE's server agent scores the models on the clients' validation splits "
                "(method.reward_split: validation), and there are none",
                VAL_FIX,
            )
        else:
            require(
                server.evaluator is not None,
                "data.global_test_frac",
                "PAGE's server agent scores every client's model on the server's global test set, and there is none",
                "set data.global_test_frac > 0 (data.official_test for on-disk sources), or drop weights from "
                "method.tune",
            )
        start = self._server_score(server, server.init_state)
        agent = self._pool.new(self.server_config(server.num_clients), derive_seed(server.seed, "page", "server"))
        state["agent"] = agent.state_dict()
        state["acc"] = torch.full((server.num_clients,), start.acc)  # round 0's lagged state
        return state

    def _aggregate(self, server: ServerContext, uploads: dict[int, Upload], weights: Tensor | None) -> None:
        """g = Σ w_k θ_k / Σ w_k over this round's clients: ``weights`` (one per client of the
        federation; equal when the round's clients all got 0) or, None, the uploads' own weights."""
        cids = sorted(uploads)
        if weights is None:
            w = [uploads[c].weight for c in cids]
        else:
            chosen = weights[cids]
            w = (chosen if float(chosen.sum()) > 0 else torch.ones_like(chosen)).tolist()
        server["global"] = weighted_mean([uploads[c].state for c in cids], w)

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        self._last_round, self._trained = self._trained, {}
        if not self.tunes_server or self.actions == "random":
            with server.timed("aggregation"):
                weights = None
                if self.tunes_server:  # random weights, drawn afresh every round
                    action = uniform_action(server.num_clients, server.seed, "page", "random", "server", server.round)
                    weights = server_action_to_weights(action.to(torch.float64))
                    server["weights"] = weights.float()
                self._aggregate(server, uploads, weights)
            return
        with server.timed("server_eval"):
            accs = server["acc"].clone()
            for cid in sorted(uploads):
                accs[cid] = self._server_score(server, uploads[cid].state).acc
        with server.timed("server_agent"):
            agent = self._pool.load(self.server_config(server.num_clients), server["agent"])
            if self.server_lag == 0:
                if "pending" in server:
                    p = server["pending"]
                    agent.remember(p["state"], p["action"], p["reward"], accs)
                    learn_after_warmup(agent)
                observed = accs
            else:
                observed = server["acc"]
            action = self.server_action(agent, observed, server)
            weights = server_action_to_weights(action.detach().to(torch.float64).cpu())
        with server.timed("aggregation"):
            self._aggregate(server, uploads, weights)
        with server.timed("server_eval"):
            reward = self.server_reward_weight / (self._server_score(server, server["global"]).loss + self.penalty)
        with server.timed("server_agent"):
            stored = action if self.replay_actions == "agent" else weights.float()
            if self.server_lag == 0:
                server["pending"] = {"state": accs.clone(), "action": stored.clone(), "reward": torch.tensor(reward)}
            else:
                agent.remember(observed, stored, reward, accs)
                learn_after_warmup(agent)
            server["agent"] = agent.state_dict()
        server["acc"] = accs
        server["weights"] = weights.float()
        server["reward"] = torch.tensor(reward)

    # -- client -----------------------------------------------------------------------------------
    def _client_agent(self, client: ClientContext) -> DDPGAgent:
        if "agent" in client.state:
            return self._pool.load(self.client_config, client.state["agent"])
        return self._pool.new(self.client_config, derive_seed(client.seed, "page", "client", client.cid))

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        g = payload["global"]
        lr, epochs = client.lr, client.epochs
        agent, action, reward = None, None, None
        if self.tunes_client and self.actions == "random":
            action = uniform_action(2, client.seed, "page", "random", client.cid, client.round)
        elif self.tunes_client:
            with self.timed("client_eval"):
                received = torch.tensor([self._client_score(client, g).acc])  # the received model's accuracy
            with self.timed("client_agent"):
                agent = self._client_agent(client)
                if self.client_lag == 0:
                    pending = client.state.get("pending")
                    if pending is not None:
                        agent.remember(pending["state"], pending["action"], pending["reward"], received)
                        learn_after_warmup(agent)
                    observed = received
                else:
                    observed = client.state.get("obs", received)
                action = self.client_action(agent, observed, client)
        if action is not None:
            tuned_lr, tuned_epochs = self.range.hparams(action)
            lr = tuned_lr if "lr" in self.tune else lr
            epochs = tuned_epochs if "epochs" in self.tune else epochs
        with self.timed("local_train"):
            trained = client.fit(g, lr=lr, epochs=epochs)
        if agent is not None:
            with self.timed("client_eval"):
                reward = self.client_reward_weight / (self._client_score(client, trained).loss + self.penalty)
            with self.timed("client_agent"):
                stored = self.range.replayed(action, lr, epochs)
                if self.client_lag == 0:
                    pending = {"state": received, "action": stored.clone(), "reward": torch.tensor(reward)}
                    client.state["pending"] = pending
                else:
                    agent.remember(observed, stored, reward, received)
                    learn_after_warmup(agent)
                    client.state["obs"] = received
                client.state["agent"] = agent.state_dict()
        client.state["personal"] = trained
        self._trained[client.cid] = (lr, epochs, reward)
        return Upload(trained, client.num_samples)

    # -- reporting --------------------------------------------------------------------------------
    def metrics(self, server: ServerContext) -> dict[str, float]:
        """Table 5's split of a round: ``time.page.*_ms`` per round (local training and the client
        agents summed over the round's clients, as a sequential simulation spends them; the same per
        client under ``*_per_client_ms``) and the agents' share of it; plus the latest round's mean
        learning rate, epochs and rewards (of the clients this process trained) and the largest
        aggregation weight. ``page.lr.std`` / ``page.epochs.std``: the spread over those clients."""
        times = self.take_times(server)
        seconds, counts = times.seconds, times.counts
        rounds = max(counts.get("aggregation", 0), 1)
        out: dict[str, float] = {}
        for phase in ("local_train", "client_agent", "client_eval", "aggregation", "server_agent", "server_eval"):
            out[f"time.page.{phase}_ms"] = 1e3 * seconds.get(phase, 0.0) / rounds
        updates = max(counts.get("local_train", 0), 1)
        out["time.page.local_train_per_client_ms"] = 1e3 * seconds.get("local_train", 0.0) / updates
        out["time.page.client_agent_per_client_ms"] = 1e3 * seconds.get("client_agent", 0.0) / updates
        fl = seconds.get("local_train", 0.0) + seconds.get("aggregation", 0.0)
        agents = seconds.get("client_agent", 0.0) + seconds.get("server_agent", 0.0)
        out["time.page.agents_over_fl"] = agents / fl if fl > 0 else 0.0
        if self._last_round:
            rows = [self._last_round[c] for c in sorted(self._last_round)]
            for i, name in ((0, "lr"), (1, "epochs")):  # how far the round's choices spread over the range
                values = torch.tensor([float(r[i]) for r in rows], dtype=torch.float64)
                out[f"page.{name}.mean"] = float(values.mean())
                out[f"page.{name}.std"] = float(values.std(correction=0))
            rewards = [r[2] for r in rows if r[2] is not None]  # no reward where no agent acted
            if rewards:
                out["page.client_reward.mean"] = sum(rewards) / len(rewards)
        if "reward" in server:
            out["page.server_reward"] = float(server["reward"])
        if "weights" in server:
            out["page.weight.max"] = float(server["weights"].max())
        return out
