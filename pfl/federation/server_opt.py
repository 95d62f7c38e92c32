"""Server optimizers (Reddi et al. 2021, "Adaptive Federated Optimization"), applied to every
method with a global model.

After a method's ``aggregate`` has combined the uploads into a new global model, the server treats
the pseudo-gradient Δ = w_prev − w_combined as a gradient and takes one optimizer step from w_prev:

    sgd:      m ← β₁m + Δ;                                  w ← w_prev − η m   (FedAvgM; β₁ = momentum)
    adam:     m ← β₁m + (1−β₁)Δ;  v ← β₂v + (1−β₂)Δ²;       w ← w_prev − η m / (√v + τ)
    adagrad:  m ← β₁m + (1−β₁)Δ;  v ← v + Δ²;               w ← w_prev − η m / (√v + τ)
    yogi:     m ← β₁m + (1−β₁)Δ;  v ← v − (1−β₂)Δ² sign(v − Δ²); w ← w_prev − η m / (√v + τ)

(no bias correction, as in the paper). With sgd, η = 1 and no momentum the step is the identity: the
loop then skips it, so FedAvg is exactly FedAvg. Only the trainable parameters are stepped; float
buffers (BatchNorm statistics) take the combined value. The moments live in the server state
(``server_opt.m``, ``server_opt.v``), so they checkpoint and resume with it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pfl.config import ServerConfig
from pfl.engine.flat import ModelLayout


class ServerOptimizer:
    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg

    @property
    def is_identity(self) -> bool:
        c = self.cfg
        return c.optimizer == "sgd" and c.lr == 1.0 and c.momentum == 0.0

    def step(self, state: dict[str, Tensor], previous: Tensor, layout: ModelLayout) -> None:
        """Replace ``state["global"]`` (the combined model) by one optimizer step from ``previous``."""
        c = self.cfg
        new = state["global"]
        p = layout.num_params
        delta = previous[:p] - new[:p]  # the pseudo-gradient
        m = state.get("server_opt.m")
        m = torch.zeros_like(delta) if m is None else m
        # New tensors, never in place: the state may be shared with a checkpoint being written.
        if c.optimizer == "sgd":
            m = c.momentum * m + delta
            update = m
        else:
            m = c.beta1 * m + (1 - c.beta1) * delta
            v = state.get("server_opt.v")
            v = torch.zeros_like(delta) if v is None else v
            sq = delta * delta
            if c.optimizer == "adam":
                v = c.beta2 * v + (1 - c.beta2) * sq
            elif c.optimizer == "adagrad":
                v = v + sq
            else:  # yogi
                v = v - (1 - c.beta2) * sq * torch.sign(v - sq)
            state["server_opt.v"] = v
            update = m / (v.sqrt() + c.tau)
        state["server_opt.m"] = m
        out = new.clone()
        out[:p] = previous[:p] - c.lr * update
        state["global"] = out
