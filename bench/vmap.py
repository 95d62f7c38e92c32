"""Vectorized clients (``trainer.vectorize``, ``pfl.engine.vectorized``) against the sequential worker:
the same FedAvg rounds, run in lockstep by two loops with the same seed, timed round by round, and
the distance between their global models at the end."""

from __future__ import annotations

import statistics
import time

import torch

from bench.common import bench_config, make_loop, mnist_like
from pfl.engine.stacked import FitRequest, StackedTrainer
from pfl.engine.trainer import FitSpec
from pfl.federation.loop import FederatedLoop, sample_clients
from pfl.methods import weighted_mean


def vmap_fedavg_round(loop: FederatedLoop, round_idx: int) -> torch.Tensor:
    """The parameter part of the global model after FedAvg round ``round_idx`` from the loop's
    current server state, every sampled client trained at once by the engine's StackedTrainer."""
    worker = loop.worker
    data = worker.data
    sampled = sample_clients(loop.schedule.seed, round_idx, data.num_clients, loop.server.clients_per_round).tolist()
    start = loop.server["global"]
    requests = [FitRequest.of(worker, cid, start, round_idx, FitSpec()) for cid in sampled]
    StackedTrainer(worker).train(requests)
    p = loop.flat.num_params
    return weighted_mean([r.out[:p] for r in requests], [r.stats.num_samples for r in requests])


def compare(model: str, rounds: int, num_clients: int = 100, per_round: int = 10) -> dict[str, float]:
    """Seconds per round (medians, after a warm-up round) of the sequential and the vectorized loop."""
    data = mnist_like(num_clients)
    seq = make_loop(bench_config("fedavg", model, num_clients, per_round), data)
    vec = make_loop(bench_config("fedavg", model, num_clients, per_round, vectorize=True), data)
    seq.run_round(), vec.run_round()
    seq_s, vec_s = [], []
    for r in range(rounds):
        for loop, times in ((seq, seq_s), (vec, vec_s)) if r % 2 == 0 else ((vec, vec_s), (seq, seq_s)):
            t0 = time.perf_counter()
            loop.run_round()
            times.append(time.perf_counter() - t0)
    diff = float((seq.server["global"] - vec.server["global"]).abs().max())
    return {
        "sequential_round_s": statistics.median(seq_s),
        "vmap_round_s": statistics.median(vec_s),
        "speedup": statistics.median(seq_s) / statistics.median(vec_s),
        "max_abs_diff": diff,
    }
