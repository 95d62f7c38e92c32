"""Server-side helpers for methods that keep one model per client or per cluster as rows of a (K, S)
tensor (FedORA, FedAMP, FedU, IFCA, FeSEM): pairwise geometry of the rows without copying the store,
and independent starting points for cluster models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from pfl.methods.base import ServerContext

_F64 = torch.float64
_BLOCK = 1 << 16  # columns per float64 block


def row_gram(store: Tensor, center: Tensor | None = None, *, cols: int | None = None) -> Tensor:
    """G[i, j] = ⟨r_i − c, r_j − c⟩ over the first ``cols`` columns of ``store`` (K, S) (all by default),
    accumulated in float64 over column blocks, so a float32 store is never copied whole. Returns (K, K)
    float64 on the CPU."""
    k, n = store.shape
    n = n if cols is None else cols
    gram = torch.zeros(k, k, dtype=_F64, device=store.device)
    for s in range(0, n, _BLOCK):
        e = min(s + _BLOCK, n)
        block = store[:, s:e].to(_F64)
        if center is not None:
            block = block - center[s:e].to(_F64)
        gram += block @ block.T
    return gram.cpu()


def squared_distances(gram: Tensor) -> Tensor:
    """‖r_i − r_j‖² = G_ii + G_jj − 2G_ij from a Gram matrix, clamped at 0 against rounding; zero diagonal."""
    d = gram.diagonal()
    out = (d[:, None] + d[None, :] - 2.0 * gram).clamp_(min=0.0)
    out.fill_diagonal_(0.0)
    return out


def clipped_cosine(gram: Tensor) -> Tensor:
    """max(0, cos(r_i, r_j)) from a Gram matrix; diagonal 1; a zero row has cosine 0 with every other."""
    norms = gram.diagonal().clamp(min=0.0).sqrt()
    inv = torch.where(norms > 0, 1.0 / norms, torch.zeros_like(norms))
    cos = (gram * inv[:, None] * inv[None, :]).clamp_(0.0, 1.0)
    cos.fill_diagonal_(1.0)
    return cos


def cluster_starts(server: ServerContext, k: int, purpose: str) -> Tensor:
    """k starting models (k, S), one per cluster: row 0 is the shared initialisation ``init_state`` itself
    (so k = 1 is FedAvg's start), row j > 0 an independent initialisation of the same network, keyed by
    (seed, purpose, j): its parameters drawn by the model's own initialisers (``ServerContext.fresh_init``:
    the network built again, so every layer follows its initial distribution and a norm layer starts at
    weight 1, bias 0), its buffers those of ``init_state``. IFCA's authors draw their k models the same
    way (k independent random initialisations)."""
    rows = [server.init_state] + [server.fresh_init(server.seed, purpose, "cluster_start", j) for j in range(1, k)]
    return torch.stack(rows)
