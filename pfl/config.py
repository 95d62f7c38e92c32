"""The run configuration: one dataclass per group, validated before anything is built."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import torch

from pfl.data.config import validate_data_config
from pfl.data.settings import DataConfig
from pfl.errors import require
from pfl.models import ModelConfig, check_model_config
from pfl.registry import Registry, require_choice

ACCELERATORS = ("cpu", "cuda", "gpu", "mps", "auto")
# Every precision Lightning Fabric takes, written out so that reading a config never imports Lightning
# (seconds of start-up); tests/test_startup.py checks it against Fabric's own list.
PRECISIONS = (
    "transformer-engine",
    "transformer-engine-float16",
    "16-true",
    "16-mixed",
    "bf16-true",
    "bf16-mixed",
    "32-true",
    "64-true",
    "64",
    "32",
    "16",
    "bf16",
)
STRATEGIES = ("auto", "ddp")


def transformer_engine_available() -> bool:
    """Whether Fabric can run the transformer-engine precisions here (Lightning's own check, imported
    only when such a precision is asked for)."""
    from lightning.fabric.plugins.precision.transformer_engine import _TRANSFORMER_ENGINE_AVAILABLE

    return bool(_TRANSFORMER_ENGINE_AVAILABLE)  # ddp: one process per device; sampled clients are split across them


@dataclass
class TrainerConfig:
    """Rounds, client sampling, schedules and devices.

    Args:
        rounds: communication rounds to run.
        fraction: share of clients sampled per round, in (0, 1].
        clients_per_round: a fixed number of sampled clients; overrides fraction when set.
        eval_every: evaluate every this many rounds (and always after the last).
        checkpoint_every: a killed run loses at most this many rounds (1: every round is checkpointed).
            Above 1, a checkpoint is also written as soon as the time since the last one is 20x what
            that one cost (checkpointing then takes at most ~5 % of the run). Checkpoints are
            incremental (pfl.federation.checkpoint): a round's costs what it changed, not N.
            0: no checkpoint is written (a killed run starts again from round 0, and the Python
            API's Run.model() has no trained state to read).
        client_store: where per-client state lives between rounds: memory (on the training device)
            or disk (at most store_budget_mb on the device, the least recently used spilled to files).
        store_budget_mb: the disk store's budget on the training device, in MiB.
        vectorize: train the sampled clients of a round together (torch.func.vmap over stacked
            states; pfl.engine.vectorized lists the methods, models and settings it supports):
            auto (together on CUDA when the method, model and settings allow it, else one at a
            time), true (together, or a refusal naming why not) or false (one at a time).
        compile: wrap the model's forward in torch.compile (and the vectorized steps, when on); the log
            says once how long the first compiled calls (where compiling happens) took.
        cuda_graphs: replay the vectorized step from CUDA graphs captured once per shape
            (pfl.engine.cuda_graphs; every step padded to the batch size): one launch per step
            instead of hundreds. auto (on when the clients train together on CUDA and compile is
            off), true (the same, and refused with compile) or false. Ignored off CUDA and when the
            run trains one client at a time.
        accelerator: auto (a GPU when there is one), cpu, cuda/gpu or mps (Lightning Fabric).
        devices: number of devices per node.
        processes_per_device: processes sharing each device (each trains its share of the sampled
            clients; rank r runs on device r // processes_per_device). Above 1 on CUDA, the ranks
            exchange through gloo (NCCL refuses two ranks on one GPU).
        precision: any Fabric precision: 32-true, 16-mixed (with a gradient scaler), bf16-mixed,
            bf16-true, 16-true, 64-true, ...
        progress: show a progress bar.
        threads: torch intra-op threads of this process (null: torch's default, i.e. OMP_NUM_THREADS or
            every core). 1 is fastest for small federated batches; raise it for large models.
    """

    rounds: int = 50
    fraction: float = 1.0  # share of clients sampled per round, in (0, 1]
    clients_per_round: int | None = None  # a fixed count instead of a fraction
    eval_every: int = 10
    checkpoint_every: int = 1  # a killed run loses at most this many rounds (0: never checkpointed)
    accelerator: str = "auto"
    devices: int = 1  # devices per node; > 1 splits each round's clients across them (pfl.federation.distributed)
    processes_per_device: int = 1  # > 1: several processes share each device (pfl.runner.devices)
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    progress: bool = True
    # Small per-client batches gain nothing from intra-op parallelism and lose a lot when threads
    # contend for busy cores (docs/runs.md); set in-process, so `python -m pfl` is as fast as `make train`.
    threads: int | None = 1
    client_store: str = "memory"  # memory | disk (spills least recently used states beyond store_budget_mb)
    store_budget_mb: float = 2048.0
    vectorize: bool | str = "auto"  # auto | true | false (pfl.runner.training_path)
    compile: bool = False
    cuda_graphs: bool | str = "auto"  # auto | true | false (pfl.runner.training_path.use_graphs)


CLIENT_STORES = ("memory", "disk")
VECTORIZE_AUTO = "auto"
# Evaluation protocols by name (pfl.metrics.protocol_registry defines the built-ins and the decorator).
PROTOCOLS: Registry[Any] = Registry(
    "protocol",
    "eval.protocols",
    "pfl.metrics.protocol",
    builtins=("pfl.metrics.protocol_registry",),
    implementation=lambda entry: entry.measure,
)
S_TESTS = ("paper", "mixed")  # FedPG's S-test construction (pfl.metrics.protocols.s_test_indices)


@dataclass
class ClientConfig:
    """Local training on each client (SGD over the client's train split).

    Args:
        epochs: local epochs per round.
        batch_size: mini-batch size.
        lr: learning rate.
        momentum: SGD momentum (state is reset at each local update unless kept, below).
        weight_decay: L2 weight decay.
        drop_last: drop each epoch's last batch when it is incomplete (PyTorch's DataLoader
            drop_last, as the PGFed authors' code trains; a client smaller than one batch still
            trains on one batch of all its samples).
        keep_momentum: every method's main local fit (purpose "train") continues the client's SGD
            momentum from its previous participation instead of starting from zero (an optimizer
            kept per client across rounds, as in the PGFed authors' code). A method's own
            ``keep_momentum`` / ``client_momentum`` hyper-parameters take precedence.
        lr_decay: the learning rate of round t is lr · lr_decay^t (FedPG's papers: 0.999; 1 = constant).
    """

    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    drop_last: bool = False
    keep_momentum: bool = False
    lr_decay: float = 1.0


SERVER_OPTIMIZERS = ("sgd", "adam", "adagrad", "yogi")
# Robust aggregators by name (pfl.federation.robust defines the built-ins and the decorator).
AGGREGATORS: Registry[Any] = Registry(
    "aggregator",
    "server.aggregator",
    "pfl.federation.robust.aggregator",
    builtins=("pfl.federation.robust",),
    implementation=lambda entry: entry.rule,
)


@dataclass
class ServerConfig:
    """The server's robust aggregation of the uploads (pfl/federation/robust.py) and its optimizer on
    the pseudo-gradient (global − combined) of methods with a global model (pfl/federation/server_opt.py).

    Args:
        optimizer: sgd (FedAvgM with momentum), adam (FedAdam), adagrad (FedAdagrad) or yogi (FedYogi).
        lr: server learning rate η (sgd with lr 1 and momentum 0 is plain averaging).
        momentum: sgd momentum β₁ (FedAvgM: 0.9).
        beta1: first-moment decay of adam/adagrad/yogi.
        beta2: second-moment decay of adam/yogi.
        tau: adaptivity τ added to √v (Reddi et al.: 1e-3).
        aggregator: applied to the uploads before the method's weighted mean (methods whose server
            averages the uploaded models); mean leaves the method's own aggregation untouched
            (docs/methods.md, "Robust aggregation" and "Adding an aggregator").
        trim_beta: trimmed_mean's β: ⌊β·n⌋ of the n values of every coordinate are dropped at each end.
        krum_f: the number f of malicious uploads per round Krum and multi-Krum assume (n > 2f + 2).
        krum_m: how many uploads multi-Krum keeps (null: n − f).
        clip_quantile: norm_clip's q: every update (upload − global) longer than the q-quantile of the
            round's update norms is scaled down to that length.
    """

    optimizer: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    aggregator: str = "mean"
    trim_beta: float = 0.1
    krum_f: int = 1
    krum_m: int | None = None
    clip_quantile: float = 0.5


def validate_server(cfg: ServerConfig) -> None:
    require_choice(cfg.optimizer, SERVER_OPTIMIZERS, "server.optimizer", "optimizer")
    require(cfg.lr > 0 and cfg.lr < float("inf"), "server.lr", f"must be a finite number > 0 (got {cfg.lr})")
    require(0 <= cfg.momentum < 1, "server.momentum", f"must be in [0, 1) (got {cfg.momentum})")
    require(0 <= cfg.beta1 < 1, "server.beta1", f"must be in [0, 1) (got {cfg.beta1})")
    require(0 <= cfg.beta2 < 1, "server.beta2", f"must be in [0, 1) (got {cfg.beta2})")
    require(cfg.tau > 0, "server.tau", f"must be > 0 (got {cfg.tau})")
    AGGREGATORS.check(cfg.aggregator)
    require(0 <= cfg.trim_beta < 0.5, "server.trim_beta", f"must be in [0, 0.5) (got {cfg.trim_beta})")
    require(cfg.krum_f >= 0, "server.krum_f", f"must be >= 0 (got {cfg.krum_f})")
    if cfg.krum_m is not None:
        require(cfg.krum_m >= 1, "server.krum_m", f"must be >= 1, or null for n − krum_f (got {cfg.krum_m})")
    require(0 < cfg.clip_quantile <= 1, "server.clip_quantile", f"must be in (0, 1] (got {cfg.clip_quantile})")


ATTACKS = ("none", "gaussian", "scale")
ATTACK_SPACES = ("auto", "parameters", "update")
ATTACK_DEFAULT_SCALE = {"gaussian": 1.0, "scale": 100.0}


@dataclass
class AttackConfig:
    """Malicious clients (FedPG's robustness study, supplementary appendix B.3, Table 3); pfl/federation/attacks.py.

    Args:
        kind: none | gaussian (A1: a zero-mean Gaussian upload) | scale (A2: 100·(w_new − w) + w).
        fraction: share of the training clients that are malicious, chosen once from (seed, "attack").
        scale: A1's standard deviation σ (default 1.0; the paper gives none) or A2's factor (default 100,
            the paper's); null takes the kind's default.
        space: where A1 draws its noise: parameters (the uploaded model is replaced by N(0, σ²)), update
            (the uploaded model becomes w + N(0, σ²): a Gaussian pseudo-gradient), auto (update for
            methods that aggregate pseudo-gradients, e.g. FedPG and FedMGDA+, as the paper's "or
            gradients for gradient-based methods"; parameters for the others).
    """

    kind: str = "none"
    fraction: float = 0.1
    scale: float | None = None
    space: str = "auto"

    @property
    def magnitude(self) -> float:
        """σ of A1 or the factor of A2 (the configured scale, else the kind's default)."""
        return self.scale if self.scale is not None else ATTACK_DEFAULT_SCALE.get(self.kind, 0.0)


def validate_attack(a: AttackConfig) -> None:
    require_choice(a.kind, ATTACKS, "attack.kind", "attack")
    require_choice(a.space, ATTACK_SPACES, "attack.space", "space")
    require(0 <= a.fraction < 1, "attack.fraction", f"must be in [0, 1) (got {a.fraction})")
    if a.scale is not None:
        require(a.scale > 0 and a.scale < float("inf"), "attack.scale", f"must be a finite number > 0 (got {a.scale})")


SELECTS = ("final", "best_val", "best_test")
REFERENCES = ("none", "local")
PM_SOURCES = ("method", "local_update")


@dataclass
class EvalConfig:
    """What is measured and which round is reported (docs/metrics.md defines every key)."""

    batch_size: int = 4096
    target: float | None = None  # rounds_to_target: first evaluated round with pm.l_acc.mean >= target
    select: str = "final"  # reported round: final | best_val (needs data.val_frac > 0) | best_test
    # FedPG's S-test: paper = own test + the tests of (m-1)·c other clients, each the own test's size
    # (ρ = (m-1)·c > 1); mixed = own test + as many samples again spread over c of the others (ρ = 1).
    s_test: str = "paper"
    s_acc_others: float = 0.5  # c: share of the other clients mixed into the S-test (authors' code: half)
    new_client_epochs: int = 1  # fine-tuning epochs before held-out new clients are evaluated
    reference: str = "none"  # local: compare with a LOCAL run on the same split and seed (R-Acc, PTR, gain)
    pm_source: str = "method"  # local_update: the model trained this round, before aggregation (FedPG)
    # Registered protocols (pfl.config.PROTOCOLS; docs/metrics.md). local: P-models on their own test (and
    # validation); sg: FedPG's S- and G-tests; global: the global model on every client's test and the
    # global test set; new: held-out clients after adaptation; or the import path of one of your own.
    protocols: list[str] = field(default_factory=lambda: ["local", "global", "new"])


@dataclass
class TrackingConfig:
    """Where results go.

    Args:
        wandb: log to Weights & Biases (offline unless logged in); false disables it.
        project: W&B project name.
        root: directory under which each run gets its own folder.
        name: run folder name (default: <method>-<dataset>-s<seed>-<timestamp>); an existing run
            folder is refused unless the run is resumed (--resume) or overwrite is true.
        overwrite: replace an existing run folder of the same name: the old folder is moved to
            <root>/_replaced/<name>-<timestamp> once the new run's set-up has passed (never deleted).
        group: W&B group (default: the experiment, <dataset>-<clients>c-<partition>; sweeps: the sweep).
        tags: extra W&B tags (the method and the dataset are always tagged).
        job_type: W&B job type (fit; local sweeps: sweep).
    """

    wandb: bool = True
    project: str = "pfl"
    root: str = "runs"
    name: str | None = None
    overwrite: bool = False
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    job_type: str = "fit"


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
    server: ServerConfig = field(default_factory=ServerConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)


def validate(cfg: RunConfig) -> None:
    """Raise ConfigError naming the first invalid field. Runs before any data or model is built."""
    t, c = cfg.trainer, cfg.client
    check_finite(cfg)
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
    require(
        t.checkpoint_every >= 0,
        "trainer.checkpoint_every",
        f"must be >= 1, or 0 for no checkpoints (got {t.checkpoint_every})",
    )
    require_choice(t.accelerator, ACCELERATORS, "trainer.accelerator", "accelerator")
    require_choice(t.precision, PRECISIONS, "trainer.precision", "precision")
    require(
        not t.precision.startswith("transformer-engine") or transformer_engine_available(),
        "trainer.precision",
        f"{t.precision} needs NVIDIA's transformer_engine package, which is not installed",
        "install it (pip install 'transformer_engine>=0.11.0', CUDA only) or choose e.g. bf16-mixed or 16-mixed",
    )
    require_choice(t.client_store, CLIENT_STORES, "trainer.client_store", "store")
    require(t.store_budget_mb >= 0, "trainer.store_budget_mb", f"must be >= 0 (got {t.store_budget_mb})")
    require(t.devices >= 1, "trainer.devices", f"must be >= 1 (got {t.devices})")
    require(
        isinstance(t.vectorize, bool) or t.vectorize == VECTORIZE_AUTO,
        "trainer.vectorize",
        f"must be true, false or auto (got {t.vectorize!r})",
    )
    require(
        isinstance(t.cuda_graphs, bool) or t.cuda_graphs == VECTORIZE_AUTO,
        "trainer.cuda_graphs",
        f"must be true, false or auto (got {t.cuda_graphs!r})",
    )
    require(
        not (t.cuda_graphs is True and t.compile),
        "trainer.cuda_graphs",
        "cannot be combined with trainer.compile (the compiled step is not captured)",
        "set one of trainer.cuda_graphs and trainer.compile to false (auto captures only without compile)",
    )
    check_processes_per_device(t)
    check_accelerator(t)
    if t.threads is not None:
        require(t.threads >= 1, "trainer.threads", f"must be >= 1 or null (got {t.threads})", "null: torch's default")
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
    require(0 < c.lr_decay <= 1, "client.lr_decay", f"must be in (0, 1] (got {c.lr_decay})")
    validate_eval(cfg.eval)
    validate_attack(cfg.attack)
    validate_server(cfg.server)
    validate_data_config(cfg.data)
    check_model_config(cfg.model)
    cfg.method.check_run(cfg)  # the method's own checks against rounds, data, ...


def validate_eval(e: EvalConfig) -> None:
    require(e.batch_size >= 1, "eval.batch_size", f"must be >= 1 (got {e.batch_size})")
    if e.target is not None:  # the task's own range is checked once the data are loaded (validate_target)
        require(e.target >= 0, "eval.target", f"must be >= 0 (got {e.target})")
    for name, value, choices in (
        ("select", e.select, SELECTS),
        ("reference", e.reference, REFERENCES),
        ("pm_source", e.pm_source, PM_SOURCES),
        ("s_test", e.s_test, S_TESTS),
    ):
        require_choice(value, choices, f"eval.{name}")
    require(0 < e.s_acc_others <= 1, "eval.s_acc_others", f"must be in (0, 1] (got {e.s_acc_others})")
    for name in e.protocols:
        PROTOCOLS.check(name)
    require(
        "local" in e.protocols,
        "eval.protocols",
        "must include local (the P-models' own-test scores that select, target and reference use)",
        "e.g. [local, sg, global, new]",
    )
    require(e.new_client_epochs >= 0, "eval.new_client_epochs", f"must be >= 0 (got {e.new_client_epochs})")


def validate_target(e: EvalConfig, task: str) -> None:
    """``eval.target`` in the task's range: an accuracy in [0, 1] (classification), an MAE > 0 (regression)."""
    if e.target is None:
        return
    if task == "regression":
        require(e.target > 0, "eval.target", f"a regression target is an MAE and must be > 0 (got {e.target})")
    else:
        require(
            0 <= e.target <= 1,
            "eval.target",
            f"a classification target is an accuracy and must be in [0, 1] (got {e.target})",
            "e.g. 0.8 for 80 % mean personalized accuracy",
        )


def check_finite(cfg: RunConfig) -> None:
    """Every float of every group (nested groups and lists included) and of the method's
    hyper-parameters must be finite: jsonargparse reads ``1e400`` as inf and ``nan`` as NaN."""
    for group in fields(cfg):
        value = getattr(cfg, group.name)
        if group.name == "method":
            for key, hp in value.hparams().items():
                _require_finite(hp, f"method.{key}")
        else:
            _require_finite(value, group.name)


def _require_finite(value: Any, name: str) -> None:
    if is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            _require_finite(getattr(value, f.name), f"{name}.{f.name}")
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            _require_finite(item, f"{name}[{k}]")
    elif isinstance(value, float):
        require(math.isfinite(value), name, f"must be a finite number (got {value})")


def check_processes_per_device(t: TrainerConfig) -> None:
    """Several processes per device: a whole number, with the default strategy or ddp, on a CPU or CUDA."""
    k = t.processes_per_device
    require(
        isinstance(k, int) and not isinstance(k, bool) and k >= 1,
        "trainer.processes_per_device",
        f"must be a whole number >= 1 (got {k!r})",
    )
    if k > 1:
        require(
            t.accelerator != "mps",
            "trainer.processes_per_device",
            f"{k} processes cannot share an mps device (torch.distributed has no mps backend)",
            "use 1, or accelerator cpu or cuda",
        )


def check_accelerator(t: TrainerConfig) -> None:
    """An explicitly requested accelerator must exist here (``auto`` picks what there is)."""
    if t.accelerator in ("cuda", "gpu"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        require(
            count > 0,
            "trainer.accelerator",
            f"{t.accelerator} was asked for but torch {torch.__version__} sees no CUDA GPU on this machine",
            "use --trainer.accelerator auto or cpu",
        )
        require(
            t.devices <= count,
            "trainer.devices",
            f"{t.devices} GPUs per node asked for, {count} visible here",
            f"use --trainer.devices {count} or fewer",
        )
    elif t.accelerator == "mps":
        require(
            torch.backends.mps.is_available(),
            "trainer.accelerator",
            "mps was asked for but is not available on this machine",
            "use --trainer.accelerator auto or cpu",
        )
