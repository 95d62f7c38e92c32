"""The LOCAL reference behind R-Acc, PTR and gain: a `local` run on the same split and seed.

It is cached under ``<tracking.root>/_reference/local-<key>/`` where the key hashes everything the
LOCAL result depends on (data config, model, client training settings, participation, rounds, the
evaluation schedule and seed); a later run with the same key reuses it instead of training again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import lightning as L

from pfl.config import RunConfig
from pfl.methods.local import Local
from pfl.runner.assembly import build_loop
from pfl.runner.devices import make_fabric
from pfl.runner.outputs import FileOutputs, RunFiles
from pfl.runner.plan import plan_run
from pfl.safe_files import new_file

REFERENCE_DIR = "_reference"


def reference_key(cfg: RunConfig) -> str:
    """A stable hash of what a LOCAL run's per-client results depend on."""
    t = cfg.trainer
    identity = {
        "data": asdict(cfg.data),
        "model": asdict(cfg.model),
        "client": asdict(cfg.client),
        "trainer": {
            "rounds": t.rounds,
            "fraction": t.fraction,
            "clients_per_round": t.clients_per_round,
            "eval_every": t.eval_every,
            "precision": t.precision,
        },
        "select": cfg.eval.select,
        "seed": cfg.seed,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def reference_dir(cfg: RunConfig) -> Path:
    return Path(cfg.tracking.root) / REFERENCE_DIR / f"local-{reference_key(cfg)}"


def load_reference(path: Path) -> dict[str, Any] | None:
    file = path / "reference.json"
    return json.loads(file.read_text()) if file.exists() else None


def ensure_local_reference(cfg: RunConfig, data, fabric: L.Fabric | None) -> dict[str, Any]:
    """The cached LOCAL reference for ``cfg``, running it first when there is none.

    Returns ``{"method", "key", "dir", "reused", "round", "metric", "values"}`` where ``values`` are the
    per-client own-test scores of LOCAL's reported round.
    """
    path = reference_dir(cfg)
    found = load_reference(path)
    if found is not None:
        return {**found, "reused": True}
    ref_cfg = replace(
        cfg,
        method=Local(),
        eval=replace(cfg.eval, reference="none", target=None, pm_source="method"),
        tracking=replace(cfg.tracking, wandb=False, name=path.name),
        trainer=replace(cfg.trainer, progress=False),
    )
    # A fabric without loggers: the reference's curves must not land in this run's W&B run.
    ref_fabric = None
    if fabric is not None:
        ref_fabric = make_fabric(cfg.trainer)
    plan = plan_run(ref_cfg, data)
    loop = build_loop(plan, ref_fabric, path, [FileOutputs(RunFiles(path))], spill_dir=path, announce_path=False)
    summary = loop.fit()
    metric = loop.own_key
    record = {
        "method": "local",
        "key": reference_key(cfg),
        "dir": str(path),
        "round": summary["selected_round"],
        "metric": metric,
        "values": [row[metric] for row in loop.selected_rows],
    }
    # Atomic: parallel sweep runs may build the same reference; a reader never sees half a file.
    tmp = path / f"reference.json.{os.getpid()}.tmp"
    with new_file(tmp) as fh:  # never through a link planted at that name
        fh.write(json.dumps(record, indent=2).encode())
    os.replace(tmp, path / "reference.json")
    return {**record, "reused": False}
