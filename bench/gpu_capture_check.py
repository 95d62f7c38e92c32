"""``python -m bench.gpu_capture_check``: does ``trainer.cuda_graphs`` train as the uncaptured vectorized
path does? Two rounds of a ``bench.gpu`` workload with each, from the same seed, and the largest
difference between their server states (float summation order only: the captured step pads every step
to the batch size). On a device without CUDA both run uncaptured and the difference is 0.

    python -m bench.gpu_capture_check [--only W,..] [--rounds N] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from bench.gpu import device_name, pick_device
from bench.gpu_paths import build, capture_note
from bench.gpu_workloads import build_data, workloads


def compare(name: str, rounds: int, device: torch.device) -> str:
    w = {x.name: x for x in workloads(device.type == "cpu")}[name]
    data = build_data(w).to(device)
    loops = {g: build(w, data, device, vectorize=True, compile=False, graphs=g) for g in (False, True)}
    for loop in loops.values():
        for _ in range(rounds):
            loop.run_round()
    diff = float((loops[True].server["global"] - loops[False].server["global"]).abs().max())
    note = capture_note(loops[True], device, float("nan"))
    return f"{name}: {rounds} rounds, max |captured - vectorized| of the global state {diff:.2e} ({note})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="fedavg-cnn,pgfed-resnet18-gn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    print(f"bench.gpu_capture_check on {device_name(device)}", flush=True)
    for name in args.only.split(","):
        print(compare(name, args.rounds, device), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
