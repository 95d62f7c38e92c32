"""Tables of finished runs (one row per run) from their summary.json files."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_METRICS = ("pm.l_acc.mean", "pm.l_acc.std", "gm.acc")


def print_report(run_dirs: list[Path], metrics: tuple[str, ...] = DEFAULT_METRICS) -> None:
    rows = []
    for d in run_dirs:
        s = json.loads((Path(d) / "summary.json").read_text())
        rows.append(
            [Path(d).name, s["method"], json.dumps(s["hparams"])] + [_cell(s["metrics"].get(m)) for m in metrics]
        )
    header = ["run", "method", "hparams", *metrics]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
