"""``trainer.compile`` on this machine: FedAvg rounds with and without torch.compile (sequential and
vectorized), the compile time paid by the first rounds reported on its own.

``python -m bench.compile [--rounds 6]`` (minutes on CPU: inductor compiles C++ kernels; not part of
``make bench``). Prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench.common import bench_config, make_loop, mnist_like


def compile_point(model: str, rounds: int, vectorize: bool) -> dict:
    data = mnist_like(100)
    out: dict = {"model": model, "vectorize": vectorize}
    for compiled in (False, True):
        loop = make_loop(bench_config("fedavg", model, 100, 10, vectorize=vectorize, compile=compiled), data)
        t0 = time.perf_counter()
        loop.run_round()
        loop.run_round()  # the short last batch and the second shape are compiled here too
        warm = time.perf_counter() - t0
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            loop.run_round()
            times.append(time.perf_counter() - t0)
        key = "compiled" if compiled else "eager"
        out[f"{key}_first_two_rounds_s"] = warm
        out[f"{key}_round_s"] = statistics.median(times)
        out[f"{key}_global"] = loop.server["global"]
    out["speedup"] = out["eager_round_s"] / out["compiled_round_s"]
    out["max_abs_diff"] = float((out.pop("eager_global") - out.pop("compiled_global")).abs().max())
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for model in ("mlp", "cnn"):
        for vectorize in (False, True):
            print(json.dumps(compile_point(model, args.rounds, vectorize)), flush=True)
