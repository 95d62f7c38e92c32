"""The paths of ``python -m bench.gpu``, each measured on its own: samples/s over timed rounds (one warm-up
round excluded; CUDA synchronized around every round) and the peak GPU memory of the path.

plain: ``bench.overhead.PlainFedAvg`` (FedAvg in plain PyTorch, pfl's model builder, the data on the
device, one client after another; bf16 rows run it under ``torch.autocast``). sequential / vectorized:
the loop as a run assembles it, ``trainer.vectorize`` false / true. compiled: vectorized with
``trainer.compile``, in a child process with a time limit (a compile can take minutes). processes: N
processes on the one device, each training its share of the sampled clients one after another, the
results exchanged through host memory (gloo), as ``trainer.processes_per_device: N`` runs them.

A path that cannot run says why in its cell (``Cell.reason``) instead of stopping the table.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import queue
import statistics
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from bench.gpu_workloads import Workload, build_data, run_config
from bench.overhead import PlainFedAvg
from pfl.errors import ConfigError
from pfl.federation.distributed import Cohort
from pfl.federation.loop import FederatedLoop, sample_clients
from pfl.runner.assembly import build_loop
from pfl.runner.plan import clients_per_round, plan_run

PATHS = ("plain", "sequential", "vectorized", "captured", "processes", "compiled")
MIB = 2**20


@dataclass
class Cell:
    """One (workload, path) measurement: samples/s and peak MiB, or the reason there is none."""

    workload: str
    path: str
    samples_per_s: float | None = None
    peak_mib: float | None = None  # None on a CPU (no allocator statistics)
    reason: str | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fresh_memory(device: torch.device) -> None:
    """Drop what the previous path left, so that this path's peak is its own."""
    if device.type == "cuda":
        gc.collect()
        torch.empty(0, device=device)  # a fresh process's allocator exists only after a first allocation
        # After a failed CUDA graph capture some torch versions keep the allocator marked as capturing and
        # every empty_cache raises: the table goes on (the peaks then include cached blocks).
        with contextlib.suppress(RuntimeError):
            torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / MIB if device.type == "cuda" else None


def fabric_for(device: torch.device, precision: str) -> L.Fabric:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision.*")
        return L.Fabric(accelerator=device.type, devices=1, precision=precision)


def synced(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """``fn()``'s result and its seconds, the device synchronized before and after."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def timed_rounds(step: Callable[[], int], warmup: int, rounds: int, device: torch.device) -> tuple[float, list[float]]:
    """(samples per second over the timed rounds, the warm-up rounds' seconds); ``step`` runs one round
    and returns the samples it trained."""
    warm = [synced(step, device)[1] for _ in range(warmup)]
    timed = [synced(step, device) for _ in range(rounds)]
    samples, seconds = [n for n, _ in timed], [t for _, t in timed]
    # The median round's throughput: a round stalled by something else does not set the figure.
    rates = [s / t for s, t in zip(samples, seconds, strict=True)]
    return statistics.median(rates), warm


def failure(w: Workload, path: str, err: BaseException) -> Cell:
    """A cell that says why ``path`` did not run (a refused setting, out of memory, an error)."""
    if isinstance(err, ConfigError):
        return Cell(w.name, path, reason=f"refused: {err}")
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return Cell(w.name, path, reason="out of GPU memory")
    last = traceback.format_exception_only(type(err), err)[-1].strip().splitlines()[0]
    return Cell(w.name, path, reason=f"failed: {last}")


def measure_plain(w: Workload, data: Any, device: torch.device) -> Cell:
    if w.method != "fedavg":
        why = f"the plain loop is FedAvg's ({w.method} is compared with its sequential path)"
        return Cell(w.name, "plain", reason=why)
    cfg = run_config(w, vectorize=False, compile=False)
    plain = PlainFedAvg(cfg, data)
    plain.net.to(device)  # the same Parameter objects: the optimizer keeps them
    plain.global_params = [g.to(device) for g in plain.global_params]
    per_round = clients_per_round(cfg, data.num_clients)

    def step() -> int:
        sampled = sample_clients(cfg.seed, plain.round, data.num_clients, per_round).tolist()
        if w.precision.startswith("bf16"):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                plain.run_round()
        else:
            plain.run_round()
        return sum(len(data.clients[c].train) for c in sampled) * cfg.client.epochs

    rate, _ = timed_rounds(step, 1, w.rounds, device)
    return Cell(w.name, "plain", rate, peak_mib(device))


def build(
    w: Workload,
    data: Any,
    device: torch.device,
    *,
    vectorize: bool,
    compile: bool,
    cohort: Cohort | None = None,
    graphs: bool = False,
) -> FederatedLoop:
    cfg = run_config(w, vectorize=vectorize, compile=compile, graphs=graphs)
    return build_loop(plan_run(cfg, data), fabric_for(device, w.precision), announce_path=False, cohort=cohort)


def loop_step(loop: FederatedLoop) -> Callable[[], int]:
    def step() -> int:
        before = loop.progress.train_samples
        loop.run_round()
        return loop.progress.train_samples - before

    return step


def measure_loop(w: Workload, data: Any, device: torch.device, path: str) -> Cell:
    """sequential, vectorized, captured (vectorized + trainer.cuda_graphs; its first round captures) or
    compiled (vectorized + trainer.compile; its first two rounds compile)."""
    graphs = path == "captured"
    loop = build(w, data, device, vectorize=path != "sequential", compile=path == "compiled", graphs=graphs)
    warmup = 2 if path == "compiled" else 1  # the second round meets the other last-batch sizes
    rate, warm = timed_rounds(loop_step(loop), warmup, w.rounds, device)
    note = f"first rounds {' + '.join(f'{s:.1f}' for s in warm)} s (compiling)" if path == "compiled" else ""
    if graphs:
        note = capture_note(loop, device, warm[0])
    return Cell(w.name, path, rate, peak_mib(device), note=note)


def capture_note(loop: FederatedLoop, device: torch.device, first_round_s: float) -> str:
    """What ``trainer.cuda_graphs`` did in the measured rounds: captured (and the first round's time, where
    the captures happen), uncaptured and why, or nothing off CUDA."""
    if device.type != "cuda":
        return "not captured: CUDA graphs need CUDA (this ran as vectorized)"
    steps = loop.dispatcher.lockstep.trainer.captured_steps()  # type: ignore[attr-defined]
    fallbacks = sorted({s.fallback for s in steps if s.fallback})
    graphs = sum(len(s.graphs) for s in steps)
    if fallbacks and not graphs:
        return f"not captured: {'; '.join(fallbacks)}"
    note = f"{graphs} graph(s), first round {first_round_s:.1f} s (capturing)"
    return f"{note}; uncaptured: {'; '.join(fallbacks)}" if fallbacks else note


def measure(w: Workload, data: Any, device: torch.device, path: str) -> Cell:
    """``path`` of ``w`` in this process, its failure turned into a cell."""
    fresh_memory(device)
    try:
        if path == "plain":
            return measure_plain(w, data, device)
        return measure_loop(w, data, device, path)
    except Exception as err:  # one configuration never stops the table
        return failure(w, path, err)
    finally:
        fresh_memory(device)


# -- child processes: N processes on one device, and the compiled path (with a time limit) ----------------


def _child(rank: int, nprocs: int, ws: list[Workload], device_type: str, path: str, store: str, out: Any) -> None:
    """Rank ``rank`` of ``nprocs`` measures ``path`` for every workload in turn; rank 0 reports each cell."""
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cpu":
        torch.set_num_threads(1)
    if path == "compiled":
        for w in ws:
            out.put(measure(w, build_data(w).to(device), device, path).to_json())
        return
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=nprocs)
    try:
        for w in ws:
            cell = _ranks_cell(rank, nprocs, w, device)
            if rank == 0:
                out.put(cell.to_json())
    finally:
        dist.destroy_process_group()


def _ranks_cell(rank: int, nprocs: int, w: Workload, device: torch.device) -> Cell:
    fresh_memory(device)
    try:
        data = build_data(w).to(device)
        cohort = Cohort(rank, nprocs, _all_gather)
        loop = build(w, data, device, vectorize=False, compile=False, cohort=cohort)
        rate, _ = timed_rounds(loop_step(loop), 1, w.rounds, device)
        peaks = cohort.gather_objects(peak_mib(device))  # every process's peak on the shared card
        total = None if peaks[0] is None else sum(peaks)
        return Cell(w.name, "processes", rate, total, note=f"{nprocs} processes on one device, sequential in each")
    except Exception as err:  # the same on every rank: the workload's set-up or training failed everywhere
        return failure(w, "processes", err)
    finally:
        fresh_memory(device)


def _all_gather(obj: Any) -> list[Any]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def measure_in_children(ws: list[Workload], device_type: str, path: str, nprocs: int, timeout_s: float) -> list[Cell]:
    """``path`` of every workload in ``nprocs`` fresh processes (``spawn``); the workloads not done after
    ``timeout_s`` say so."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    deadline = time.monotonic() + timeout_s
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        args = (nprocs, ws, device_type, path, store, out)
        procs = [ctx.Process(target=_child, args=(r, *args)) for r in range(nprocs)]
        for p in procs:
            p.start()
        try:
            while len(cells) < len(ws):
                cells.append(Cell(**out.get(timeout=max(0.0, deadline - time.monotonic()))))
        except queue.Empty:
            alive = any(p.is_alive() for p in procs)
            why = f"stopped: the time budget ran out ({timeout_s:.0f} s)" if alive else "failed: the process died"
            cells += [Cell(w.name, path, reason=why) for w in ws[len(cells) :]]
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join()
    return cells


__all__ = ["Cell", "PATHS", "measure", "measure_in_children"]
