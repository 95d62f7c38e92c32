"""pfl.fit on the tiny default experiment: the config file, the small overrides, one fit in a run folder."""

from __future__ import annotations

from pathlib import Path

import pfl

ROOT = Path(__file__).resolve().parents[2]


CONFIG = str(ROOT / "conf" / "default.yaml")


TINY = {
    "data": {"num_clients": 5},
    "trainer": {"rounds": 2, "eval_every": 1, "progress": False},
    "model": {"hidden": [16]},
    "tracking": {"wandb": False},
}


def tiny_fit(tmp_path: Path, name: str, **overrides) -> pfl.Run:
    tracking = {**TINY["tracking"], "root": str(tmp_path), "name": name}
    return pfl.fit(CONFIG, **{**TINY, "tracking": tracking, **overrides})
