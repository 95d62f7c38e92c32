"""Run folders for the report's table: summaries (and configs) with known numbers, two methods x three seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml


def write_run(
    root: Path, name: str, method: str, metrics: dict, select: str = "final", config: dict | None = None
) -> Path:
    run = root / name
    run.mkdir()
    summary = {"method": method, "select": select, "metrics": metrics}
    if config is not None:
        summary.update(seed=config["seed"], hparams={k: v for k, v in config["method"].items() if k != "name"})
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def config(method: str, seed: int, root: Path, name: str, **method_args) -> dict:
    """A resolved config as `fit` writes it: the seed and tracking differ between repeats."""
    return {
        "seed": seed,
        "method": {"name": method, **method_args},
        "client": {"lr": 0.1, "epochs": 5},
        "data": {"source": "digits", "alpha": 0.5},
        "trainer": {"rounds": 10, "progress": False, "checkpoint_every": 1},
        "tracking": {"root": str(root), "name": name, "wandb": False},
    }


# Two methods x three seeds; sample std (ddof = 1) of 0.7, 0.8, 0.9 is exactly 0.1.
SEEDS = {
    "fedavg": {"pm.l_acc": [0.7, 0.8, 0.9], "rounds_to_target": [20, 30, 40]},
    "ditto": {"pm.l_acc": [0.6, 0.6, 0.9], "rounds_to_target": [10, 20, 30]},
}


def two_methods_three_seeds(root: Path) -> list[Path]:
    runs = []
    for method, series in SEEDS.items():
        for seed in range(3):
            name = f"{method}-s{seed}"
            metrics = {
                "pm.l_acc.mean": series["pm.l_acc"][seed],
                "pm.l_acc.std": 0.05,
                "rounds_to_target": series["rounds_to_target"][seed],
            }
            runs.append(write_run(root, name, method, metrics, config=config(method, seed, root, name)))
    return runs


def sample_std(values: list[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def latex_rows(tex: str) -> list[str]:
    body = tex.split("\\midrule")[1].split("\\bottomrule")[0]
    return [line for line in body.strip().splitlines()]
