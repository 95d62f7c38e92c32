"""The plan of a run: every value derived from a validated RunConfig and its data, and every check
that needs the data (a resume's checkpoint included), made before anything is built.

``plan_run`` reads but never builds or writes; ``pfl.runner.assembly.build_loop`` builds a loop from
the plan alone. A run is therefore ``validate(cfg)`` -> ``plan_run(cfg, data)`` -> build -> fit, each
once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pfl.config import RunConfig, validate_target
from pfl.data.federated import FederatedData
from pfl.engine.stacked import net_problems
from pfl.engine.trainer import TrainSettings, task_of
from pfl.errors import ConfigError
from pfl.federation.checkpoint import (
    CHECKPOINT,
    Checkpoint,
    CheckpointChain,
    check_values,
    recorded_settings,
)
from pfl.federation.robust import RobustRule
from pfl.methods import class_path
from pfl.methods.base import Method
from pfl.metrics.protocols import s_test_clients
from pfl.models import check_model_builds, structure_model
from pfl.runner.args import RESUME_ALLOWED, check_resume_progress, check_resume_without_checkpoint
from pfl.runner.training_path import require_vectorizable


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"seed": cfg.seed, "method": {"name": class_path(type(cfg.method)), **cfg.method.hparams()}}
    for group in ("trainer", "server", "client", "data", "model", "eval", "tracking", "attack"):
        out[group] = asdict(getattr(cfg, group))
    return out


# Settings a resume may change (RESUME_ALLOWED), and where the data is read from (a run folder copied to
# another machine reads the same data elsewhere): everything else shapes the state a checkpoint holds.
_NOT_RECORDED = ("tracking.", "data.root", "data.download")


def run_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings a checkpoint records (``Checkpointer.settings``): ``flat_config`` flattened to
    ``group.key`` with plain values, less what a resume may change."""
    flat = json.loads(json.dumps(flat_config(cfg), default=str))
    out: dict[str, Any] = {}
    pending = [("", flat)]
    while pending:
        prefix, tree = pending.pop()
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                pending.append((f"{prefix}{key}.", value))
            else:
                out[f"{prefix}{key}"] = value
    return {k: out[k] for k in sorted(out) if k not in RESUME_ALLOWED and not k.startswith(_NOT_RECORDED)}


def check_recorded_settings(run_dir: Path, settings: dict[str, Any]) -> None:
    """A resume of ``run_dir`` with other settings than its checkpoint records (config.yaml edited
    since) is refused in one line naming the first field that differs, before anything is built."""
    recorded = recorded_settings(run_dir)
    if recorded is None:  # a checkpoint of an earlier version of pfl records none
        return
    # Only settings both know: an option added or removed by another version of pfl is no edit.
    differ = [k for k in sorted(recorded) if k in settings and recorded[k] != settings[k]]
    if differ:
        key = differ[0]
        more = f" (and {len(differ) - 1} more: {', '.join(differ[1:4])})" if len(differ) > 1 else ""
        raise ConfigError(
            "--resume",
            f"{run_dir / 'config.yaml'} sets {key} to {settings.get(key)!r} but its checkpoint was written with "
            f"{recorded.get(key)!r}{more}",
            f"put {key} back to {recorded.get(key)!r} in config.yaml to resume, or start a new run for the new setting",
        )


def clients_per_round(cfg: RunConfig, num_clients: int) -> int:
    """Clients sampled per round out of the ``num_clients`` that train (held-out new clients excluded)."""
    if cfg.trainer.clients_per_round is not None:
        return min(cfg.trainer.clients_per_round, num_clients)
    return max(1, int(round(cfg.trainer.fraction * num_clients)))


def train_settings(client: Any, method: Method, augment: str = "none") -> TrainSettings:
    """The local-training settings of a run: the ``client`` config group, with the method's own
    ``client_momentum`` / ``keep_momentum`` taking precedence where it sets them (``augment``: the
    data setting's training-batch augmentation)."""
    momentum = client.momentum if method.client_momentum is None else method.client_momentum
    keep = client.keep_momentum if method.keep_momentum is None else method.keep_momentum
    return TrainSettings(
        epochs=client.epochs,
        batch_size=client.batch_size,
        lr=client.lr,
        momentum=momentum,
        weight_decay=client.weight_decay,
        augment=augment,
        drop_last=client.drop_last,
        keep_momentum=bool(keep),
        lr_decay=client.lr_decay,
    )


def checkpoint_identity(run_dir: Path) -> tuple[int, int] | None:
    """The newest checkpoint file's (inode, mtime): another process that advances the run changes it."""
    try:
        st = (run_dir / CHECKPOINT).stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


@dataclass(frozen=True)
class Resumption:
    """What a resume continues: the run folder, its checkpoint chain (the next link extends it), the
    newest readable checkpoint (None: the folder has none, and the run starts from round 0), and the
    identity of the checkpoint file when it was read (``checkpoint_identity``)."""

    run_dir: Path
    chain: CheckpointChain
    checkpoint: Checkpoint | None
    identity: tuple[int, int] | None

    @property
    def rounds_done(self) -> int:
        return 0 if self.checkpoint is None else int(self.checkpoint.values["round"])


@dataclass(frozen=True)
class RunPlan:
    """A run, decided: its config and data, and what follows from them.

    ``settings``: the clients' local-training settings; ``clients_per_round``: clients sampled a
    round; ``robust_rule``: the server's robust rule (``server.aggregator``), checked against the method and the
    clients per round; ``recorded``: the settings every checkpoint records; ``resume``: the
    checkpoint a resume continues (None for a new run); ``finished``: a resumed run that already
    has all its rounds and its summary (nothing is left to do)."""

    cfg: RunConfig
    data: FederatedData
    settings: TrainSettings
    clients_per_round: int
    robust_rule: RobustRule
    recorded: dict[str, Any]
    resume: Resumption | None = None
    finished: bool = False

    @property
    def start_round(self) -> int:
        return 0 if self.resume is None else self.resume.rounds_done


def read_resumption(run_dir: Path) -> Resumption:
    """The newest readable checkpoint of ``run_dir`` (damaged links reported and skipped)."""
    identity = checkpoint_identity(run_dir)
    chain = CheckpointChain(run_dir)
    return Resumption(run_dir, chain, chain.load(check=check_values), identity)


def plan_run(cfg: RunConfig, data: FederatedData, resume_dir: Path | None = None) -> RunPlan:
    """The plan of the validated ``cfg`` on ``data``; with ``resume_dir`` the resume of that run: its
    recorded settings compared with ``cfg`` and its checkpoint read and checked against
    ``trainer.rounds``. Raises every error the data or the checkpoint reveal; builds nothing."""
    recorded = run_settings(cfg)
    if resume_dir is not None:
        check_recorded_settings(resume_dir, recorded)
    validate_target(cfg.eval, task_of(data))
    if "sg" in cfg.eval.protocols and cfg.eval.s_test == "paper":
        s_test_clients(data.num_clients, cfg.eval.s_acc_others)  # ρ = (m - 1)·c > 1, before any training
    check_model_builds(cfg.model, data.input_shape, data.num_classes)
    per_round = clients_per_round(cfg, data.num_clients)
    robust_rule = RobustRule.build(cfg.server, cfg.method, per_round)
    if cfg.trainer.vectorize is True:  # refused now, not by build_loop, when the method or the model says so
        net = structure_model(cfg.model, data.input_shape, data.num_classes)
        require_vectorizable(cfg.method.vectorize_problems() + net_problems(net, cfg.trainer.precision))
    resume, finished = None, False
    if resume_dir is not None:
        resume = read_resumption(Path(resume_dir))
        if resume.checkpoint is None:
            finished = check_resume_without_checkpoint(resume.run_dir, cfg.trainer.rounds)
        else:
            finished = check_resume_progress(resume.run_dir, resume.rounds_done, cfg.trainer.rounds)
    return RunPlan(
        cfg=cfg,
        data=data,
        settings=train_settings(cfg.client, cfg.method, cfg.data.augment),  # client.*, with the method's overrides
        clients_per_round=per_round,
        robust_rule=robust_rule,
        recorded=recorded,
        resume=resume,
        finished=finished,
    )


__all__ = [
    "Resumption",
    "RunPlan",
    "check_recorded_settings",
    "checkpoint_identity",
    "clients_per_round",
    "flat_config",
    "plan_run",
    "read_resumption",
    "run_settings",
    "train_settings",
]
