"""Overhead ratio: FedAvg rounds through FederatedLoop vs a plain PyTorch loop doing the identical
optimizer steps on the identical batches (same init, sampled clients and keyed batch orders)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from pfl.config import RunConfig
from pfl.data import FederatedData
from pfl.federation.loop import FederatedLoop, sample_clients
from pfl.models import build_model
from pfl.runner.plan import clients_per_round
from pfl.seeding import seed_everything, torch_generator


class PlainFedAvg:
    """FedAvg written the way one would in plain PyTorch: one nn.Module, one SGD optimizer,
    per-parameter copies in and out, a running weighted sum for the average."""

    def __init__(self, cfg: RunConfig, data: FederatedData):
        self.cfg, self.data = cfg, data
        seed_everything(cfg.seed, "init")
        self.net = build_model(cfg.model, data.input_shape, data.num_classes)
        self.params = list(self.net.parameters())
        self.opt = torch.optim.SGD(self.params, lr=cfg.client.lr)
        self.global_params = [p.detach().clone() for p in self.params]
        self.round = 0

    def run_round(self) -> None:
        cfg, data = self.cfg, self.data
        sampled = sample_clients(cfg.seed, self.round, data.num_clients, clients_per_round(cfg, data.num_clients))
        sums = [torch.zeros_like(p) for p in self.params]
        total = sum(len(data.clients[c].train) for c in sampled.tolist())
        bs = cfg.client.batch_size
        for cid in sampled.tolist():
            with torch.no_grad():
                for p, g in zip(self.params, self.global_params, strict=True):
                    p.copy_(g)
            idx = data.clients[cid].train
            gen = torch_generator(cfg.seed, self.round, cid, "train", "batches")
            for _ in range(cfg.client.epochs):
                order = idx[torch.randperm(len(idx), generator=gen)]
                for s in range(0, len(idx), bs):
                    b = order[s : s + bs]
                    self.opt.zero_grad()
                    F.cross_entropy(self.net(data.x[b]), data.y[b]).backward()
                    self.opt.step()
            w = len(idx) / total
            with torch.no_grad():
                for acc, p in zip(sums, self.params, strict=True):
                    acc.add_(p, alpha=w)
        self.global_params = sums
        self.round += 1

    def flat(self) -> torch.Tensor:
        return torch.cat([p.reshape(-1) for p in self.global_params])


def timed(step) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def overhead(loop: FederatedLoop, plain: PlainFedAvg, rounds: int) -> dict[str, float]:
    """Per-round seconds of both, run in lockstep (round r of one, then round r of the other, the
    order alternating) so that both see the same machine load; the ratio is the median of the
    per-round ratios. Checks that both computed the same global model."""
    loop.run_round(), plain.run_round()  # warm-up
    pfl_s, plain_s = [], []
    for r in range(rounds):
        if r % 2:
            plain_s.append(timed(plain.run_round))
            pfl_s.append(timed(loop.run_round))
        else:
            pfl_s.append(timed(loop.run_round))
            plain_s.append(timed(plain.run_round))
    n = loop.flat.num_params
    torch.testing.assert_close(loop.server["global"][:n], plain.flat(), rtol=1e-4, atol=1e-5)
    t0 = time.perf_counter()
    loop.evaluate()
    eval_s = time.perf_counter() - t0
    return {
        "pfl_round_s": statistics.median(pfl_s),
        "plain_round_s": statistics.median(plain_s),
        "ratio": statistics.median(a / b for a, b in zip(pfl_s, plain_s, strict=True)),
        "eval_s": eval_s,
        "params": n,
    }
