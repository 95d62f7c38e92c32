"""The workloads of ``python -m bench.gpu``: what is trained, on which synthetic data, at which size.

Full size (a GPU): the FedAvg CNN on an MNIST-shaped Dirichlet split (100 clients over a 5 000-sample
pool, 20 per round, batch 10, 1 epoch), and timm ResNet-18 with GroupNorm and the CIFAR stem on
3x32x32 inputs (50 clients x 500 samples, 10 per round, batch 32, 1 epoch) in fp32 and bf16-mixed,
plus PGFed, FedRep and PLGU-LF on that ResNet workload. Optional rows, run only when ``--only`` names
them: the methods whose clients train together through a stacked custom loss (APFL, FedRoD) or stacked
gradient calls (pFedMe, Per-FedAvg) on the CNN workload, each against its own sequential path.
``small`` shrinks clients, samples, inputs, widths and rounds so that the whole table takes seconds on a
CPU (it exercises the code, not the speed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from bench.common import BENCH_METHOD_ARGS
from pfl.config import ClientConfig, EvalConfig, RunConfig, TrackingConfig, TrainerConfig
from pfl.data import ClientSplit, DataConfig, FederatedData
from pfl.data.partition import dirichlet_partition
from pfl.methods import method_class
from pfl.models import ModelConfig


@dataclass(frozen=True)
class Workload:
    """One row group of the table: a method, a model, a synthetic federation and how long to time it."""

    name: str
    method: str
    model: ModelConfig
    data: str  # mnist_dirichlet | cifar
    num_clients: int
    samples_per_client: int  # cifar: per client; mnist_dirichlet: the pool is num_clients x this
    side: int  # input height = width
    per_round: int
    batch_size: int
    precision: str = "32-true"
    rounds: int = 3  # timed rounds, after one warm-up round

    @property
    def baseline(self) -> str:
        """The path each row is compared with: the plain PyTorch loop for FedAvg, else the method's sequential path."""
        return "plain" if self.method == "fedavg" else "sequential"


CNN = ModelConfig(name="cnn", channels=[32, 64], fc=512)  # FedAvg-CNN, 32/64 5x5 conv-pool, FC 512
RESNET = ModelConfig(name="timm:resnet18", norm="group", stem="cifar")  # GroupNorm, CIFAR stem


OPTIONAL_METHODS = ("apfl", "fedrod", "pfedme", "perfedavg")  # on the CNN workload, rows --only names


def workloads(small: bool, optional: bool = False) -> list[Workload]:
    """The table's workloads, in order; ``small`` the CPU-sized version of each; ``optional``: then the
    rows of ``OPTIONAL_METHODS`` too."""
    cnn = Workload("fedavg-cnn", "fedavg", CNN, "mnist_dirichlet", 100, 50, 28, 20, 10, rounds=10)
    resnet = Workload("fedavg-resnet18-gn", "fedavg", RESNET, "cifar", 50, 500, 32, 10, 32)
    if small:
        # A CPU cannot train ResNet-18 fast enough for a test (and its vmapped grouped-conv backward is
        # slower still): the small table's "resnet" rows train a small CNN on 3x16x16 inputs.
        tiny = replace(CNN, channels=[4, 8], fc=32)
        cnn = replace(cnn, model=tiny, num_clients=12, per_round=4, rounds=2)
        resnet = replace(resnet, model=tiny, num_clients=6, samples_per_client=10, side=16, per_round=2, batch_size=4)
        resnet = replace(resnet, rounds=2)
    methods = [replace(resnet, name=f"{m}-resnet18-gn", method=m) for m in ("pgfed", "fedrep", "plgu_lf")]
    bf16 = replace(resnet, name="fedavg-resnet18-gn-bf16", precision="bf16-mixed")
    extra = [replace(cnn, name=f"{m}-cnn", method=m) for m in OPTIONAL_METHODS] if optional else []
    return [cnn, resnet, bf16, *methods, *extra]


def build_data(w: Workload, seed: int = 0) -> FederatedData:
    """The workload's synthetic federation (80 % of each client's samples train, 20 % test); on the CPU."""
    g = torch.Generator().manual_seed(seed)
    n = w.num_clients * w.samples_per_client
    if w.data == "mnist_dirichlet":
        # Learnable MNIST-shaped images (class templates plus noise), split by Dirichlet(0.5) label skew.
        y = torch.randint(0, 10, (n,), generator=g)
        templates = torch.rand(10, 1, w.side, w.side, generator=g)
        x = (templates[y] + 0.5 * torch.randn(n, 1, w.side, w.side, generator=g)).clamp_(0, 1)
        parts = dirichlet_partition(y.numpy(), w.num_clients, 0.5, np.random.default_rng(seed), min_samples=10)
    else:
        x = torch.rand(n, 3, w.side, w.side, generator=g)
        y = torch.randint(0, 10, (n,), generator=g)
        parts = [np.arange(k * w.samples_per_client, (k + 1) * w.samples_per_client) for k in range(w.num_clients)]
    clients = []
    for part in parts:
        idx = torch.as_tensor(part, dtype=torch.long)
        cut = max(1, int(0.8 * len(idx)))
        clients.append(ClientSplit(train=idx[:cut], test=idx[cut:]))
    return FederatedData(w.name, x, y, 10, clients, global_test=torch.zeros(0, dtype=torch.long))


def run_config(w: Workload, *, vectorize: bool, compile: bool, graphs: bool = False) -> RunConfig:
    """The run configuration of one path of ``w`` (trainer.vectorize true or false, never auto: the table
    names its path; ``graphs``: trainer.cuda_graphs)."""
    return RunConfig(
        method=method_class(w.method)(**BENCH_METHOD_ARGS.get(w.method, {})),
        seed=0,
        trainer=TrainerConfig(
            rounds=10**6,
            clients_per_round=w.per_round,
            progress=False,
            precision=w.precision,
            vectorize=vectorize,
            compile=compile,
            cuda_graphs=graphs,
        ),
        client=ClientConfig(epochs=1, batch_size=w.batch_size, lr=0.05),
        data=DataConfig(num_clients=w.num_clients),
        model=w.model,
        eval=EvalConfig(batch_size=1024),
        tracking=TrackingConfig(wandb=False),
    )


__all__ = ["Workload", "build_data", "run_config", "workloads"]
