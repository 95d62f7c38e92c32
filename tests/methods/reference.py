"""Plain-PyTorch references for method tests: the initial network of a run and the batches a fit
draws, rebuilt without the engine, so a method's numbers can be checked against a hand-written loop."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pfl.config import RunConfig
from pfl.federation.loop import FederatedLoop
from pfl.models import build_model
from pfl.seeding import seed_everything, torch_generator


def initial_net(cfg: RunConfig, loop: FederatedLoop) -> nn.Module:
    """The network the run started from (same seed, same builder)."""
    seed_everything(cfg.seed, "init")
    return build_model(cfg.model, loop.worker.data.input_shape, loop.worker.data.num_classes)


def flat_params(net: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def drawn_batches(seed: int, round_idx: int, cid: int, purpose: str, idx: Tensor, bs: int, epochs: int = 1):
    """The index batches of one fit: a keyed permutation per epoch, cut into batches of ``bs``."""
    gen = torch_generator(seed, round_idx, cid, purpose, "batches")
    out = []
    for _ in range(epochs):
        order = idx[torch.randperm(len(idx), generator=gen)]
        out += [order[s : s + bs] for s in range(0, len(idx), bs)]
    return out
