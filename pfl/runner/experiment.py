"""Assemble a run from a validated RunConfig: data, Fabric, outputs, the LOCAL reference, the loop; then fit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import torch

from pfl.config import RunConfig, validate, validate_target
from pfl.data import build_data
from pfl.data.ecosystem import dataset_label
from pfl.engine.worker import task_of
from pfl.errors import ConfigError
from pfl.federation.checkpoint import CHECKPOINT, recorded_settings
from pfl.federation.loop import Callback
from pfl.methods import class_path
from pfl.metrics.protocols import s_test_clients
from pfl.runner.args import RESUME_ALLOWED, check_resume_progress, parse_fit_args
from pfl.runner.assembly import build_loop
from pfl.runner.devices import make_fabric
from pfl.runner.outputs import FileOutputs, RunFiles, run_dir_under
from pfl.runner.reference import ensure_local_reference
from pfl.runner.rundir import RunClaim, check_writable, precheck
from pfl.runner.wandb_run import wandb_callback


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


def run_name(cfg: RunConfig) -> str:
    if cfg.tracking.name:
        return cfg.tracking.name
    return f"{cfg.method.name}-{dataset_label(cfg.data.source)}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op threads for this process (None: leave torch's default); returns the previous count."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    return previous


def run_argv(argv: list[str]) -> dict[str, Any]:
    """``python -m pfl fit ARGV`` without its printing: parse and validate ``argv``, then run (or resume)
    the experiment; returns the summary (``run_dir`` its folder)."""
    cfg, ns, parser, resume_dir = parse_fit_args(argv)
    return run_experiment(cfg, parser.dump(ns), resume_dir=resume_dir)


def run_experiment(
    cfg: RunConfig,
    config_text: str | None = None,
    resume_dir: Path | None = None,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) one experiment; returns the summary also written to ``summary.json``.

    Order (docs/runs.md): validate and build everything (data, devices, model, the resumed state)
    while writing nothing; then claim the run folder (created, locked, an old one moved aside when
    overwriting); then build the LOCAL reference, start W&B, write config.yaml and train. A resume of a
    run that has already finished its rounds returns its summary with ``already_finished`` and touches
    nothing.
    """
    previous_threads = apply_threads(cfg.trainer.threads)
    callers_group = _group_initialized()  # a group the caller made before the run is theirs to keep
    try:
        return _run(cfg, config_text, resume_dir, run_dir)
    finally:
        torch.set_num_threads(previous_threads)
        if not callers_group and _group_initialized():
            # The run's own group (fabric.launch) is destroyed while Python is fully alive: left to
            # interpreter shutdown, gloo's worker threads can be destroyed still joinable and a
            # finished rank aborts ("terminate called without an active exception").
            torch.distributed.destroy_process_group()


def _group_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _run(cfg: RunConfig, config_text: str | None, resume_dir: Path | None, run_dir: Path | None) -> dict[str, Any]:
    validate(cfg)
    settings = run_settings(cfg)
    if resume_dir is not None:
        check_recorded_settings(resume_dir, settings)
    data = build_data(cfg.data, cfg.seed)
    validate_target(cfg.eval, task_of(data))
    if "sg" in cfg.eval.protocols and cfg.eval.s_test == "paper":
        s_test_clients(data.num_clients, cfg.eval.s_acc_others)  # ρ = (m - 1)·c > 1, before any training
    fabric = make_fabric(cfg.trainer)
    # Several processes (trainer.devices / num_nodes): fabric.launch() starts the other local ranks
    # (or joins the ones torchrun/SLURM started). Only rank 0 touches the run folder and logs.
    fabric.launch()
    resume = resume_dir is not None
    auto_name = not resume and run_dir is None and not cfg.tracking.name
    if resume:
        run_dir = resume_dir
    run_dir = fabric.broadcast(run_dir or run_dir_under(cfg.tracking.root, run_name(cfg)))  # one name on every rank
    overwrite = cfg.tracking.overwrite and not resume  # a resume never moves anything
    _on_rank_zero(fabric, lambda: precheck(run_dir, resume=resume, overwrite=overwrite, auto_name=auto_name))
    loop = build_loop(cfg, data, None, fabric)  # builds the model: a bad one fails before any file exists
    loop.checkpointer.settings = settings
    seen = None
    if resume:
        seen = _checkpoint_identity(run_dir)
        loop.resume(run_dir)
        if check_resume_progress(run_dir, loop.round, cfg.trainer.rounds):
            summary = json.loads((run_dir / "summary.json").read_text())
            return {**summary, "run_dir": str(run_dir), "already_finished": True}
        _on_rank_zero(fabric, lambda: check_writable(run_dir))
    claim = RunClaim(run_dir, Path(cfg.tracking.root), resume=resume, overwrite=overwrite, auto_name=auto_name)
    _on_rank_zero(fabric, claim.acquire)
    try:
        run_dir = fabric.broadcast(claim.dir)
        if resume:
            _on_rank_zero(fabric, lambda: _require_unchanged(run_dir, seen))
        if cfg.eval.reference == "local" and cfg.method.name != "local" and loop.evals.reference is None:
            loop.evals.reference = ensure_local_reference(cfg, data, fabric)
        if fabric.is_global_zero:
            loop.run_dir = run_dir
            loop.callbacks = [*loop.callbacks, *_outputs(cfg, run_dir, config_text, resume)]
        summary = loop.fit()
    except BaseException:
        if fabric.is_global_zero:
            claim.release(failed=True)  # removes a folder it created that holds no result yet
        raise
    if fabric.is_global_zero:
        claim.release()
    summary["run_dir"] = str(run_dir)
    if claim.replaced is not None:
        summary["replaced"] = str(claim.replaced)
    return summary


def _outputs(cfg: RunConfig, run_dir: Path, config_text: str | None, resumed: bool) -> list[Callback]:
    """Rank 0's output callbacks; writes config.yaml (only when it changes, atomically). W&B is
    started first: when it cannot start, nothing has been written and the new folder is removed."""
    files = RunFiles(run_dir)
    callbacks: list[Callback] = [FileOutputs(files)]
    if cfg.tracking.wandb:
        tracker = wandb_callback(cfg, run_dir, flat_config(cfg), resume=resumed)
        tracker.start()
        callbacks.append(tracker)
    if config_text is not None:
        path = run_dir / "config.yaml"
        if not path.exists() or path.read_text() != config_text:
            files.write_config(config_text)
    return callbacks


def _on_rank_zero(fabric: L.Fabric, step: Callable[[], Any]) -> None:
    """Run ``step`` on rank 0; a ConfigError there is raised on every rank (no rank waits forever)."""
    error = None
    if fabric.is_global_zero:
        try:
            step()
        except ConfigError as err:
            error = err
    if fabric.world_size > 1:
        error = fabric.broadcast(error)
    if error is not None:
        raise error


def _checkpoint_identity(run_dir: Path) -> tuple[int, int] | None:
    try:
        st = (run_dir / CHECKPOINT).stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _require_unchanged(run_dir: Path, seen: tuple[int, int] | None) -> None:
    """The checkpoint read before the lock was taken is still the newest one (no other process
    advanced the run in between)."""
    if _checkpoint_identity(run_dir) != seen:
        raise ConfigError(
            "--resume",
            f"{run_dir} changed while this resume was loading it (another process continued the run)",
            "check that run, then resume again",
        )
