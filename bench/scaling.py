"""Scaling with the number of clients N at a fixed number of sampled clients per round, and the
per-method cost. ``python -m bench.scaling METHOD N`` measures one point in a fresh process (so its
peak RSS is its own) and prints it as JSON."""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

import torch

from bench.common import bench_config, make_loop
from pfl.errors import TrainingDiverged
from pfl.federation.loop import FederatedLoop


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    """This process's RSS high-water mark (VmHWM; ru_maxrss would include the parent's before exec)."""
    with open("/proc/self/status") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    return kb / 1024


def store_bytes(loop: FederatedLoop) -> int:
    """Bytes the loop keeps per client (the client store): the method's per-client state only."""
    return sum(t.numel() * t.element_size() for s in loop.clients.values() for t in s.values())


def timed_rounds(loop: FederatedLoop, rounds: int) -> tuple[float, int]:
    """(seconds per round, local samples processed) over ``rounds`` rounds after one warm-up round."""
    loop.run_round()
    samples0, t0 = loop.progress.train_samples, time.perf_counter()
    for _ in range(rounds):
        loop.run_round()
    return (time.perf_counter() - t0) / rounds, loop.progress.train_samples - samples0


def scaling_point(method: str, num_clients: int, rounds: int, per_round: int = 10, model: str = "mlp") -> dict:
    loop = make_loop(bench_config(method, model, num_clients, per_round))
    rss0 = rss_mb()
    round_s, _ = timed_rounds(loop, rounds)
    t0 = time.perf_counter()
    loop.evaluate()
    eval_s = time.perf_counter() - t0
    stored = len(loop.clients)
    nbytes = store_bytes(loop)
    return {
        "method": method,
        "num_clients": num_clients,
        "sampled": per_round,
        "round_s": round_s,
        "rounds_per_s": 1 / round_s,
        "eval_s": eval_s,
        "stored_clients": stored,
        "store_mb": nbytes / 2**20,
        "bytes_per_stored_client": nbytes / stored if stored else 0.0,
        "model_bytes": loop.init_state.numel() * loop.init_state.element_size(),
        "rss_growth_mb": rss_mb() - rss0,
        "peak_rss_mb": peak_rss_mb(),
    }


def interleaved_round_s(method: str, sizes: list[int], rounds: int, per_round: int = 10) -> dict[int, float]:
    """Median seconds per round for each N, the N's taking rounds in turn (same machine load)."""
    loops = {n: make_loop(bench_config(method, "mlp", n, per_round)) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for loop in loops.values():
        loop.run_round()  # warm-up
    for _ in range(rounds):
        for n, loop in loops.items():
            t0 = time.perf_counter()
            loop.run_round()
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def method_costs(methods: list[str] | dict[str, tuple[str, dict]], model: str, rounds: int) -> list[dict]:
    """Samples/s of every method (a name, or label -> (name, method args)) on the same federation,
    rounds interleaved across methods so that all of them see the same machine load. A method whose
    training diverges on the benchmark's random data with its default settings is left out of the
    timing (its row says so) instead of stopping the benchmark."""
    specs = methods if isinstance(methods, dict) else {m: (m, {}) for m in methods}
    loops = {label: make_loop(bench_config(m, model, 100, 10, method_args=a)) for label, (m, a) in specs.items()}
    diverged: dict[str, str] = {}

    def step(label: str) -> float:
        t0 = time.perf_counter()
        try:
            loops[label].run_round()
        except TrainingDiverged as err:
            diverged[label] = str(err)
        return time.perf_counter() - t0

    for label in list(loops):
        step(label)  # warm-up
    seconds = dict.fromkeys(loops, 0.0)
    samples0 = {m: loop.progress.train_samples for m, loop in loops.items()}
    for _ in range(rounds):
        for label in loops:
            if label not in diverged:
                seconds[label] += step(label)
    rows = []
    for m in loops:
        if m in diverged:
            rows.append({"method": m, "model": model, "round_s": float("nan"), "samples_per_s": float("nan"),
                         "diverged": diverged[m]})  # fmt: skip
            continue
        rows.append(
            {
                "method": m,
                "model": model,
                "round_s": seconds[m] / rounds,
                "samples_per_s": (loops[m].train_samples - samples0[m]) / seconds[m],
            }
        )
    return rows


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    print(json.dumps(scaling_point(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
