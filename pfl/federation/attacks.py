"""Malicious clients (the robustness study of FedPG, "Preserving Global Performance in Personalized FL",
appendix B.3): after the local updates of a round, the uploads of the malicious clients are replaced,
before the server sees them.

- A1 (``attack.kind: gaussian``): a zero-mean Gaussian upload. In parameter space the uploaded
  model becomes z ~ N(0, σ²I); in update space it becomes r + z, i.e. the pseudo-gradient r − state
  is N(0, σ²I) — the paper's "Gaussian parameters (or gradients for gradient-based methods)".
  ``attack.space: auto`` picks update space for methods whose server works on pseudo-gradients
  (``Method.uploads_gradients``: FedPG, S-FedPG, FedMGDA+) and parameter space
  otherwise. σ = ``attack.scale`` (default 1; the paper gives no value).
- A2 (``attack.kind: scale``): the upload becomes r + s·(state − r) with s = ``attack.scale``
  (default 100): the paper's 100·(w_new − w) + w, i.e. 100·g for a gradient-based method.

r, the model the client started from in the uploaded coordinates, is the payload's ``global`` (or
``shared``, for methods that share a part of the model) when it has the upload's shape, else the
first payload tensor of that shape, else the method's ``upload_reference`` (for a method that averages
uploads: e.g. FedAvg with ``share_buffers: false`` uploads the parameters of a model it was sent with
its buffers), else 0. On a full state vector only the parameters are attacked
(BatchNorm statistics stay as trained: a Gaussian running variance would only produce NaNs).

The malicious clients are drawn once from (seed, "attack") among the training clients and stay the
same every round; the noise of A1 is keyed by (seed, round, client, "attack"), so an attacked round
does not depend on the order in which clients were trained or on the process that trained them.
Methods never learn who is malicious; the evaluation reports honest clients apart (``honest.*``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pfl.config import AttackConfig
from pfl.engine.flat import ModelLayout
from pfl.federation.transforms import UploadStep
from pfl.methods.base import Method, ServerContext, Upload
from pfl.seeding import numpy_rng, torch_generator

REFERENCE_KEYS = ("global", "shared")


def malicious_clients(seed: int, num_clients: int, fraction: float) -> np.ndarray:
    """The sorted ids of the malicious clients: round(fraction · num_clients) of them (at least one
    when fraction > 0), drawn once from the generator keyed by (seed, "attack")."""
    if fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    count = min(num_clients, max(1, int(round(fraction * num_clients))))
    return np.sort(numpy_rng(seed, "attack").choice(num_clients, count, replace=False))


def reference_of(payload: Any, state: Tensor, fallback: Tensor | None = None) -> Tensor:
    """The model the client started from, in the coordinates of its uploaded ``state`` (see module doc);
    ``fallback``: the method's upload reference, used when no payload tensor has the upload's shape."""
    if isinstance(payload, dict):
        for key in REFERENCE_KEYS:
            value = payload.get(key)
            if isinstance(value, Tensor) and value.shape == state.shape:
                return value
        for value in payload.values():
            if isinstance(value, Tensor) and value.shape == state.shape:
                return value
    if fallback is not None and fallback.shape == state.shape:
        return fallback
    return torch.zeros_like(state)


class Attack:
    """Applies ``cfg`` to the uploads of the malicious clients (``malicious``) every round: a client-side
    upload transform (``pfl.federation.transforms``), which the server receives as sent."""

    client_side = True

    def __init__(self, cfg: AttackConfig, seed: int, num_clients: int, method: Method, layout: ModelLayout):
        self.cfg, self.seed, self.layout, self.method = cfg, seed, layout, method
        self.malicious = frozenset(malicious_clients(seed, num_clients, cfg.fraction).tolist())
        space = cfg.space
        if space == "auto":
            space = "update" if method.uploads_gradients else "parameters"
        self.space = space

    @classmethod
    def build(cls, cfg: AttackConfig, seed: int, num_clients: int, method: Method, layout: ModelLayout):
        """None when there is no attack (``attack.kind: none``)."""
        return None if cfg.kind == "none" else cls(cfg, seed, num_clients, method, layout)

    def apply(
        self,
        uploads: dict[int, Upload],
        payloads: dict[int, Any],
        round_idx: int,
        server: ServerContext | None = None,
    ) -> dict[int, Upload]:
        """The uploads with every malicious client's state replaced; honest uploads are the same objects.
        ``server`` (before this round's aggregation) gives the method's upload reference."""
        fallback = self.method.upload_reference(server) if server is not None and self.method.averages_uploads else None
        out = dict(uploads)
        for cid in sorted(uploads):
            upload = uploads[cid]
            if cid in self.malicious and upload.state is not None:
                state = self.attacked(upload.state, payloads.get(cid), cid, round_idx, fallback)
                out[cid] = replace(upload, state=state)
        return out

    def transform(self, uploads: dict[int, Upload], step: UploadStep) -> dict[int, Upload]:
        return self.apply(uploads, step.payloads, step.round, step.server)

    def attacked(self, state: Tensor, payload: Any, cid: int, round_idx: int, fallback: Tensor | None = None) -> Tensor:
        ref = reference_of(payload, state, fallback)
        # Only the parameters of a full state; a partial (shared-layers) state is attacked whole.
        n = self.layout.num_params if state.numel() == self.layout.size else state.numel()
        out = state.clone()
        s = self.cfg.magnitude
        if self.cfg.kind == "scale":
            out[:n] = ref[:n] + s * (state[:n] - ref[:n])
        else:
            gen = torch_generator(self.seed, round_idx, cid, "attack", device=state.device)
            noise = torch.randn(n, generator=gen, device=state.device, dtype=torch.float32).to(state.dtype) * s
            out[:n] = noise if self.space == "parameters" else ref[:n] + noise
        return out


__all__ = ["Attack", "malicious_clients", "reference_of"]
