"""Dap-FL (Chen et al., IEEE TPDS 2023): each client's DDPG agent tunes its local learning rate and
number of local epochs, i.e. how much its local update contributes to the aggregate.

As PAGE's authors run it as a baseline (their ``Dap`` code), client i in round t:

    state     s_i^t = (acc(g_{t−1}, local test), loss(θ_i^{t−1}, local test) + penalty)
    action    a_i^t = agent_i(s_i^t) ∈ [−1, 1]²  →  (η_i, E_i)    (the same mapping as PAGE's clients)
    train     θ_i^t = E_i epochs of SGD at η_i from g_t
    next      s_i^{t+1} = (acc(g_t, local test), loss(θ_i^t, local test) + penalty)
    reward    r_i^t = q_i^t − q_i^{t−1},   q_i^t = acc(g_t, local test) − loss(θ_i^t, local test) − penalty
              (q^{−1} = 0: the code's ``last_reward`` starts at 0)

Round 0's state uses the received model's own local-test loss where the code puts a constant 3.0.
"local test" is the client's validation split by default (``reward_split: validation``, as PAGE's
agents); ``reward_split: test`` scores the agents on the local test split reported, as the code does.
Actions map to (η_i, E_i) as PAGE's do (``action_map``: linear by default, the code's clip as an
option) and explore with the same OU noise (``ou_dt`` 1; the code's 0.01 as an option), so that
with PAGE's ranges both methods spend the same local compute in expectation.
The server averages the uploads with data-size weights (``weighting: samples``) or uniformly
(``weighting: uniform``, PAGE's Dap-FL code); there is no server agent. Defaults are that code's:
actor/critic lr 1e-4/1e-3, τ 0.001, exploration noise never decays (ε = 1).

Out of scope: Dap-FL's Paillier-based secure aggregation. It changes how the weighted sum is
computed (under encryption), not its value, so the trained models are the same without it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, State, Upload, Weighting, upload_weight
from pfl.methods.registry import register
from pfl.methods.rl_tuning import VAL_FIX, AgentPool, DDPGMethod, agent_score, check_warmup, learn_after_warmup
from pfl.optim.ddpg import DDPGAgent
from pfl.seeding import derive_seed


@register
class DapFL(DDPGMethod):
    """Dap-FL without its secure aggregation; the module docstring states the agents' MDP.

    The rest of the options (the action range, the DDPG settings, ``reward_split``) are PAGE's
    (``DDPGParams``); the four below are the ones the Dap-FL code sets otherwise.

    Args:
        penalty: added to the loss in the agents' states and rewards (keeps 1/(loss + penalty) finite).
        weighting: the server's average over the clients' models: samples (by train size) or uniform.
        actor_lr: Adam learning rate of the actor (the Dap-FL code's 1e-4).
        critic_lr: Adam learning rate of the critic (the Dap-FL code's 1e-3).
        tau: soft target-network update rate (the Dap-FL code's 0.001).
        eps_decay_steps: exploration noise scale 1 − k/eps_decay_steps (0, the Dap-FL code: no decay).
    """

    name = "dapfl"
    description = "per-client DDPG agents tune local lr and epochs (Dap-FL, without secure aggregation)"
    has_personal_model = False

    def __init__(
        self,
        penalty: float = 1e-5,
        weighting: Weighting = "samples",
        actor_lr: float = 1e-4,
        critic_lr: float = 1e-3,
        tau: float = 0.001,
        eps_decay_steps: int = 0,
        **kwargs: Any,
    ):
        # PAGE's range, DDPG settings and reward split (DDPGParams) but for the four the Dap-FL code sets otherwise
        super().__init__(actor_lr=actor_lr, critic_lr=critic_lr, tau=tau, eps_decay_steps=eps_decay_steps, **kwargs)
        require(penalty > 0, "method.penalty", f"must be > 0 (got {penalty})")
        self.penalty, self.weighting = penalty, weighting
        self.config = self.ddpg.agent(2, 2, noise=True)
        self._pool = AgentPool()

    def check_run(self, cfg: Any) -> None:
        check_warmup(self.warmup, cfg.trainer.rounds)
        require(
            self.reward_split == "test" or cfg.data.val_frac > 0,
            "data.val_frac",
            "Dap-FL's agents score on validation splits (method.reward_split: validation), and there are none",
            VAL_FIX,
        )

    def client_action(self, agent: DDPGAgent, state: Tensor, client: ClientContext) -> Tensor:
        """Client ``client``'s action in [−1, 1]² for ``state`` (a test may fix it)."""
        return self.range.act(agent, state)

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        g = payload["global"]
        received = agent_score(client, g, self.reward_split, "Dap-FL")
        if "agent" in client.state:
            agent = self._pool.load(self.config, client.state["agent"])
        else:
            agent = self._pool.new(self.config, derive_seed(client.seed, "dapfl", client.cid))
        observed = client.state.get("obs", torch.tensor([received.acc, received.loss + self.penalty]))
        action = self.client_action(agent, observed, client)
        lr, epochs = self.range.hparams(action)
        trained = client.fit(g, lr=lr, epochs=epochs)
        loss = agent_score(client, trained, self.reward_split, "Dap-FL").loss + self.penalty
        following = torch.tensor([received.acc, loss])
        score = received.acc - loss
        reward = score - float(client.state.get("score", torch.tensor(0.0)))
        agent.remember(observed, self.range.replayed(action, lr, epochs), reward, following)
        learn_after_warmup(agent)
        client.state.update(agent=agent.state_dict(), obs=following, score=torch.tensor(score))
        # The server's default aggregation: Σ weight·θ / Σ weight.
        return Upload(trained, upload_weight(self.weighting, client))
