"""Bi-level local updates with their own per-batch procedure: pFedMe and Per-FedAvg.

Both run their own loop over the same seeded batches ``Worker.fit`` would draw
(``Worker.batches``), with plain SGD steps (no optimizer momentum), as their papers state them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from pfl.client import FitStats
from pfl.errors import require
from pfl.methods.base import ClientContext, Method, State, weighted_mean


def _record(client: ClientContext, steps: int, epochs: int, seconds: float) -> None:
    n = client.num_samples
    client.fits.append(FitStats(n, n * epochs, steps, float("nan"), seconds))


class PFedMe(Method):
    """pFedMe (T. Dinh et al. 2020). Per batch: K steps on the personal model θ of
    f_i(θ; B) + λ/2‖θ − w‖² at ``personal_lr``, then w ← w − η λ (w − θ) (η = client.lr).
    Server: w ← (1 − β) w + β · mean(w_i). The P-model is θ."""

    name = "pfedme"
    description = "Moreau-envelope personalization: K inner steps on theta, outer step on the local w"

    def __init__(self, lam: float = 15.0, inner_steps: int = 5, personal_lr: float = 0.01, beta: float = 1.0):
        require(lam >= 0, "method.lam", f"must be >= 0 (got {lam})")
        require(inner_steps >= 1, "method.inner_steps", f"must be >= 1 (got {inner_steps})")
        require(personal_lr > 0, "method.personal_lr", f"must be > 0 (got {personal_lr})")
        require(beta > 0, "method.beta", f"must be > 0 (got {beta})")
        self.lam, self.inner_steps, self.personal_lr, self.beta = lam, inner_steps, personal_lr, beta

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        worker, flat = client.worker, client.flat
        epochs, lr = worker.settings.epochs, worker.settings.lr
        flat.load(payload["global"])
        theta, grads = flat.params, flat.grads
        w = theta.clone()
        t0, steps = time.perf_counter(), 0
        for b in worker.batches(client.cid, client.round, "train", epochs):
            for _ in range(self.inner_steps):
                worker.gradient(b)
                with torch.no_grad():
                    theta.sub_(grads + self.lam * (theta - w), alpha=self.personal_lr)
            w.sub_(w - theta, alpha=lr * self.lam)
            steps += 1
        _record(client, steps, epochs, time.perf_counter() - t0)
        client.state["personal"] = flat.snapshot()
        state = flat.snapshot()
        state[: flat.num_params] = w
        return {"state": state, "weight": client.num_samples}

    def aggregate(self, server: State, results: dict[int, dict[str, Any]]) -> None:
        ordered = [results[cid] for cid in sorted(results)]
        mean = weighted_mean([r["state"] for r in ordered], [r["weight"] for r in ordered])
        server["global"] = (1 - self.beta) * server["global"] + self.beta * mean

    def personal_state(self, server: State, client: ClientContext) -> Tensor:
        return client.state.get("personal", client.init_state)


class PerFedAvg(Method):
    """Per-FedAvg (Fallah et al. 2020), first-order: per pair of batches (B, B'),
    θ' = θ − α∇f(θ; B), θ ← θ − β∇f(θ'; B'). The P-model is the global model after one step of
    size α on one training batch. α = ``inner_lr`` (default client.lr), β = ``outer_lr``."""

    name = "perfedavg"
    description = "MAML-style (first-order) global model; P-model = global + one local SGD step"

    def __init__(self, inner_lr: float | None = None, outer_lr: float = 0.005):
        require(inner_lr is None or inner_lr >= 0, "method.inner_lr", "must be >= 0, or null for client.lr")
        require(outer_lr > 0, "method.outer_lr", f"must be > 0 (got {outer_lr})")
        self.inner_lr, self.outer_lr = inner_lr, outer_lr

    def _alpha(self, client: ClientContext) -> float:
        return client.worker.settings.lr if self.inner_lr is None else self.inner_lr

    def local_update(self, client: ClientContext, payload: State) -> dict[str, Any]:
        worker, flat = client.worker, client.flat
        epochs, alpha = worker.settings.epochs, self._alpha(client)
        flat.load(payload["global"])
        theta, grads = flat.params, flat.grads
        t0, steps = time.perf_counter(), 0
        batches = list(worker.batches(client.cid, client.round, "train", epochs))
        for first, second in zip(batches[0::2], batches[1::2], strict=False):
            start = theta.clone()
            worker.gradient(first)
            theta.sub_(grads, alpha=alpha)
            worker.gradient(second)
            theta.copy_(start).sub_(grads, alpha=self.outer_lr)
            steps += 1
        _record(client, steps, epochs, time.perf_counter() - t0)
        return {"state": flat.snapshot(), "weight": client.num_samples}

    def personal_state(self, server: State, client: ClientContext) -> Tensor:
        worker, flat = client.worker, client.flat
        flat.load(server["global"])
        b = next(worker.batches(client.cid, client.round, "adapt", 1))
        worker.gradient(b)
        flat.params.sub_(flat.grads, alpha=self._alpha(client))
        return flat.snapshot()
