"""Run an experiment: validate the RunConfig, plan it on its data (``pfl.runner.plan``), claim the run
folder, then build the loop complete (outputs and the LOCAL reference included) and fit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from pfl.config import RunConfig, validate
from pfl.data import build_data
from pfl.data.ecosystem import dataset_label
from pfl.errors import ConfigError
from pfl.federation.loop import Callback
from pfl.runner.args import parse_fit_args
from pfl.runner.assembly import build_loop
from pfl.runner.devices import make_fabric
from pfl.runner.outputs import FileOutputs, RunFiles, run_dir_under
from pfl.runner.plan import checkpoint_identity, flat_config, plan_run
from pfl.runner.reference import ensure_local_reference
from pfl.runner.rundir import RunClaim, check_writable, precheck
from pfl.runner.wandb_run import wandb_callback


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
    cfg, ns, parser, resume_dir = parse_fit_args(argv)  # validated there
    return _run_validated(cfg, parser.dump(ns), resume_dir=resume_dir)


def run_experiment(
    cfg: RunConfig,
    config_text: str | None = None,
    resume_dir: Path | None = None,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) one experiment; returns the summary also written to ``summary.json``.

    Order (docs/runs.md): validate and plan (data, every check they need, the resumed checkpoint read)
    while writing nothing; then claim the run folder (created, locked, an old one moved aside when
    overwriting); then build the LOCAL reference and the loop, start W&B, write config.yaml and train. A resume of a
    run that has already finished its rounds returns its summary with ``already_finished`` and touches
    nothing.
    """
    validate(cfg)
    return _run_validated(cfg, config_text, resume_dir, run_dir)


def _run_validated(
    cfg: RunConfig, config_text: str | None = None, resume_dir: Path | None = None, run_dir: Path | None = None
) -> dict[str, Any]:
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
    plan = plan_run(cfg, build_data(cfg.data, cfg.seed), resume_dir)  # every check the data and a resume need
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
    if plan.finished:
        summary = json.loads((run_dir / "summary.json").read_text())
        return {**summary, "run_dir": str(run_dir), "already_finished": True}
    if resume:
        _on_rank_zero(fabric, lambda: check_writable(run_dir))
    claim = RunClaim(run_dir, Path(cfg.tracking.root), resume=resume, overwrite=overwrite, auto_name=auto_name)
    _on_rank_zero(fabric, claim.acquire)
    try:
        run_dir = fabric.broadcast(claim.dir)
        if plan.resume is not None:
            seen = plan.resume.identity
            _on_rank_zero(fabric, lambda: _require_unchanged(run_dir, seen))
        reference = None
        if cfg.eval.reference == "local" and cfg.method.name != "local":
            reference = ensure_local_reference(cfg, plan.data, fabric)
        outputs = _Outputs(cfg, run_dir, config_text, resume) if fabric.is_global_zero else None
        # Only rank 0 writes checkpoints and outputs. The model is built before anything is written:
        # a model that cannot be built leaves the run folder as the claim found it.
        loop = build_loop(
            plan,
            fabric,
            None if outputs is None else run_dir,
            [] if outputs is None else outputs.callbacks,
            reference,
        )
        if outputs is not None:
            outputs.start()
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


class _Outputs:
    """Rank 0's output callbacks (files, W&B); ``start`` begins them: W&B first (when it cannot start,
    nothing has been written and a new folder is removed), then config.yaml (written only when it
    changes, atomically)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, config_text: str | None, resumed: bool):
        self.files = RunFiles(run_dir)
        self.config_text = config_text
        self.tracker = wandb_callback(cfg, run_dir, flat_config(cfg), resume=resumed) if cfg.tracking.wandb else None
        self.callbacks: list[Callback] = [FileOutputs(self.files)]
        if self.tracker is not None:
            self.callbacks.append(self.tracker)

    def start(self) -> None:
        if self.tracker is not None:
            self.tracker.start()
        if self.config_text is not None:
            path = self.files.dir / "config.yaml"
            if not path.exists() or path.read_text() != self.config_text:
                self.files.write_config(self.config_text)


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


def _require_unchanged(run_dir: Path, seen: tuple[int, int] | None) -> None:
    """The checkpoint read before the lock was taken is still the newest one (no other process
    advanced the run in between)."""
    if checkpoint_identity(run_dir) != seen:
        raise ConfigError(
            "--resume",
            f"{run_dir} changed while this resume was loading it (another process continued the run)",
            "check that run, then resume again",
        )
