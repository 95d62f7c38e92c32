"""Memory with the disk client store: 1 000 clients, the FedAvg CNN (6.65 MB per state), Ditto.

``python -m bench.store [--clients 1000] [--budget-mb 2048] [--rounds 5]`` (a few minutes; run it on
its own, not from ``make bench``). Every client gets a personal model first (as if each had taken
part), so the store holds N states (6.65 GB at N = 1 000) of which at most the budget stays in
memory. Then it runs rounds with a checkpoint after each (the first is a base: every state streamed
out segment by segment) and one evaluation of all N P-models, and reports the process's peak RSS
(VmHWM) against the budget, the time spent hashing checkpoints (SHA-256 of every file written)
against the round time, and the time a resume takes to load and verify the chain. Evaluation
batches are 512 samples (``--eval-batch``): a 4 096-sample batch of the CNN alone needs about 1 GB
of activations. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.checkpoint import prefill
from bench.common import bench_config, make_loop, mnist_like, rounds_and_saves
from bench.scaling import peak_rss_mb, rss_mb
from pfl.federation.checkpoint import CheckpointChain


def store_point(num_clients: int, budget_mb: float, rounds: int, model: str = "cnn", eval_batch: int = 512) -> dict:
    with tempfile.TemporaryDirectory(prefix="pfl-bench-store-") as tmp:
        cfg = bench_config("ditto", model, num_clients, 10, client_store="disk", store_budget_mb=budget_mb)
        cfg.eval.batch_size = eval_batch  # CNN activations of a 4096-sample batch alone take ~1 GB
        loop = make_loop(cfg, mnist_like(num_clients), run_dir=Path(tmp))
        rss0 = rss_mb()
        t0 = time.perf_counter()
        prefill(loop)
        prefill_s = time.perf_counter() - t0
        state_mb = loop.init_state.numel() * loop.init_state.element_size() / 2**20
        hash_s: list[float] = []
        round_s, save_s = rounds_and_saves(
            loop, rounds, after_save=lambda: hash_s.append(loop.checkpointer.chain.last_hash_seconds)
        )
        t0 = time.perf_counter()
        metrics = loop.evaluate()
        eval_s = time.perf_counter() - t0
        loop.checkpointer.chain.wait()
        t0 = time.perf_counter()
        CheckpointChain(Path(tmp)).load()  # what a resume verifies: every link's and segment's SHA-256
        verify_s = time.perf_counter() - t0
        store = loop.clients
        return {
            "model": model,
            "num_clients": num_clients,
            "state_mb": state_mb,
            "stored_states_gb": len(store) * state_mb / 1024,
            "budget_mb": budget_mb,
            "resident_mb": store.resident_bytes() / 2**20,
            "spilled": len(store.spilled),
            "disk_reads": store.reads,
            "disk_writes": store.writes,
            "prefill_s": prefill_s,
            "round_s": sum(round_s[1:]) / max(len(round_s) - 1, 1),
            "first_checkpoint_s": save_s[0],
            "checkpoint_s": sum(save_s[1:]) / max(len(save_s) - 1, 1),
            "first_checkpoint_hash_s": hash_s[0],
            "checkpoint_hash_s": sum(hash_s[1:]) / max(len(hash_s) - 1, 1),
            "hash_over_round": sum(hash_s[1:]) / max(sum(round_s[1:]), 1e-12),
            "checkpoint_over_round": sum(save_s[1:]) / max(sum(round_s[1:]), 1e-12),
            "resume_verify_s": verify_s,
            "eval_s": eval_s,
            "pm_acc": metrics["pm.l_acc.mean"],
            "rss_after_build_mb": rss0,
            "peak_rss_mb": peak_rss_mb(),
            "peak_minus_budget_mb": peak_rss_mb() - budget_mb,
        }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--budget-mb", type=float, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--eval-batch", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(store_point(args.clients, args.budget_mb, args.rounds, args.model, args.eval_batch)))
