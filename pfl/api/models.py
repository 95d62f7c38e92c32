"""The trained models of a finished run, read back from its checkpoint: ``Run.model()`` (the global model) and
``Run.personal_model(cid)`` (client ``cid``'s P-model, as the run's evaluation scored it).

The run is rebuilt on the CPU from its config.yaml (data, model, method: what ``--resume`` builds) and its
newest checkpoint is restored into it; the model comes back as the config's network, on the CPU, in eval
mode, holding the trained weights. Nothing in the run folder is written.
"""

from __future__ import annotations

import operator
from pathlib import Path

from torch import Tensor, nn

from pfl.config import RunConfig
from pfl.data import build_data
from pfl.errors import ConfigError
from pfl.federation.loop import FederatedLoop
from pfl.models import build_model
from pfl.runner.args import parse_fit_args
from pfl.runner.assembly import build_loop
from pfl.runner.plan import plan_run

# Where the rebuilt run lives: one process, the CPU, nothing logged.
CPU_ONLY = [
    "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "1",
    "--trainer.strategy", "auto", "--trainer.progress", "false", "--tracking.wandb", "false",
]  # fmt: skip


def restored_loop(run_dir: Path) -> tuple[RunConfig, FederatedLoop]:
    """The run of ``run_dir`` rebuilt on the CPU with its newest checkpoint restored."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ConfigError(str(config), "not found: the models are rebuilt from the run's config", "pass a run folder")
    cfg, _, _, _ = parse_fit_args(["--config", str(config), *CPU_ONLY])
    plan = plan_run(cfg, build_data(cfg.data, cfg.seed), resume_dir=run_dir)
    if plan.resume is None or plan.resume.checkpoint is None:
        raise ConfigError(
            str(run_dir),
            "has no checkpoint to read the trained models from",
            "run it with trainer.checkpoint_every >= 1 (0 writes none)",
        )
    return cfg, build_loop(plan)


def as_module(cfg: RunConfig, loop: FederatedLoop, state: Tensor) -> nn.Module:
    """A new network of the run's architecture holding ``state`` (the flat vector of parameters and buffers)."""
    worker = loop.worker
    worker.flat.load(state)
    net = build_model(cfg.model, worker.data.input_shape, worker.data.num_classes)
    net.load_state_dict(worker.module.net.state_dict())
    return net.cpu().eval()


def global_model(run_dir: Path) -> nn.Module:
    cfg, loop = restored_loop(run_dir)
    if not loop.method.has_global_model:
        raise ConfigError("model()", f"method {loop.method.name!r} trains no global model", "use personal_model(cid)")
    return as_module(cfg, loop, loop.method.global_state(loop.server))


def personal_model(run_dir: Path, cid: int) -> nn.Module:
    cfg, loop = restored_loop(run_dir)
    n = loop.server.num_clients
    try:
        index: int | None = operator.index(cid)
    except TypeError:  # not an integer
        index = None
    if index is None or not 0 <= index < n:
        raise ConfigError("cid", f"must be a client id in [0, {n - 1}], got {cid!r}", "clients are numbered from 0")
    return as_module(cfg, loop, loop.method.personal_state(loop.server, loop.peek_client(index)))
