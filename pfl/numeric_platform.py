"""What a run's numbers depend on besides its configuration and seed: the platform its kernels ran on.

pfl's random draws are keyed (``pfl.seeding``), so a run repeats bit for bit on the same platform. Across
platforms it need not: torch's CPU kernels are chosen by the CPU's instruction set (ATen's "CPU capability":
AVX2, AVX-512, ...) and MKL picks its own code path per processor, and each rounds sums in its own order.
Forcing other kernels on one machine moves a 20-round validation accuracy by up to 0.02 (docs/reproduce.md,
"Same numbers"). A run's ``summary.json`` records its platform (``record``), so two numbers can be told
apart by where they were computed before anyone looks for a change in the code."""

from __future__ import annotations

import functools
import os
import platform
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Environment variables that select kernels and so change numbers (torch's and MKL's own switches).
KERNEL_SWITCHES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "CUBLAS_WORKSPACE_CONFIG")


def record(device: Any) -> dict[str, Any]:
    """The platform of a run on ``device`` (a ``torch.device``): torch's version, the CPU, the CPU kernels
    torch dispatches to, torch's threads, the GPU and cuDNN where the run trained on CUDA, and any
    ``KERNEL_SWITCHES`` set in the environment."""
    import torch

    out: dict[str, Any] = {
        "torch": str(torch.__version__),  # a str subclass, which a weights_only checkpoint refuses
        "cpu": this_cpu(),
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    if getattr(device, "type", None) == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cudnn"] = torch.backends.cudnn.version()
    switches = {name: os.environ[name] for name in KERNEL_SWITCHES if name in os.environ}
    if switches:
        out["env"] = switches
    return out


@functools.cache
def this_cpu() -> str:
    """This machine's ``cpu_name``, read once per process (every checkpoint records it)."""
    return cpu_name()


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name (Linux's ``/proc/cpuinfo``), else what ``platform`` knows of it."""
    try:
        with cpuinfo.open(errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def label(rec: object) -> str:
    """One line for a recorded platform (``record``'s dict; anything else: a run that recorded none, made
    by an older pfl)."""
    if not isinstance(rec, dict) or not rec:
        return "a platform not recorded (runs of an older pfl)"
    threads = rec.get("threads")
    parts = [
        f"torch {rec.get('torch', '?')}",
        f"{rec.get('cpu', '?')} ({rec.get('cpu_kernels', '?')} kernels, {threads} thread{'s' * (threads != 1)})",
    ]
    if "gpu" in rec:
        parts.append(f"{rec['gpu']} (cuDNN {rec.get('cudnn')})")
    parts += [f"{name}={value}" for name, value in sorted(rec.get("env", {}).items())]
    return ", ".join(parts)


def platform_counts(records: Iterable[object]) -> Counter[str]:
    """How many runs computed their numbers on each platform (``label`` of each run's ``record``)."""
    return Counter(label(rec) for rec in records)


def where_computed(counts: Counter[str]) -> str | None:
    """One sentence on where runs computed their numbers (``platform_counts``): the platform, or each with
    its number of runs where they differ, since the same run can give other numbers on another platform
    (None: no runs)."""
    if len(counts) < 2:
        return next((f"Numbers computed on {name}." for name in counts), None)
    each = "; ".join(f"{name}: {n} run(s)" for name, n in counts.most_common())
    return (
        f"Numbers computed on {len(counts)} platforms ({each}). The same run can give other numbers on another "
        'platform (docs/reproduce.md, "Same numbers"): a difference between runs of different platforms need '
        "not come from the methods."
    )
