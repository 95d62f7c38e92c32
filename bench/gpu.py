"""``python -m bench.gpu``: one table of samples/s and peak GPU memory for every way pfl can train a round's
clients on one device, against a plain PyTorch loop.

Rows: the FedAvg CNN (MNIST-shaped Dirichlet split) and timm ResNet-18 GN (CIFAR-shaped, fp32 and
bf16-mixed), each against the plain sequential loop; PGFed, FedRep and PLGU-LF on the ResNet workload,
each against its own sequential path; with ``--only`` also APFL, FedRoD, pFedMe and Per-FedAvg on the CNN
workload (``apfl-cnn``, ...). Paths: ``bench.gpu_paths``; workloads: ``bench.gpu_workloads``.

Sized for one H100/H200 in under 8 minutes (``--budget-s``: a path that would start after it is
skipped, a compile is stopped at it). On a CPU (or with ``--small``) everything shrinks so that the
table takes well under a minute: it checks that every path runs, its figures say nothing about a GPU.

    python -m bench.gpu [--small] [--device auto|cpu|cuda] [--procs N] [--budget-s S] [--only W,..]
                        [--paths P,..] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from bench.gpu_paths import PATHS, Cell, measure, measure_in_children
from bench.gpu_workloads import Workload, build_data, workloads
from pfl.safe_files import write_atomic

LABELS = {
    "plain": "plain PyTorch loop",
    "sequential": "pfl sequential",
    "vectorized": "pfl vectorized",
    "captured": "pfl vectorized + CUDA graphs",
    "processes": "pfl N processes",
    "compiled": "pfl vectorized + compiled",
}
HEADER = ("workload", "path", "samples/s", "vs base", "peak GPU MiB", "note")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name, 0) if name == "cuda" else torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} thread(s))"


class Budget:
    """The command's time limit: a path that would start after it is skipped and says so."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_table(
    ws: Sequence[Workload],
    device: torch.device,
    procs: int,
    budget: Budget,
    compile_small: bool,
    small: bool,
    on_cell: Callable[[Cell], None] = lambda cell: None,
    paths: Sequence[str] = PATHS,
) -> list[Cell]:
    """Every (workload, path) cell, in table order; ``on_cell`` hears of each as it is measured (so that a
    command stopped from outside still leaves the cells it had). The in-process paths run first, then the
    ones in child processes (N processes, then compiled: the longest and the likeliest to be stopped by
    the budget). A path not in ``paths`` says so in its cell."""
    cells: dict[tuple[str, str], Cell] = {}

    def keep(cell: Cell) -> None:
        cells[cell.workload, cell.path] = cell
        on_cell(cell)

    for path in sorted(set(PATHS) - set(paths), key=PATHS.index):
        for w in ws:
            keep(Cell(w.name, path, reason="not run: --paths leaves it out"))
    in_process = [p for p in ("plain", "sequential", "vectorized", "captured") if p in paths]
    for w in ws if in_process else ():
        data = build_data(w).to(device)
        for path in in_process:
            keep(skipped(w, path) if budget.left() <= 0 else measure(w, data, device, path))
        del data
    if "processes" in paths:
        for cell in in_children(ws, device, "processes", procs, budget):
            keep(cell)
    if "compiled" in paths and small and not compile_small:
        why = "not run with --small (inductor compiles minutes of C++ on a CPU; --compile runs it)"
        for w in ws:
            keep(Cell(w.name, "compiled", reason=why))
    elif "compiled" in paths:
        for cell in in_children(ws, device, "compiled", 1, budget):
            keep(cell)
    return [cells[w.name, p] for w in ws for p in PATHS]


def in_children(ws: Sequence[Workload], device: torch.device, path: str, nprocs: int, budget: Budget) -> list[Cell]:
    if budget.left() <= 0:
        return [skipped(w, path) for w in ws]
    return measure_in_children(list(ws), device.type, path, nprocs, budget.left())


def skipped(w: Workload, path: str) -> Cell:
    return Cell(w.name, path, reason="skipped: the time budget (--budget-s) was spent")


def speedups(cells: Sequence[Cell], ws: Sequence[Workload]) -> dict[tuple[str, str], float | None]:
    """Each cell's samples/s over its workload's baseline path's (None where either is missing)."""
    rate = {(c.workload, c.path): c.samples_per_s for c in cells}
    base = {w.name: rate.get((w.name, w.baseline)) for w in ws}
    out: dict[tuple[str, str], float | None] = {}
    for c in cells:
        b = base[c.workload]
        out[c.workload, c.path] = None if c.samples_per_s is None or not b else c.samples_per_s / b
    return out


def format_table(cells: Sequence[Cell], ws: Sequence[Workload], procs: int) -> str:
    """The markdown table: one row per (workload, path); a path without figures says why in its note."""
    ratio = speedups(cells, ws)
    baseline = {w.name: w.baseline for w in ws}
    rows = [HEADER, tuple("---" for _ in HEADER)]
    for c in cells:
        x = ratio[c.workload, c.path]
        label = LABELS[c.path].replace("N processes", f"{procs} processes")
        rows.append(
            (
                c.workload,
                label,
                "-" if c.samples_per_s is None else f"{c.samples_per_s:,.0f}".replace(",", " "),
                "-" if x is None else f"{x:.2f}x {baseline[c.workload]}",
                "-" if c.peak_mib is None else f"{c.peak_mib:,.0f}".replace(",", " "),
                c.reason or c.note,
            )
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--small", action="store_true", help="CPU-sized workloads (automatic on a CPU)")
    parser.add_argument("--compile", action="store_true", help="with --small: also run the compiled path")
    parser.add_argument("--procs", type=int, default=None, help="processes on the device (default 4; small: 2)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting paths after this many s")
    parser.add_argument("--only", default=None, help="comma-separated workload names (default: all)")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated paths (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write the cells to this JSON file")
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    unknown_paths = sorted(set(paths) - set(PATHS))
    if unknown_paths:
        parser.error(f"--paths: unknown path(s) {', '.join(unknown_paths)}; choose from {', '.join(PATHS)}")
    device = pick_device(args.device)
    small = args.small or device.type == "cpu"
    procs = args.procs or (2 if small else 4)
    if device.type == "cpu":
        torch.set_num_threads(1)
    ws = workloads(small, optional=bool(args.only))  # the optional rows only when named
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {w.name for w in ws})
        if unknown:
            names = ", ".join(w.name for w in ws)
            parser.error(f"--only: unknown workload(s) {', '.join(unknown)}; choose from {names}")
        ws = [w for w in ws if w.name in wanted]
    started = time.monotonic()
    done: list[Cell] = []

    def record(cells: Sequence[Cell]) -> None:
        if args.json is not None:
            took = time.monotonic() - started
            meta = {"device": device_name(device), "torch": torch.__version__, "small": small, "processes": procs}
            body = {**meta, "seconds": took, "cells": [c.to_json() for c in cells]}
            write_atomic(args.json, json.dumps(body, indent=2) + "\n")  # rewritten per cell: never half a file

    def progress(cell: Cell) -> None:
        done.append(cell)
        figure = "-" if cell.samples_per_s is None else f"{cell.samples_per_s:.0f} samples/s"
        print(f"  {cell.workload} / {cell.path}: {figure} {cell.reason or cell.note}", file=sys.stderr, flush=True)
        record(done)

    cells = run_table(ws, device, procs, Budget(args.budget_s), args.compile, small, progress, paths)
    took = time.monotonic() - started
    size = "small (CPU-sized, the resnet18 rows train a small CNN: checks the paths, not a speed)" if small else "full"
    print(f"bench.gpu on {device_name(device)}, torch {torch.__version__}, {size} workloads, {took:.0f} s\n")
    print(format_table(cells, ws, procs), end="")
    record(cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
