"""Server-side helpers for methods that keep one model per client or per cluster as rows of a (K, S)
tensor (FedORA, FedAMP, FedU, IFCA, FeSEM): pairwise geometry of the rows without copying the store,
and distinct starting points for cluster models.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pfl.engine.flat import ModelLayout
from pfl.seeding import torch_generator

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


def cluster_starts(init_state: Tensor, layout: ModelLayout, k: int, seed: int, purpose: str) -> Tensor:
    """k starting models (k, S): row 0 is ``init_state`` itself (so one cluster is exactly the shared
    initialisation), row j > 0 permutes the entries of every layer of ``init_state`` at random (keyed by
    seed, purpose, j); buffers are kept. PyTorch initialises Linear, Conv, LSTM and Embedding layers with
    i.i.d. entries of one distribution per layer (weights and biases of a Linear/Conv layer share the
    bound 1/√fan_in), so a permuted layer is a draw from the same initial distribution: every cluster
    starts from a valid, different initialisation without rebuilding the network."""
    out = init_state.unsqueeze(0).repeat(k, 1)
    for j in range(1, k):
        gen = torch_generator(seed, purpose, "cluster_start", j)
        for _, sl in layout.layers:
            n = sl.stop - sl.start
            perm = torch.randperm(n, generator=gen).to(init_state.device)
            out[j, sl] = init_state[sl][perm]
    return out
