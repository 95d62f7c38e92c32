"""Per-FedAvg: a MAML local update (first-order, or Hessian-free with a finite-difference Hessian-vector
product) with its own per-batch procedure, over the same seeded batches ``fit`` would draw, with plain SGD
steps, as the paper states it."""

from __future__ import annotations

import time
from typing import Literal, TypeAlias

from torch import Tensor

from pfl.errors import require
from pfl.methods.base import ClientContext, Method, ServerContext, State, Upload, Weighting, upload_weight
from pfl.methods.registry import register

# The paper's two practical variants: first-order (FO) and Hessian-free (HF).
Variant: TypeAlias = Literal["fo", "hf"]


@register
class PerFedAvg(Method):
    """Per-FedAvg (Fallah et al. 2020). First-order (FO, the default): per pair of batches (B, B'),
    θ' = θ − α∇f(θ; B), θ ← θ − β∇f(θ'; B'). Hessian-free (HF): per triple (B, B', B''), with
    g' = ∇f(θ'; B') and the Hessian-vector product ∇²f(θ; B'')g' estimated by a central difference,
    d = [∇f(θ + δg'; B'') − ∇f(θ − δg'; B'')] / (2δ), θ ← θ − β(g' − αd). The P-model is the global
    model after one step of size α on one training batch. α = ``inner_lr``, β = ``outer_lr``, both
    client.lr by default as the PGFed authors' script sets them (α = β = lr); their code takes the
    personalization step with β, equal to α there. The shared model is a meta-initialization, meant to
    be used after that step: at α = 0.1 its own accuracy is near chance while the P-models train
    (docs/paper_vs_code.md).
    Server: the plain mean of the sampled clients' models, w ← Σ_{i∈A} w_i / |A| (Algorithm 1);
    ``weighting: samples`` weighs by training-set size, as the pFedMe and PGFed authors' code does.

    Args:
        inner_lr: α, the step of the personalization (and of the inner step of training); null: client.lr.
        outer_lr: β, the step that trains the shared model; null: client.lr.
        weighting: the server's mean of the clients' models: uniform (the paper) or samples (by
            training-set size, the pFedMe and PGFed authors' code).
        variant: fo (first-order, two batches per step) or hf (Hessian-free, three batches per step).
        delta: δ, the finite difference of the HF variant's Hessian-vector product.
    """

    name = "perfedavg"
    description = "MAML-style (first-order or Hessian-free) global model; P-model = global + one local SGD step"
    predating_options = {"weighting": "samples"}  # the sample-weighted mean, before the paper's plain one

    def __init__(
        self,
        inner_lr: float | None = None,
        outer_lr: float | None = None,
        weighting: Weighting = "uniform",
        variant: Variant = "fo",
        delta: float = 0.001,
    ):
        require(inner_lr is None or inner_lr >= 0, "method.inner_lr", "must be >= 0, or null for client.lr")
        require(
            outer_lr is None or outer_lr > 0, "method.outer_lr", f"must be > 0, or null for client.lr (got {outer_lr})"
        )
        require(delta > 0, "method.delta", f"must be > 0 (got {delta})")
        self.inner_lr, self.outer_lr, self.weighting = inner_lr, outer_lr, weighting
        self.variant, self.delta = variant, delta

    def _alpha(self, client: ClientContext) -> float:
        return client.lr if self.inner_lr is None else self.inner_lr

    def _beta(self, client: ClientContext) -> float:
        return client.lr if self.outer_lr is None else self.outer_lr

    def local_update(self, client: ClientContext, payload: State) -> Upload:
        flat, alpha, beta = client.flat, self._alpha(client), self._beta(client)
        flat.load(payload["global"])
        theta, grads = flat.params, flat.grads
        started, steps = time.perf_counter(), 0
        batches = list(client.batches())
        size = 3 if self.variant == "hf" else 2  # batches per step: (B, B') or (B, B', B'')
        for group in zip(*(batches[i::size] for i in range(size)), strict=False):
            start = theta.clone()
            client.gradient(group[0])
            theta.sub_(grads, alpha=alpha)
            client.gradient(group[1])
            outer = grads  # FO: ∇f(θ'; B'); HF: that minus α times the Hessian-vector product on B''
            if size == 3:
                outer = grads.clone()
                outer.sub_(self._hessian_vector(client, start, outer, group[2]), alpha=alpha)
            theta.copy_(start).sub_(outer, alpha=beta)
            steps += 1
        client.record_fit(steps, client.epochs, started)
        return Upload(flat.snapshot(), upload_weight(self.weighting, client))

    def _hessian_vector(self, client: ClientContext, at: Tensor, vector: Tensor, batch: Tensor) -> Tensor:
        """∇²f(at; batch)·vector by the central difference of two gradients δ apart along ``vector``;
        leaves the parameters at ``at + δ·vector``."""
        theta, grads = client.flat.params, client.flat.grads
        theta.copy_(at).add_(vector, alpha=-self.delta)
        client.gradient(batch)
        below = grads.clone()
        theta.copy_(at).add_(vector, alpha=self.delta)
        client.gradient(batch)
        return grads.sub(below).div_(2 * self.delta)

    def personal_state(self, server: ServerContext, client: ClientContext) -> Tensor:
        flat = client.flat
        flat.load(server["global"])
        client.gradient(next(client.batches("adapt", 1)))
        flat.params.sub_(flat.grads, alpha=self._alpha(client))
        return flat.snapshot()
