"""Checkpoint cost per round against N: the incremental chain vs one full checkpoint; and every
method's incremental checkpoint as a share of its round (``method_shares``).

Every client starts with a personal state (as if each had taken part before), so the federation's
size is N models whatever the number of rounds measured. Each round is followed by ``loop.checkpointer.save()``
(a delta, or a base when the chain is due for one); the amortised cost is the total over the
measured rounds, bases included. The full checkpoint (the whole federation in one file, what every
round cost before checkpoints were incremental) is timed once per N for comparison.
``python -m bench.checkpoint`` prints the rows as JSON lines.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import bench_config, make_loop, mnist_like, rounds_and_saves
from pfl.data import DataConfig, build_data
from pfl.federation.checkpoint import save_checkpoint
from pfl.methods import methods
from pfl.seeding import torch_generator


def prefill(loop, seed: int = 0) -> None:
    """Give every client a personal state (the init plus keyed noise)."""
    for cid in range(loop.server.num_clients):
        noise = torch.randn(loop.init_state.shape, generator=torch_generator(seed, "prefill", cid))
        loop.clients[cid] = {"personal": loop.init_state + 0.01 * noise}
    loop.clients.clear_changes()


def checkpoint_point(num_clients: int, rounds: int, method: str = "ditto", model: str = "mlp") -> dict:
    with tempfile.TemporaryDirectory(prefix="pfl-bench-ckpt-") as tmp:
        run_dir = Path(tmp) / "chain"
        run_dir.mkdir()
        loop = make_loop(bench_config(method, model, num_clients, 10), mnist_like(num_clients), run_dir=run_dir)
        prefill(loop)
        loop.run_round()
        t0 = time.perf_counter()
        loop.checkpointer.save()  # the first base: the whole federation
        base_s = time.perf_counter() - t0
        base_bytes = loop.checkpointer.chain.last_bytes
        sizes: list[int] = []
        round_s, saves = rounds_and_saves(
            loop, rounds, after_save=lambda: sizes.append(loop.checkpointer.chain.last_bytes)
        )
        loop.checkpointer.chain.wait()
        full = Path(tmp) / "full"
        full.mkdir()
        t0 = time.perf_counter()
        save_checkpoint(full, loop.checkpointer.state_dict())
        full_s = time.perf_counter() - t0
        full_bytes = (full / "checkpoint.pt").stat().st_size
    return {
        "method": method,
        "model": model,
        "num_clients": num_clients,
        "rounds": rounds,
        "round_s": statistics.median(round_s),
        "delta_s": statistics.median(saves),
        "amortised_s": sum(saves) / rounds,
        "amortised_mb": sum(sizes) / rounds / 2**20,
        "bases_in_window": sum(1 for b in sizes if b >= 0.9 * base_bytes),
        "base_s": base_s,
        "base_mb": base_bytes / 2**20,
        "full_s": full_s,
        "full_mb": full_bytes / 2**20,
        "share_of_round": (sum(saves) / rounds) / statistics.median(round_s),
    }


def cost_share(model: str, rounds: int, method: str = "fedavg", num_clients: int = 100) -> dict:
    """Checkpoint time as a share of the round time in the overhead benchmark's setup."""
    with tempfile.TemporaryDirectory(prefix="pfl-bench-ckpt-") as tmp:
        loop = make_loop(bench_config(method, model, num_clients, 10), mnist_like(num_clients), run_dir=Path(tmp))
        loop.run_round()
        loop.checkpointer.save()
        round_s, save_s = rounds_and_saves(loop, rounds)
        loop.checkpointer.chain.wait()
    r, s = statistics.median(round_s), statistics.median(save_s)
    return {"method": method, "model": model, "round_s": r, "checkpoint_s": s, "share": s / r}


# A run like conf/default.yaml's on pfl's synthetic data: 50 clients, half of them per round, 5 epochs of
# batch 32 on the default MLP, a checkpoint after every round (checkpoint_every: 1).
SHARE_CLIENTS, SHARE_PER_ROUND = 50, 25
SHARE_LIMIT = 0.05  # an incremental checkpoint costs at most this share of its round


def method_share(method: str, rounds: int = 2) -> dict:
    """``method``'s incremental checkpoint (the mean over ``rounds`` rounds after the first base) as a
    share of its round (the median round)."""
    cfg = bench_config(method, "mlp", SHARE_CLIENTS, SHARE_PER_ROUND, epochs=5, batch_size=32)
    cfg = dataclasses.replace(cfg, data=DataConfig(source="synthetic", num_clients=SHARE_CLIENTS))
    with tempfile.TemporaryDirectory(prefix="pfl-bench-ckpt-") as tmp:
        loop = make_loop(cfg, build_data(cfg.data, cfg.seed), run_dir=Path(tmp))
        loop.run_round()
        loop.checkpointer.save()  # the base: every later link is a delta
        sizes: list[int] = []
        round_s, save_s = rounds_and_saves(
            loop, rounds, after_save=lambda: sizes.append(loop.checkpointer.chain.last_bytes)
        )
        loop.checkpointer.chain.wait()
    r, s = statistics.median(round_s), sum(save_s) / rounds
    return {"method": method, "round_s": r, "checkpoint_s": s, "mb": sum(sizes) / rounds / 2**20, "share": s / r}


def method_shares(names: list[str] | None = None, rounds: int = 2) -> list[dict]:
    """``method_share`` of every registered method (or of ``names``), in name order."""
    return [method_share(m, rounds) for m in sorted(names or methods())]


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["methods"]:  # python -m bench.checkpoint methods [NAME ...]
        for row in method_shares(sys.argv[2:] or None):
            print(json.dumps(row))
        sys.exit(0)
    sizes = [int(a) for a in sys.argv[1:]] or [10, 100, 1000]
    for n in sizes:
        print(json.dumps(checkpoint_point(n, 100)))
