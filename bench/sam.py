"""Cost of the SAM-family local steps against plain SGD, per round, on the benchmark federation.

PLGU claims its strategy adds no computation beyond SAM's (two forward/backward passes per
mini-batch). This times whole rounds (10 sampled clients, 2 local epochs, batch 10, MNIST-shaped
data) of each method, rounds interleaved across methods so all see the same machine load, and
reports the median round time and its ratio to the plain-SGD baseline of the same family
(FedAvg for the scheme-I methods, FedRep for PLGU-GRep, pFedHN for PLGU-GHN). Both the wall time
and the process CPU time are measured; on a shared machine the CPU time (one intra-op thread) is
the steadier measure of the computation.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/sam.py [--model cnn|mlp|resnet18] [--rounds 5] [--json out.json]

``resnet18`` is timm's ResNet-18 with GroupNorm (PLGU's CIFAR-10 model, 11.2 M parameters) on the
same 28x28 images; ``--clients 2 --only fedavg,fedsam,plgu_lf`` keeps it to minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from bench.common import MODELS, bench_config, make_loop
from pfl.models import ModelConfig

MODEL_CHOICES = {**MODELS, "resnet18": ModelConfig(name="timm:resnet18", norm="group")}

# label -> (method, method args, baseline label)
VARIANTS: dict[str, tuple[str, dict, str]] = {
    "fedavg (SGD)": ("fedavg", {}, "fedavg (SGD)"),
    "fedsam (SAM)": ("fedsam", {}, "fedavg (SGD)"),
    "plgu_lf (ascent personal)": ("plgu_lf", {"personal_layers": 1}, "fedavg (SGD)"),
    "plgu_lf (ascent global)": ("plgu_lf", {"personal_layers": 1, "ascent": "global"}, "fedavg (SGD)"),
    "fedrep": ("fedrep", {"head_epochs": 1}, "fedrep"),
    "plgu_grep (Eq. 11 step + LWSAM)": ("plgu_grep", {"head_epochs": 1, "pre_step": True}, "fedrep"),
    "plgu_grep (LWSAM only)": ("plgu_grep", {"head_epochs": 1, "pre_step": False}, "fedrep"),
    "pfedhn": ("pfedhn", {}, "pfedhn"),
    "plgu_ghn": ("plgu_ghn", {}, "pfedhn"),
}


def round_times(
    model: str, rounds: int, clients: int = 10, labels: list[str] | None = None
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per round of the variants (one warm-up round each, then interleaved)."""
    loops = {}
    for label in labels or list(VARIANTS):
        method, args, _ = VARIANTS[label]
        cfg = bench_config(method, "cnn", 100, clients, method_args=args)
        loops[label] = make_loop(replace(cfg, model=MODEL_CHOICES[model]))
    for loop in loops.values():
        loop.run_round()
    wall: dict[str, list[float]] = {label: [] for label in loops}
    cpu: dict[str, list[float]] = {label: [] for label in loops}
    for _ in range(rounds):
        for label, loop in loops.items():
            t0, c0 = time.perf_counter(), time.process_time()
            loop.run_round()
            wall[label].append(time.perf_counter() - t0)
            cpu[label].append(time.process_time() - c0)
    return {label: (statistics.median(wall[label]), statistics.median(cpu[label])) for label in loops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=tuple(MODEL_CHOICES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=10, help="clients per round")
    parser.add_argument("--only", default=None, help="comma-separated methods (and their baselines) to time")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    labels = list(VARIANTS)
    if args.only:
        wanted = set(args.only.split(","))
        keep = {label for label, (method, _, _) in VARIANTS.items() if method in wanted}
        labels = [label for label in VARIANTS if label in keep or label in {VARIANTS[k][2] for k in keep}]
    medians = round_times(args.model, args.rounds, args.clients, labels)
    rows = []
    setting = f"{args.model}, {args.clients} clients x 2 epochs, batch 10"
    print(f"| variant ({setting}) | wall s / round | CPU s / round | CPU vs baseline |")
    print("|---|---|---|---|")
    for label in labels:
        base = VARIANTS[label][2]
        (wall, cpu), ratio = medians[label], medians[label][1] / medians[base][1]
        rows.append({"variant": label, "round_s": wall, "cpu_s": cpu, "baseline": base, "cpu_ratio": ratio})
        print(f"| {label} | {wall:.3f} | {cpu:.3f} | {ratio:.2f}x {base} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "model": args.model,
                    "clients": args.clients,
                    "rounds": args.rounds,
                    "threads": args.threads,
                    "rows": rows,
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
