"""Paper claims the reproduction suite checks: one module per paper, each defining ``CLAIMS``.

A claim names the runs (method arguments on a shared base configuration), the seeds each run is
repeated over, and its check: ``contrasts`` turns the runs' summaries into paired per-seed
differences (positive = in the paper's favour) and ``verdict`` decides each one from its spread
over the seeds (held / not held / tie; the rule is documented in docs/reproduce.md).
"""

from __future__ import annotations

import csv
import importlib
import math
import pkgutil
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pfl.errors import ConfigError, require

Summaries = dict[str, dict[str, Any]]  # label -> a run's summary.json (with "run_dir" set)
SeedSummaries = dict[int, Summaries]  # seed -> label -> summary

HELD, NOT_HELD, TIE = "held", "not held", "tie"
RESULT_FIX = "remove the run's folder to run it again, or restore the file"  # a run's file that is not what it wrote


@dataclass(frozen=True)
class Contrast:
    """One paired comparison of a claim: ``diffs[seed]`` is the difference on that seed's runs, positive
    in the paper's favour (winner - baseline, or value - threshold); the claim needs ``diffs > margin``."""

    name: str
    diffs: dict[int, float]
    margin: float = 0.0
    note: str = ""

    @property
    def excess(self) -> list[float]:
        """The per-seed differences beyond the margin, in seed order."""
        return [self.diffs[s] - self.margin for s in sorted(self.diffs)]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.excess) if self.diffs else math.nan

    @property
    def spread(self) -> float:
        """Sample standard deviation of the per-seed differences (0 for one seed)."""
        return statistics.stdev(self.excess) if len(self.diffs) > 1 else 0.0

    @property
    def indicative(self) -> bool:
        """Fewer than two seeds: there is no spread to judge the difference against."""
        return len(self.diffs) < 2


def verdict(contrast: Contrast) -> str:
    """``held`` when the mean excess over the margin is positive by more than its sample std over seeds
    and every seed's excess is positive; ``not held`` when the mean excess is below minus that std;
    ``tie`` otherwise (the difference is within the seed spread), and for a contrast no seed could
    compute or whose difference is not finite. With one seed the sign decides (marked indicative)."""
    excess = contrast.excess
    if not excess or not all(math.isfinite(x) for x in excess):
        return TIE
    mean, spread = contrast.mean, contrast.spread
    if mean > spread and min(excess) > 0:
        return HELD
    if mean < -spread:
        return NOT_HELD
    return TIE


def claim_verdict(contrasts: Iterable[Contrast]) -> str:
    """Held when every contrast is held, not held when any is not held, else tie (also for none)."""
    verdicts = [verdict(c) for c in contrasts]
    if not verdicts:
        return TIE
    if NOT_HELD in verdicts:
        return NOT_HELD
    return HELD if all(v == HELD for v in verdicts) else TIE


def verdict_text(contrast: Contrast) -> str:
    """The verdict, marked when it rests on one seed."""
    return verdict(contrast) + (" (indicative, 1 seed)" if contrast.indicative else "")


@dataclass(frozen=True)
class LrGrid:
    """An optional stage before the claim's runs: each label in ``labels`` (all when empty) is run on the
    first seed for ``rounds`` rounds with every ``values`` learning rate (``arg``), and its full runs use
    the one with the highest ``metric`` (a validation metric: the base configuration needs a validation
    split, data.val_frac > 0)."""

    values: tuple[float, ...]
    labels: tuple[str, ...] = ()
    rounds: int = 20
    metric: str = "pm.val_acc.mean"
    arg: str = "--client.lr"

    def applies(self, label: str) -> bool:
        return not self.labels or label in self.labels


@dataclass
class Claim:
    key: str
    paper: str
    statement: str
    base: list[str]
    runs: dict[str, list[str]]
    contrasts: Callable[[SeedSummaries], list[Contrast]]
    winner: str | None = None  # the run the claim is about (highlighted in the plot)
    metrics: tuple[str, ...] = ("pm.l_acc", "pm.l_acc.top5", "pm.l_acc.bottom5", "gain", "r_acc.mean", "ptr")
    seeds: tuple[int, ...] = (0, 1, 2)
    diagnose: Callable[[SeedSummaries], list[str]] | None = None  # measured causes under not held / tie
    lr_grid: LrGrid | None = None
    plot_metric: str = "pm.l_acc.mean"
    notes: Callable[[SeedSummaries], list[str]] | None = None  # flags printed under the table (any verdict)
    partial: bool = False  # only some of the claim's runs (``only_runs``): its verdict covers their contrasts

    def methods(self) -> set[str]:
        return {args[args.index("--method.name") + 1] for args in self.runs.values() if "--method.name" in args}


def only_runs(claim: Claim, labels: Iterable[str]) -> Claim | None:
    """``claim`` restricted to its runs among ``labels`` (None when it has none of them): their lr grids and
    seeds run, and only the contrasts with a result on some seed are reported (those between runs that ran)."""
    wanted = set(labels)  # once: ``labels`` may be a one-pass iterator
    kept = {label: argv for label, argv in claim.runs.items() if label in wanted}
    if not kept:
        return None
    full = claim.contrasts

    def contrasts(s: SeedSummaries) -> list[Contrast]:
        return [c for c in full(s) if c.diffs]

    return replace(claim, runs=kept, contrasts=contrasts, partial=True)


def method_args(name: str, *extra: str) -> list[str]:
    return ["--method.name", name, *extra]


def value(s: SeedSummaries, seed: int, label: str, key: str) -> float:
    """A metric of one run: ``key`` itself or its ``.mean``."""
    metrics = s[seed][label]["metrics"]
    return float(metrics[key] if key in metrics else metrics[f"{key}.mean"])


def seed_mean(s: SeedSummaries, label: str, key: str) -> float | None:
    """``key`` of run ``label`` (as ``value`` reads it) averaged over the seeds whose run reports it; None when
    none does."""
    values = [
        value(s, seed, label, key)
        for seed in s
        if label in s[seed] and ({key, f"{key}.mean"} & s[seed][label]["metrics"].keys())
    ]
    return statistics.fmean(values) if values else None


def paired(s: SeedSummaries, a: str, b: str, key: str) -> dict[int, float]:
    """``key`` of run ``a`` minus run ``b``, per seed that has both runs."""
    return {seed: value(s, seed, a, key) - value(s, seed, b, key) for seed in s if a in s[seed] and b in s[seed]}


def above(s: SeedSummaries, label: str, key: str, threshold: float) -> dict[int, float]:
    """``key`` of run ``label`` minus a fixed threshold, per seed that has the run."""
    return {seed: value(s, seed, label, key) - threshold for seed in s if label in s[seed]}


def client_rows(run_dir: Path) -> list[dict[str, str]]:
    """The run's clients.csv (a row per client of the reported round, which every run writes), refused in
    one line naming the file when it is missing or is not a CSV table with a ``client`` column of ids."""
    path = run_dir / "clients.csv"
    require(path.is_file(), str(path), "missing: every run writes its table of clients", RESULT_FIX)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows, columns = list(reader), reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(str(path), f"not a run's table of clients ({err})", RESULT_FIX) from None
    ids = "client" in columns and all(str(r["client"]).isdigit() for r in rows)
    require(ids, str(path), "not a run's table of clients (a client column of client ids)", RESULT_FIX)
    return rows


def client_scores(summary: dict, key: str) -> dict[int, float]:
    """Each client's ``key`` in the run's clients.csv, by client id in the file's order (by id)."""
    rows = client_rows(Path(summary["run_dir"]))
    try:
        return {int(r["client"]): float(r[key]) for r in rows}
    except (KeyError, TypeError, ValueError):
        path = Path(summary["run_dir"]) / "clients.csv"
        raise ConfigError(str(path), f"has no number in its {key!r} column for every client", RESULT_FIX) from None


def client_pairs(run: dict, reference: dict, key: str) -> list[tuple[float, float]]:
    """``(run's, reference's)`` ``key`` of every client, in the reference's order; refused in one line when
    the two runs did not evaluate the same clients (runs of one seed share the split)."""
    mine, theirs = client_scores(run, key), client_scores(reference, key)
    require(mine.keys() == theirs.keys(), str(Path(run["run_dir"]) / "clients.csv"),
            f"its clients are not those of {Path(reference['run_dir']) / 'clients.csv'}", RESULT_FIX)  # fmt: skip
    return [(mine[c], theirs[c]) for c in theirs]


def beats(winner: str, baselines: Iterable[str], key: str, margin: float = 0.0) -> Callable[[SeedSummaries], list]:
    """Contrasts ``winner - baseline`` on ``key`` for every baseline (the paired per-seed difference)."""
    baselines = list(baselines)

    def contrasts(s: SeedSummaries) -> list[Contrast]:
        return [Contrast(f"{winner} - {b} ({key})", paired(s, winner, b, key), margin) for b in baselines]

    return contrasts


def standing(winner: str, key: str) -> Callable[[SeedSummaries], list[str]]:
    """A diagnosis: ``winner``'s rank on ``key`` (mean over seeds) and the runs at or above it."""

    def sentences(s: SeedSummaries) -> list[str]:
        labels = dict.fromkeys(label for runs in s.values() for label in runs)
        means = {}
        for label in labels:
            values = [value(s, seed, label, key) for seed in s if label in s[seed]]
            means[label] = statistics.fmean(values)
        if winner not in means:
            return [f"{winner} has no finished run."]
        ahead = sorted((k for k in means if k != winner and means[k] >= means[winner]), key=means.__getitem__)
        rank = 1 + len(ahead)
        text = ", ".join(f"{k} {means[k]:.4f}" for k in reversed(ahead)) or "none"
        where = f"{winner} {means[winner]:.4f} ranks {rank} of {len(means)}"
        return [f"{key} (mean over seeds): {where}; at or above it: {text}."]

    return sentences


def all_claims() -> list[Claim]:
    """Every claim of every paper module, in module order."""
    claims: list[Claim] = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        claims += importlib.import_module(f"{__package__}.{info.name}").CLAIMS
    return claims
