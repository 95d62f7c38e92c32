"""The run configuration: one dataclass per group, validated before anything is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pfl.data.config import DataConfig, validate_data_config
from pfl.errors import require
from pfl.models import ModelConfig

ACCELERATORS = ("cpu", "cuda", "gpu", "mps", "auto")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
STRATEGIES = ("auto", "ddp")  # ddp: one process per device; sampled clients are split across them


@dataclass
class TrainerConfig:
    rounds: int = 50
    fraction: float = 1.0  # share of clients sampled per round, in (0, 1]
    clients_per_round: int | None = None  # a fixed count instead of a fraction
    eval_every: int = 10
    checkpoint_every: int = 1  # a killed run loses at most this many rounds
    accelerator: str = "cpu"
    devices: int = 1  # processes per node; > 1 splits each round's clients across them (pfl.distributed)
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    progress: bool = True


@dataclass
class ClientConfig:
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0


@dataclass
class EvalConfig:
    batch_size: int = 4096


@dataclass
class TrackingConfig:
    wandb: bool = True  # offline unless logged in; false disables it
    project: str = "pfl"
    root: str = "runs"
    name: str | None = None


@dataclass
class RunConfig:
    method: Any  # a pfl.methods.Method instance
    seed: int = 0
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def validate(cfg: RunConfig) -> None:
    """Raise ConfigError naming the first invalid field. Runs before any data or model is built."""
    t, c = cfg.trainer, cfg.client
    require(t.rounds >= 1, "trainer.rounds", f"must be >= 1 (got {t.rounds})")
    require(
        0 < t.fraction <= 1,
        "trainer.fraction",
        f"must be in (0, 1] (got {t.fraction})",
        "e.g. 0.25 samples a quarter of the clients",
    )
    if t.clients_per_round is not None:
        require(
            1 <= t.clients_per_round <= cfg.data.num_clients,
            "trainer.clients_per_round",
            f"must be in [1, data.num_clients={cfg.data.num_clients}] (got {t.clients_per_round})",
        )
    require(t.eval_every >= 1, "trainer.eval_every", f"must be >= 1 (got {t.eval_every})")
    require(t.checkpoint_every >= 1, "trainer.checkpoint_every", f"must be >= 1 (got {t.checkpoint_every})")
    require(
        t.accelerator in ACCELERATORS,
        "trainer.accelerator",
        f"unknown accelerator {t.accelerator!r}",
        f"choose one of {', '.join(ACCELERATORS)}",
    )
    require(
        t.precision in PRECISIONS,
        "trainer.precision",
        f"unknown precision {t.precision!r}",
        f"choose one of {', '.join(PRECISIONS)}",
    )
    require(t.devices >= 1, "trainer.devices", f"must be >= 1 (got {t.devices})")
    require(t.num_nodes >= 1, "trainer.num_nodes", f"must be >= 1 (got {t.num_nodes})")
    require(
        t.strategy in STRATEGIES,
        "trainer.strategy",
        f"unknown strategy {t.strategy!r}",
        f"choose one of {', '.join(STRATEGIES)} (ddp runs one process per device, launched by pfl or torchrun)",
    )
    require(c.lr > 0, "client.lr", f"the learning rate must be > 0 (got {c.lr})")
    require(c.epochs >= 1, "client.epochs", f"must be >= 1 (got {c.epochs})")
    require(c.batch_size >= 1, "client.batch_size", f"must be >= 1 (got {c.batch_size})")
    require(0 <= c.momentum < 1, "client.momentum", f"must be in [0, 1) (got {c.momentum})")
    require(c.weight_decay >= 0, "client.weight_decay", f"must be >= 0 (got {c.weight_decay})")
    require(cfg.eval.batch_size >= 1, "eval.batch_size", f"must be >= 1 (got {cfg.eval.batch_size})")
    validate_data_config(cfg.data)
