"""Shared test helpers: tiny, fast federations built from the real config objects."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pfl.config import ClientConfig, RunConfig, TrackingConfig, TrainerConfig
from pfl.data import DataConfig, build_data
from pfl.federation.loop import FederatedLoop
from pfl.methods import method_class
from pfl.models import ModelConfig
from pfl.runner.assembly import build_loop
from pfl.runner.plan import plan_run
from pfl.runner.reference import ensure_local_reference

os.environ.setdefault("WANDB_MODE", "disabled")


def tiny_config(method: str = "fedavg", method_args: dict[str, Any] | None = None, **groups: Any) -> RunConfig:
    """A 6-client digits federation trained for 3 rounds; ``groups`` override whole groups or
    single fields as ``trainer={"rounds": 5}``."""
    cfg = RunConfig(
        method=method_class(method)(**(method_args or {})),
        seed=groups.pop("seed", 0),
        trainer=TrainerConfig(rounds=3, eval_every=1, checkpoint_every=1, progress=False),
        client=ClientConfig(epochs=1, batch_size=16, lr=0.1),
        data=DataConfig(source="digits", num_clients=6, alpha=0.5, min_samples=20),
        model=ModelConfig(name="mlp", hidden=[32]),
        tracking=TrackingConfig(wandb=False),
    )
    for group, value in groups.items():
        current = getattr(cfg, group)
        setattr(cfg, group, replace(current, **value) if isinstance(value, dict) else value)
    return cfg


def make_loop(cfg: RunConfig, **kwargs: Any) -> FederatedLoop:
    """The loop as ``run_experiment`` assembles it (LOCAL reference included), without files
    unless ``kwargs`` give ``build_loop`` a ``run_dir``."""
    data = build_data(cfg.data, cfg.seed)
    reference = None
    if cfg.eval.reference == "local" and cfg.method.name != "local":
        reference = ensure_local_reference(cfg, data, None)
    return build_loop(plan_run(cfg, data), reference=reference, **kwargs)


@pytest.fixture
def tiny():
    return tiny_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-round run through the command line, made once per test module; tests copy it."""
    from tests.helpers.cli_runs import fit

    root = tmp_path_factory.mktemp("finished")
    assert fit(root, "done") == 0
    return root / "done"


@pytest.fixture
def wandb_init_kwargs(monkeypatch) -> dict[str, Any]:
    """``wandb.init`` replaced by one that records its keyword arguments here and then raises
    ``RuntimeError("stop here")``, so a test sees what pfl asks of W&B without starting a run."""
    import wandb

    seen: dict[str, Any] = {}

    def fake_init(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(wandb, "init", fake_init)
    return seen
