"""Checkpoint cost per round against N: the incremental chain vs one full checkpoint.

Every client starts with a personal state (as if each had taken part before), so the federation's
size is N models whatever the number of rounds measured. Each round is followed by ``loop.save()``
(a delta, or a base when the chain is due for one); the amortised cost is the total over the
measured rounds, bases included. The full checkpoint (the whole federation in one file, what every
round cost before checkpoints were incremental) is timed once per N for comparison.
``python -m bench.checkpoint`` prints the rows as JSON lines.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import bench_config, make_loop, mnist_like, rounds_and_saves
from pfl.federation.checkpoint import save_checkpoint
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
        loop.save()  # the first base: the whole federation
        base_s = time.perf_counter() - t0
        base_bytes = loop.chain.last_bytes
        sizes: list[int] = []
        round_s, saves = rounds_and_saves(loop, rounds, after_save=lambda: sizes.append(loop.chain.last_bytes))
        loop.chain.wait()
        full = Path(tmp) / "full"
        full.mkdir()
        t0 = time.perf_counter()
        save_checkpoint(full, loop.state_dict())
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
        loop.save()
        round_s, save_s = rounds_and_saves(loop, rounds)
        loop.chain.wait()
    r, s = statistics.median(round_s), statistics.median(save_s)
    return {"method": method, "model": model, "round_s": r, "checkpoint_s": s, "share": s / r}


if __name__ == "__main__":
    torch.set_num_threads(1)
    sizes = [int(a) for a in sys.argv[1:]] or [10, 100, 1000]
    for n in sizes:
        print(json.dumps(checkpoint_point(n, 100)))
