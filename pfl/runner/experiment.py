"""Assemble a run from a validated RunConfig: data, Fabric, outputs, the LOCAL reference, the loop; then fit."""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L

from pfl.config import RunConfig, validate
from pfl.data import build_data
from pfl.data.ecosystem import dataset_label
from pfl.federation.loop import Callback, FederatedLoop
from pfl.methods import class_path
from pfl.runner.outputs import FileOutputs, RunFiles, run_dir_under
from pfl.runner.reference import ensure_local_reference
from pfl.runner.wandb_run import wandb_callback


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"seed": cfg.seed, "method": {"name": class_path(type(cfg.method)), **cfg.method.hparams()}}
    for group in ("trainer", "server", "client", "data", "model", "eval", "tracking", "attack"):
        out[group] = asdict(getattr(cfg, group))
    return out


def make_fabric(cfg: RunConfig) -> L.Fabric:
    t = cfg.trainer
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision.*")
        return L.Fabric(
            accelerator=t.accelerator,
            devices=t.devices,
            num_nodes=t.num_nodes,
            strategy=t.strategy,
            precision=t.precision,
        )


def run_name(cfg: RunConfig) -> str:
    if cfg.tracking.name:
        return cfg.tracking.name
    return f"{cfg.method.name}-{dataset_label(cfg.data.source)}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_experiment(
    cfg: RunConfig,
    config_text: str | None = None,
    resume_dir: Path | None = None,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) one experiment; returns the summary also written to ``summary.json``."""
    validate(cfg)
    data = build_data(cfg.data, cfg.seed)
    fabric = make_fabric(cfg)
    # Several processes (trainer.devices / num_nodes): fabric.launch() starts the other local ranks
    # (or joins the ones torchrun/SLURM started). Only rank 0 writes files and logs.
    fabric.launch()
    if resume_dir is not None:
        run_dir = resume_dir
    run_dir = fabric.broadcast(run_dir or run_dir_under(cfg.tracking.root, run_name(cfg)))  # one name on every rank
    callbacks: list[Callback] = []
    if fabric.is_global_zero:
        files = RunFiles(run_dir)
        if config_text is not None:
            files.write_config(config_text)
        callbacks.append(FileOutputs(files))
        if cfg.tracking.wandb:
            callbacks.append(wandb_callback(cfg, run_dir, flat_config(cfg), resume=resume_dir is not None))
    loop = FederatedLoop(cfg, data, run_dir if fabric.is_global_zero else None, fabric, callbacks)
    if resume_dir is not None:
        loop.resume(resume_dir)
    if cfg.eval.reference == "local" and cfg.method.name != "local" and loop.evals.reference is None:
        loop.evals.reference = ensure_local_reference(cfg, data, fabric)
    summary = loop.fit()
    summary["run_dir"] = str(run_dir)
    return summary
