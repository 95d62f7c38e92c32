"""The run's Lightning Fabric: devices, processes and precision (``trainer.*``).

With ``trainer.processes_per_device`` k > 1, ``devices · k`` processes run per node and rank r trains
on device r // k, each its share of the sampled clients (``pfl.federation.distributed``). Those ranks
talk through gloo: NCCL refuses two ranks on one GPU, and the exchange goes through host memory anyway.
"""

from __future__ import annotations

import warnings

import lightning as L
import torch
from lightning.fabric.strategies import DDPStrategy

from pfl.config import TrainerConfig
from pfl.errors import require


def device_index(local_rank: int, processes_per_device: int) -> int:
    """The device a node's ``local_rank`` trains on when ``processes_per_device`` processes share each one."""
    return local_rank // processes_per_device


def accelerator_type(accelerator: str) -> str:
    """cpu or cuda: the device type that several processes per device run on (``auto``: a GPU when there is one)."""
    if accelerator in ("cuda", "gpu"):
        return "cuda"
    if accelerator == "auto" and torch.cuda.is_available():
        return "cuda"
    require(
        accelerator in ("cpu", "auto"),
        "trainer.processes_per_device",
        f"several processes cannot share a {accelerator} device",
        "use 1, or accelerator cpu or cuda",
    )
    return "cpu"


def parallel_devices(kind: str, devices: int, processes_per_device: int) -> list[torch.device]:
    """One device per local process, in local-rank order: each device repeated ``processes_per_device`` times."""
    count = devices * processes_per_device
    if kind == "cpu":
        return [torch.device("cpu")] * count
    return [torch.device(kind, device_index(r, processes_per_device)) for r in range(count)]


def shared_device_strategy(t: TrainerConfig) -> tuple[str, DDPStrategy]:
    """The accelerator and the DDP strategy that run ``processes_per_device`` processes on each device (gloo)."""
    kind = accelerator_type(t.accelerator)
    return kind, DDPStrategy(
        parallel_devices=parallel_devices(kind, t.devices, t.processes_per_device), process_group_backend="gloo"
    )


def make_fabric(t: TrainerConfig) -> L.Fabric:
    """The Fabric of a run (not launched): one process per device, or ``processes_per_device`` on each."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision.*")
        if t.processes_per_device == 1:
            return L.Fabric(
                accelerator=t.accelerator,
                devices=t.devices,
                num_nodes=t.num_nodes,
                strategy=t.strategy,
                precision=t.precision,
            )
        kind, strategy = shared_device_strategy(t)
        return L.Fabric(
            accelerator=kind, devices=t.devices, num_nodes=t.num_nodes, strategy=strategy, precision=t.precision
        )


__all__ = ["accelerator_type", "device_index", "make_fabric", "parallel_devices", "shared_device_strategy"]
