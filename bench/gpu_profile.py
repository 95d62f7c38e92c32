"""``python -m bench.gpu_profile``: where a round's time goes on one device, and what the stacked step's
convolutions cost against the same work done without per-client weights.

Two parts, each printed as plain text (and written under ``--out``):

* **round profiles**: one round of a ``bench.gpu`` workload (sequential or vectorized) under
  ``torch.profiler``, after one warm-up round: the round's wall time without the profiler, the number of
  device kernels, their summed device time (on a CPU: none), the host-device copies and synchronizations,
  and the ops that take the most host time and the most device time.
* **step microbenchmark** (timm ResNet-18 GN, CIFAR stem): one training step's forward and backward for
  ``clients`` clients of ``batch`` samples, done three ways: one client after another (``sequential``),
  vmapped with per-client weights as the stacked trainer does (``stacked``: convolutions become grouped
  ones), and one model on all ``clients × batch`` samples (``one model``: the same arithmetic with
  shared weights, a bound no per-client stacking can beat), each with cuDNN's autotuner off and on, in
  fp32 and under bf16 autocast.

On a CPU everything shrinks (``--small``, automatic there): it checks that the script runs.

    python -m bench.gpu_profile [--small] [--device auto|cpu|cuda] [--out DIR] [--parts rounds,steps]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.profiler import ProfilerActivity, profile

from bench.gpu import device_name, pick_device
from bench.gpu_paths import build, loop_step, sync, synced
from bench.gpu_workloads import RESNET, Workload, build_data, workloads
from pfl.models import ModelConfig, build_model
from pfl.safe_files import write_atomic

PARTS = ("rounds", "steps")


# -- round profiles -------------------------------------------------------------------------------------


def profile_round(w: Workload, device: torch.device, vectorize: bool, top: int = 15) -> str:
    """A text report of one profiled round of ``w`` (after a warm-up round and one timed unprofiled round)."""
    data = build_data(w).to(device)
    loop = build(w, data, device, vectorize=vectorize, compile=False)
    step = loop_step(loop)
    step()  # warm-up: allocator, cuDNN plans, lazy modules
    samples, seconds = synced(step, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    events = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_s = sum(e.device_time_total for e in kernels) / 1e6 if kernels else 0.0

    def count(*needles: str) -> int:
        return sum(e.count for e in events if any(n in e.key for n in needles))

    path = "vectorized" if vectorize else "sequential"
    lines = [
        f"== {w.name} / {path}: {samples} samples in {seconds * 1e3:.1f} ms ({samples / seconds:,.0f} samples/s)",
        f"device kernels: {len(kernels)} ({kernel_s * 1e3:.1f} ms of device time, "
        f"{kernel_s / seconds:.0%} of the round)",
        f"host-device copies: {count('Memcpy', 'aten::_to_copy', 'aten::copy_')} op calls; "
        f"synchronizations: {count('Synchronize', 'aten::item', 'aten::_local_scalar_dense')}",
        "",
        "by host time:",
        events.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60),
    ]
    if device.type == "cuda":
        lines += [
            "by device time:",
            events.table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=60),
        ]
    return "\n".join(lines)


# -- step microbenchmark --------------------------------------------------------------------------------


def resnet(device: torch.device, small: bool) -> nn.Module:
    cfg = ModelConfig(name="cnn", channels=[4, 8], fc=32) if small else RESNET
    return build_model(cfg, (3, 32, 32), 10).to(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` synchronized calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    return statistics.median(synced(fn, device)[1] for _ in range(repeats))


@contextlib.contextmanager
def cudnn_benchmark(on: bool) -> Iterator[None]:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def step_fns(net: nn.Module, clients: int, batch: int, device: torch.device, bf16: bool) -> dict[str, Callable]:
    """The three ways of one step's forward and backward (see the module's docstring)."""
    params = {n: p.detach() for n, p in net.named_parameters()}
    stacked = {n: p.unsqueeze(0).expand(clients, *p.shape).clone() for n, p in params.items()}
    x = torch.rand(clients, batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (clients, batch), device=device)

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def loss(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        with autocast():
            out = functional_call(net, p, (xb,))
        return nn.functional.cross_entropy(out.float(), yb)

    vmapped = vmap(grad(loss))
    one = grad(loss)

    def sequential() -> None:
        for j in range(clients):
            one(params, x[j], y[j])

    def stacked_step() -> None:
        vmapped(stacked, x, y)

    def one_model() -> None:
        one(params, x.flatten(0, 1), y.flatten(0, 1))

    return {"sequential": sequential, "stacked": stacked_step, "one model": one_model}


def step_table(device: torch.device, small: bool) -> str:
    clients, batch, repeats = (2, 4, 2) if small else (10, 32, 10)
    net = resnet(device, small)
    net.train()
    rows = [
        "| precision | cudnn.benchmark | way | ms per step | samples/s | vs sequential |",
        "|---|---|---|---|---|---|",
    ]
    for bf16 in (False, True):
        for bench_on in (False, True) if device.type == "cuda" else (False,):
            with cudnn_benchmark(bench_on):
                fns = step_fns(net, clients, batch, device, bf16)
                secs = {way: timed(fn, device, repeats) for way, fn in fns.items()}
            for way, s in secs.items():
                rate = clients * batch / s
                rows.append(
                    f"| {'bf16 autocast' if bf16 else 'fp32'} | {bench_on} | {way} | {s * 1e3:.2f} | {rate:,.0f} | "
                    f"{secs['sequential'] / s:.2f}x |"
                )
    what = "a small CNN (CPU-sized)" if small else "timm ResNet-18 GN, CIFAR stem"
    return f"== step microbenchmark: {what}, {clients} clients x batch {batch}\n" + "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--small", action="store_true", help="CPU-sized (automatic on a CPU)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated: rounds, steps")
    parser.add_argument("--only", default="fedavg-cnn,fedavg-resnet18-gn", help="workloads to profile a round of")
    parser.add_argument("--out", type=Path, default=None, help="also write each report into this folder")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"--parts: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    device = pick_device(args.device)
    small = args.small or device.type == "cpu"
    if device.type == "cpu":
        torch.set_num_threads(1)
    ws = {w.name: w for w in workloads(small)}
    if unknown := sorted(set(args.only.split(",")) - set(ws)):
        parser.error(f"--only: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(ws)}")
    print(f"bench.gpu_profile on {device_name(device)}, torch {torch.__version__}", flush=True)
    reports: dict[str, str] = {}
    if "rounds" in parts:
        for name in args.only.split(","):
            for vectorize in (False, True):
                key = f"round_{name}_{'vectorized' if vectorize else 'sequential'}"
                reports[key] = profile_round(ws[name], device, vectorize)
                print(reports[key], flush=True)
    if "steps" in parts:
        reports["steps"] = step_table(device, small)
        print(reports["steps"], flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for key, text in reports.items():
            write_atomic(args.out / f"{key}.txt", text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
