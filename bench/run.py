"""``make bench``: overhead vs plain PyTorch, scaling with N, per-method cost, vectorized clients,
lockstep's handoff, checkpoint cost against N, a ResNet-18 round, the quickstart notebook's run time.

Writes bench/results.json and prints the tables that docs/performance.md quotes. Every timing is
the best of a few interleaved blocks after a warm-up round, on ``--threads`` intra-op threads
(default 1: on a shared 2-core machine one thread gives repeatable numbers, and both sides of every
ratio run under the same setting).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.checkpoint import SHARE_CLIENTS, SHARE_LIMIT, SHARE_PER_ROUND, checkpoint_point, cost_share, method_shares
from bench.common import bench_config, cifar_like, make_loop, mnist_like
from bench.handoff import CALLS, CLIENTS, bench_worker, handoff_costs
from bench.notebook import quickstart_seconds
from bench.overhead import PlainFedAvg, overhead
from bench.scaling import interleaved_round_s, method_costs
from bench.vmap import compare
from pfl.engine.trainer import FitSpec
from pfl.methods import methods

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = {"mlp": 10, "cnn": 2}  # rounds per measurement unit


def run_overhead() -> list[dict]:
    rows = []
    for model in ("cnn", "mlp"):
        cfg = bench_config("fedavg", model, 100, 10)
        loop = make_loop(cfg, mnist_like(100))
        plain = PlainFedAvg(cfg, loop.worker.data)
        rows.append({"model": model, **overhead(loop, plain, 4 * ROUNDS[model])})
    return rows


def run_scaling(threads: int) -> list[dict]:
    rows = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sizes = [10, 100, 1000]
    for method in ("fedavg", "ditto"):
        # Memory (and eval time) per N in a fresh process each; rounds/s with the N's interleaved.
        for n in sizes:
            cmd = [sys.executable, "-m", "bench.scaling", method, str(n), "10", str(threads)]
            out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        for n, round_s in interleaved_round_s(method, sizes, 20).items():
            row = next(r for r in rows if r["method"] == method and r["num_clients"] == n)
            row["round_s"], row["rounds_per_s"] = round_s, 1 / round_s
    return rows


METHOD_GROUP = 8  # loops alive at once: every personal-model method keeps the states of the clients it visited


def run_methods() -> list[dict]:
    """Every method's cost relative to FedAvg, measured in groups of METHOD_GROUP methods, each with FedAvg
    (rounds interleaved within a group, so each ratio is taken under one machine load); all methods
    at once would hold ~40 federations in memory (14 GB with the CNN)."""
    rows = []
    others = sorted(m for m in methods() if m != "fedavg")
    for model in ("mlp", "cnn"):
        for k in range(0, len(others), METHOD_GROUP - 1):
            costs = method_costs(["fedavg", *others[k : k + METHOD_GROUP - 1]], model, 2 * ROUNDS[model])
            base = next(r["samples_per_s"] for r in costs if r["method"] == "fedavg")
            rows += [
                {**r, "relative_to_fedavg": r["samples_per_s"] / base}
                for r in costs
                if r["method"] != "fedavg" or k == 0
            ]
    return sorted(rows, key=lambda r: (r["model"] != "mlp", r["method"]))


def run_objectives() -> list[dict]:
    """Ditto's personal objective as a closed-form term vs as a Lightning training_step (autograd)."""
    paths = {"term": ("ditto", {"prox": "gradient"}), "training_step": ("ditto", {"prox": "autograd"})}
    rows = []
    for model in ("mlp", "cnn"):
        costs = {r["method"]: r for r in method_costs(paths, model, 2 * ROUNDS[model])}
        term = costs["term"]["round_s"]
        rows += [{"model": model, "path": p, **costs[p], "relative_to_term": costs[p]["round_s"] / term} for p in paths]
    return rows


def run_vmap() -> list[dict]:
    return [{"model": model, **compare(model, ROUNDS[model] * 2)} for model in ("mlp", "cnn")]


def run_handoff() -> list[dict]:
    return handoff_costs(bench_worker(), CLIENTS, CALLS)


def run_checkpoint() -> dict:
    """Ditto MLP with every client holding a personal model: checkpoint per round against N; the
    checkpoint's share of a round in the overhead setup (FedAvg, 100 clients); and every method's
    incremental checkpoint as a share of its round (``bench.checkpoint.method_shares``)."""
    return {
        "by_n": [checkpoint_point(n, 40) for n in (10, 100, 1000)],
        "share": [cost_share(model, 3 * ROUNDS[model]) for model in ("mlp", "cnn")],
        "methods": method_shares(),
    }


def run_resnet() -> dict:
    """One FedAvg round of 10 clients on ResNet-18 (GroupNorm, CIFAR stem), 3x32x32 random data,
    20 training samples per client (2 steps of batch 10), after a one-client warm-up."""
    cfg = bench_config("fedavg", "resnet18", 10, 10, epochs=1, batch_size=10)
    loop = make_loop(cfg, cifar_like(10, per_client=25))
    loop.worker.train(0, loop.init_state, 0, FitSpec(purpose="warmup"))
    samples = loop.progress.train_samples
    t0 = time.perf_counter()
    loop.run_round()
    seconds = time.perf_counter() - t0
    return {
        "params": loop.flat.num_params,
        "round_s": seconds,
        "samples_per_s": (loop.progress.train_samples - samples) / seconds,
    }


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in columns) + " |"
    sep = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(format(r[k], f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def report(results: dict) -> str:
    parts = [
        f"threads={results['threads']}  torch {results['torch']}  {results['cpu']}",
        "\nOverhead: FedAvg, 100 clients, 10 sampled, 2 local epochs, batch 10 (s per round)",
        table(
            results["overhead"],
            [
                ("model", "model", "s"),
                ("params", "params", "d"),
                ("plain_round_s", "plain PyTorch", ".4f"),
                ("pfl_round_s", "pfl", ".4f"),
                ("ratio", "ratio", ".3f"),
                ("eval_s", "pfl eval (all clients)", ".4f"),
            ],
        ),
        "\nScaling: MLP, 10 sampled per round; client store = what the loop keeps per client",
        table(
            results["scaling"],
            [
                ("method", "method", "s"),
                ("num_clients", "N", "d"),
                ("rounds_per_s", "rounds/s", ".1f"),
                ("eval_s", "eval s", ".3f"),
                ("stored_clients", "stored clients", "d"),
                ("store_mb", "store MB", ".2f"),
                ("bytes_per_stored_client", "B/stored client", ".0f"),
                ("model_bytes", "B/model", "d"),
                ("rss_growth_mb", "RSS growth MB", ".1f"),
                ("peak_rss_mb", "peak RSS MB", ".0f"),
            ],
        ),
        "\nPer-method cost: 100 clients, 10 sampled (local samples processed per second)",
        table(
            results["methods"],
            [
                ("model", "model", "s"),
                ("method", "method", "s"),
                ("round_s", "s/round", ".4f"),
                ("samples_per_s", "samples/s", ".0f"),
                ("relative_to_fedavg", "vs FedAvg", ".2f"),
            ],
        ),
        *(f"{r['model']} {r['method']}: not timed, {r['diverged']}" for r in results["methods"] if "diverged" in r),
        "\nLocal objective paths: Ditto's proximal term (closed form) vs the same objective as a training_step",
        table(
            results["objectives"],
            [
                ("model", "model", "s"),
                ("path", "path", "s"),
                ("round_s", "s/round", ".4f"),
                ("relative_to_term", "vs term", ".2f"),
            ],
        ),
        "\nVectorized clients (trainer.vectorize) vs sequential worker, FedAvg, 100 clients, 10 sampled",
        table(
            results["vmap"],
            [
                ("model", "model", "s"),
                ("sequential_round_s", "sequential s", ".4f"),
                ("vmap_round_s", "vectorized s", ".4f"),
                ("speedup", "speed-up", ".2f"),
                ("max_abs_diff", "max |diff|", ".1e"),
            ],
        ),
        "\nLockstep handoff: a stacked client.gradient call with its pass removed (bench.handoff), us per call",
        table(
            results["handoff"],
            [
                ("clients", "clients", "d"),
                ("lockstep_us", "lockstep us", ".1f"),
                ("at_once_us", "served at once us", ".1f"),
                ("handoff_us", "handoff us", ".1f"),
            ],
        ),
        "\nCheckpoint per round against N: Ditto MLP, every client with a personal model, 10 sampled",
        table(
            results["checkpoint"]["by_n"],
            [
                ("num_clients", "N", "d"),
                ("round_s", "round s", ".3f"),
                ("delta_s", "delta s", ".3f"),
                ("amortised_s", "amortised s", ".3f"),
                ("amortised_mb", "amortised MB", ".1f"),
                ("base_s", "base s", ".2f"),
                ("base_mb", "base MB", ".0f"),
                ("full_s", "full checkpoint s", ".2f"),
            ],
        ),
        "\nCheckpoint share of a round (FedAvg, 100 clients, 10 sampled)",
        table(
            results["checkpoint"]["share"],
            [
                ("model", "model", "s"),
                ("round_s", "round s", ".4f"),
                ("checkpoint_s", "checkpoint s", ".4f"),
                ("share", "share", ".3f"),
            ],
        ),
        f"\nCheckpoint share per method (synthetic data, {SHARE_CLIENTS} clients, {SHARE_PER_ROUND} per round, "
        f"5 epochs, MLP, a checkpoint every round; limit {SHARE_LIMIT:.0%})",
        table(
            results["checkpoint"]["methods"],
            [
                ("method", "method", "s"),
                ("round_s", "round s", ".3f"),
                ("checkpoint_s", "checkpoint s", ".4f"),
                ("mb", "MB", ".2f"),
                ("share", "share", ".3f"),
            ],
        ),
        *(
            f"{r['method']}: checkpoint share {r['share']:.1%} is over {SHARE_LIMIT:.0%}"
            for r in results["checkpoint"]["methods"]
            if r["share"] > SHARE_LIMIT
        ),
        "\nResNet-18 (GroupNorm), 3x32x32, FedAvg round of 10 clients x 20 samples",
        table(
            [results["resnet"]],
            [("params", "params", "d"), ("round_s", "s/round", ".2f"), ("samples_per_s", "samples/s", ".1f")],
        ),
        f"\nQuickstart notebook (docs/quickstart.ipynb, executed in a Jupyter kernel): {results['quickstart_s']:.1f} s",
        f"\ntotal {results['seconds']:.0f} s",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    results = {
        "threads": args.threads,
        "torch": torch.__version__,
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "overhead": run_overhead(),
        "scaling": run_scaling(args.threads),
        "methods": run_methods(),
        "objectives": run_objectives(),
        "vmap": run_vmap(),
        "handoff": run_handoff(),
        "checkpoint": run_checkpoint(),
        "resnet": run_resnet(),
        "quickstart_s": quickstart_seconds(),
    }
    results["seconds"] = time.perf_counter() - t0
    args.out.write_text(json.dumps(results, indent=2))
    print(report(results))
    return results


if __name__ == "__main__":
    main()
