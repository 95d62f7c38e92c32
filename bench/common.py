"""Benchmark federations and configs: MNIST-shaped images, equal data per client, no download.

Timings do not depend on pixel values, so the images are synthetic (class templates plus noise,
learnable, so losses fall as on MNIST). Clients index one shared pool: client k's samples are a
window of the pool, so N = 1000 clients cost no more data memory than N = 10 and the memory that
grows with N is only what the loop and the method keep per client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch

from pfl.config import ClientConfig, EvalConfig, RunConfig, TrackingConfig, TrainerConfig
from pfl.data import ClientSplit, DataConfig, FederatedData
from pfl.federation.loop import FederatedLoop
from pfl.methods import method_class
from pfl.models import ModelConfig
from pfl.runner.assembly import build_loop
from pfl.runner.plan import plan_run

POOL = 5000  # MNIST-5k sized pool
TRAIN, TEST = 40, 10  # per client: 50 samples, as MNIST-5k split over 100 clients
MODELS = {
    "cnn": ModelConfig(name="cnn", channels=[32, 64], fc=512),  # FedAvg-CNN, 1.66 M parameters
    "mlp": ModelConfig(name="mlp", hidden=[128, 128]),  # 118 k parameters
    "resnet18": ModelConfig(name="timm:resnet18", norm="group"),  # GroupNorm, CIFAR stem, 11.2 M parameters
}


def mnist_like(num_clients: int, seed: int = 0) -> FederatedData:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (POOL,), generator=g)
    templates = torch.rand(10, 1, 28, 28, generator=g)
    x = (templates[y] + 0.5 * torch.randn(POOL, 1, 28, 28, generator=g)).clamp_(0, 1)
    per = TRAIN + TEST
    clients = []
    for k in range(num_clients):
        window = (torch.arange(per) + k * per) % POOL
        clients.append(ClientSplit(train=window[:TRAIN], test=window[TRAIN:]))
    return FederatedData("mnist-like", x, y, 10, clients, global_test=torch.arange(POOL - 500, POOL))


def cifar_like(num_clients: int, seed: int = 0, per_client: int = 50) -> FederatedData:
    """CIFAR-shaped 3x32x32 random images, ``per_client`` samples per client (80/20 train/test)."""
    g = torch.Generator().manual_seed(seed)
    n = num_clients * per_client
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    train = int(0.8 * per_client)
    clients = [
        ClientSplit(train=torch.arange(k * per_client, k * per_client + train),
                    test=torch.arange(k * per_client + train, (k + 1) * per_client))
        for k in range(num_clients)
    ]  # fmt: skip
    return FederatedData("cifar-like", x, y, 10, clients, global_test=torch.zeros(0, dtype=torch.long))


# The benchmark data has no validation splits: PAGE's and Dap-FL's agents score on the test splits (the
# papers' choice, the same cost) instead of refusing to start.
BENCH_METHOD_ARGS: dict[str, dict] = {"page": {"reward_split": "test"}, "dapfl": {"reward_split": "test"}}


def bench_config(
    method: str,
    model: str,
    num_clients: int,
    per_round: int,
    *,
    epochs: int = 2,
    batch_size: int = 10,
    method_args: dict | None = None,
    **trainer: object,
) -> RunConfig:
    """``trainer``: extra TrainerConfig fields (client_store, store_budget_mb, vectorize, compile)."""
    args = {**BENCH_METHOD_ARGS.get(method, {}), **(method_args or {})}
    return RunConfig(
        method=method_class(method)(**args),
        seed=0,
        trainer=TrainerConfig(rounds=10**6, clients_per_round=per_round, progress=False, **trainer),
        client=ClientConfig(epochs=epochs, batch_size=batch_size, lr=0.05),
        data=DataConfig(num_clients=num_clients),
        model=MODELS[model],
        eval=EvalConfig(batch_size=4096),
        tracking=TrackingConfig(wandb=False),
    )


def make_loop(cfg: RunConfig, data: FederatedData | None = None, run_dir: Path | None = None) -> FederatedLoop:
    """The loop as a real run builds it: on a single-device CPU Fabric (checkpoints in ``run_dir``)."""
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="32-true")
    data = data if data is not None else mnist_like(cfg.data.num_clients)
    return build_loop(plan_run(cfg, data), fabric, run_dir, spill_dir=run_dir)


def rounds_and_saves(
    loop: FederatedLoop, rounds: int, after_save: Callable[[], None] | None = None
) -> tuple[list[float], list[float]]:
    """Seconds of each of ``rounds`` rounds and of the checkpoint written after each (``after_save``
    runs untimed after every save, e.g. to record its size)."""
    round_s, save_s = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        loop.run_round()
        round_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loop.checkpointer.save()
        save_s.append(time.perf_counter() - t0)
        if after_save is not None:
            after_save()
    return round_s, save_s
