"""Paper claims the reproduction suite checks: one module per paper, each defining ``CLAIMS``.

A claim names the runs (method arguments on a shared base configuration) and a check over their
summaries that says whether the paper's statement held on pfl's embedded analogue.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Summaries = dict[str, dict[str, Any]]


@dataclass
class Claim:
    key: str
    paper: str
    statement: str
    base: list[str]
    runs: dict[str, list[str]]
    check: Callable[[Summaries], tuple[bool, str]]
    winner: str | None = None  # the run the claim is about (highlighted in the plot)
    metrics: tuple[str, ...] = ("pm.l_acc", "pm.l_acc.top5", "pm.l_acc.bottom5", "gain", "r_acc.mean", "ptr")

    def methods(self) -> set[str]:
        return {args[args.index("--method.name") + 1] for args in self.runs.values() if "--method.name" in args}


def best_by(metric: str, winner: str) -> Callable[[Summaries], tuple[bool, str]]:
    def check(s: Summaries) -> tuple[bool, str]:
        scores = {label: s[label]["metrics"][metric] for label in s}
        best = max(scores, key=scores.__getitem__)
        others = max((v for k, v in scores.items() if k != winner), default=float("-inf"))
        held = best == winner
        return held, f"{winner}: {scores[winner]:.4f} vs best other {others:.4f} ({metric}); best is {best}"

    return check


def method_args(name: str, *extra: str) -> list[str]:
    return ["--method.name", name, *extra]


def all_claims() -> list[Claim]:
    """Every claim of every paper module, in module order."""
    claims: list[Claim] = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        claims += importlib.import_module(f"{__package__}.{info.name}").CLAIMS
    return claims
