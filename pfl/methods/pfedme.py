"""pFedMe: a bi-level local update with its own per-batch procedure, over the same seeded batches
``fit`` would draw, with plain SGD steps (no optimizer momentum), as the paper states it."""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from torch import Tensor

from pfl.errors import require
from pfl.methods.base import (
    ClientContext,
    Method,
    ServerContext,
    State,
    Upload,
    Weighting,
    upload_weight,
    weighted_mean_of,
)
from pfl.methods.registry import register


@register
class PFedMe(Method):
    """pFedMe (T. Dinh et al. 2020). Per batch: K steps on the personal model θ of
    f_i(θ; B) + λ/2‖θ − w‖² (+ μ/2‖θ‖² with ``personal_l2``) at ``personal_lr``, then
    w ← w − η λ (w − θ) (η = client.lr).
    Server: w ← (1 − β) w + β · mean(w_i) over the sampled clients S, the plain mean Σ_{i∈S} w_i / |S|
    of Algorithm 1 (``weighting: samples``: by training-set size, as the authors' code and the PGFed
    code average). The P-model is θ.

    ``all_clients_train`` (default, the paper's Algorithm 1): every client runs the local update from
    each round's global model and the server aggregates a sample of them. Only the sampled clients'
    local models reach the server, so for an unsampled client the round's only effect is its personal
    model θ_i, which depends on nothing but that round's global model and the client's batches of the
    round. pfl therefore computes it when it is needed — when the client is evaluated after a round
    it was not sampled in, from the global model sent in that round (kept by the server) and the
    batches that round would have drawn — which is exactly the paper's θ_i, at the cost of
    (N − M) extra local updates per evaluated round instead of per round (N/M times the local
    computation of ``false`` when every round is evaluated; throughput metrics count only the
    sampled clients). ``false``: only the sampled clients update their personal models (the authors'
    code of PGFed); an unsampled client keeps the one from its last participation.

    Args:
        lam: λ, the Moreau-envelope coupling between θ and the local w.
        inner_steps: K, steps on θ per batch.
        personal_lr: step size of the steps on θ.
        beta: β, the server's mixing of the previous and the averaged global model (1: plain mean).
        all_clients_train: every client updates its personal model every round (the paper).
        personal_l2: μ of an extra μ/2‖θ‖² in the inner problem (0: the paper; the pFedMe and PGFed
            authors' code: 0.001, a default of their optimizer).
        weighting: the server's mean of the local models: uniform (the paper) or samples (by
            training-set size, the authors' code).
    """

    name = "pfedme"
    description = "Moreau-envelope personalization: K inner steps on theta, outer step on the local w"
    predating_options = {"weighting": "samples"}  # the sample-weighted mean, before the paper's plain one
    averages_uploads = True  # w ← (1 − β)w + β·(the weighted mean of the uploads, upload_weight's weights)

    def __init__(
        self,
        lam: float = 15.0,
        inner_steps: int = 5,
        personal_lr: float = 0.01,
        beta: float = 1.0,
        all_clients_train: bool = True,
        personal_l2: float = 0.0,
        weighting: Weighting = "uniform",
    ):
        require(lam >= 0, "method.lam", f"must be >= 0 (got {lam})")
        require(inner_steps >= 1, "method.inner_steps", f"must be >= 1 (got {inner_steps})")
        require(personal_lr > 0, "method.personal_lr", f"must be > 0 (got {personal_lr})")
        require(beta > 0, "method.beta", f"must be > 0 (got {beta})")
        self.lam, self.inner_steps, self.personal_lr, self.beta = lam, inner_steps, personal_lr, beta
        require(personal_l2 >= 0, "method.personal_l2", f"must be >= 0 (got {personal_l2})")
        self.all_clients_train, self.personal_l2, self.weighting = all_clients_train, personal_l2, weighting

    def personalize(self, client: ClientContext, global_state: Tensor) -> tuple[Tensor, Tensor]:
        """One local update from ``global_state``: (personal model θ, local model w), full states."""
        flat = client.flat
        flat.load(global_state)
        theta, grads = flat.params, flat.grads
        w = theta.clone()
        started, steps = time.perf_counter(), 0
        for b in client.batches():
            for _ in range(self.inner_steps):
                client.gradient(b)
                with torch.no_grad():
                    step = grads + self.lam * (theta - w)
                    if self.personal_l2:
                        step += self.personal_l2 * theta
                    theta.sub_(step, alpha=self.personal_lr)
            w.sub_(w - theta, alpha=client.lr * self.lam)
            steps += 1
        client.record_fit(steps, client.epochs, started)
        personal = flat.snapshot()
        local = flat.snapshot()
        client.params(local).copy_(w)
        return personal, local

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        personal, local = self.personalize(client, payload["global"])
        client.state["personal"] = personal
        client.state["round"] = torch.tensor(client.round)
        return Upload(local, upload_weight(self.weighting, client))

    def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
        if self.all_clients_train:
            server["sent"] = server["global"].clone()  # what every client trained from this round
        server["global"] = (1 - self.beta) * server["global"] + self.beta * weighted_mean_of(uploads)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        last = client.round - 1  # the round just run
        trained = client.state.get("round")
        if self.all_clients_train and "sent" in server and (trained is None or int(trained) != last):
            # Computed, not stored: evaluation changes no client's state (incremental checkpoints
            # and the disk store rely on that), and the result depends only on the server's state.
            past = replace(client, round=last, fits=[])  # that round's batches, outside its accounting
            return self.personalize(past, server["sent"])[0]
        return client.state.get("personal", client.init_state)
