"""The paper-reproduction suite: the small-scale, embedded-data analogue of each paper's headline
comparison, run on CPU, written to ``reproduce/REPORT.md`` with tables, plots and a verdict per claim.

A claim lists its runs (label -> fit arguments on top of a shared base) and a check on their
summaries. Claims whose methods are not registered are listed as not run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pfl.errors import ConfigError
from pfl.methods import methods
from pfl.metrics.protocols import reference_metrics
from pfl.metrics.report import build_table, load_config, render
from pfl.runner.args import parse_fit_args
from pfl.runner.claims import Summaries, all_claims
from pfl.runner.sweep import run_parallel


def run_claims(
    out: Path, only: list[str] | None = None, quick: bool = False, workers: int = 1, reuse: bool = False
) -> Path:
    """Run the claims (``quick``: 10 % of the rounds, for smoke tests) in ``workers`` processes and
    write ``out/REPORT.md``. ``reuse`` keeps runs that already have a summary (an interrupted suite
    continues where it stopped)."""

    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    sections = ["# Reproduction report", "", f"Generated {time.strftime('%Y-%m-%d %H:%M')} on CPU, embedded data.", ""]
    for claim in all_claims():
        if only and claim.key not in only:
            continue
        missing = claim.methods() - set(methods())
        sections += [f"## {claim.paper}: {claim.key}", "", f"Claim: {claim.statement}.", ""]
        if missing:
            sections += [f"Not run: methods not available yet: {', '.join(sorted(missing))}.", ""]
            continue
        jobs = {}
        for label, args in claim.runs.items():
            argv = [*claim.base, *args, "--tracking.root", str(out / claim.key), "--tracking.name", label]
            # The suite regenerates its runs: an earlier one of the same label is moved aside, not refused.
            argv += ["--trainer.progress", "false", "--tracking.overwrite", "true"]
            if quick:
                rounds = parse_fit_args(argv)[0].trainer.rounds // 10 or 1
                argv += ["--trainer.rounds", str(rounds), "--trainer.eval_every", str(rounds)]
            parse_fit_args(argv)  # every run's configuration is checked before the first one starts
            if not (reuse and (out / claim.key / label / "summary.json").exists()):
                jobs[label] = ["fit", *argv]
        t0, started = time.perf_counter(), time.time()
        print(f"{claim.key}: {len(jobs)} runs to do, {len(claim.runs) - len(jobs)} reused", flush=True)
        try:
            run_parallel(jobs, workers, what=claim.key)
        except ConfigError as err:  # the failed runs are named in the report; the others still count
            failures.append(str(err))
        minutes = (time.perf_counter() - t0) / 60
        done = [label for label in claim.runs if _finished(out / claim.key / label, label in jobs, started)]
        summaries: Summaries = {
            label: json.loads((out / claim.key / label / "summary.json").read_text()) for label in done
        }
        failed = [label for label in claim.runs if label not in summaries]
        if failed:
            sections += [f"Failed (left out of the table and the check): {', '.join(failed)}.", ""]
        if not summaries:
            continue
        for label, summary in summaries.items():  # checks may read a run's files (clients.csv)
            summary.setdefault("run_dir", str(out / claim.key / label))
        if "local" in summaries:
            add_gain_over_local(summaries, out / claim.key)
            sections += [
                "Gain, R-Acc and PTR are per client against the suite's own `local` run (same split, seed).",
                "",
            ]
        try:
            held, detail = claim.check(summaries)
        except KeyError as missing:  # a run the check compares failed
            held, detail = False, f"not decidable: the run {missing} has no result"
        # Settings from each run's config.yaml: runs of a claim may differ where a summary does not say
        # (attack.*), and grouping them as seeds of one setting would average a clean and an attacked run.
        configs = [load_config(out / claim.key / label) for label in summaries]
        header, rows, best = build_table(list(summaries.values()), list(summaries), list(claim.metrics), configs)
        sections += render(header, rows, best).splitlines()
        title = f"{claim.paper}: {claim.key} (held: {'yes' if held else 'no'})"
        plot = _bar_plot(summaries, "pm.l_acc.mean", out / f"{claim.key}.png", claim.winner, title)
        sections += ["", f"![{claim.key}]({plot.name})", "", f"**Held: {'yes' if held else 'no'}** — {detail}."]
        timing = f"{len(jobs)} run, {minutes:.1f} min with {workers} worker(s)" if jobs else "no new run"
        sections += ["", f"({len(summaries)} runs: {timing}; {len(summaries) - len(jobs)} reused)", ""]
    report = out / "REPORT.md"
    report.write_text("\n".join(sections) + "\n")
    if failures:
        raise ConfigError("reproduce", f"{'; '.join(failures)} (left out of {report})")
    return report


def _finished(run_dir: Path, rerun: bool, started: float) -> bool:
    """The run has a result of this suite: reused, or written since ``started`` (not a stale one
    left by an earlier suite when this run failed)."""
    path = run_dir / "summary.json"
    return path.exists() and (not rerun or path.stat().st_mtime >= started)


def add_gain_over_local(summaries: Summaries, root: Path) -> None:
    """Add gain.{mean,std}, r_acc.mean and ptr of every run's P-models against the ``local`` run,
    client by client from the runs' clients.csv (all runs share the split and the seed)."""
    import csv

    def per_client(label: str) -> list[float]:
        with open(root / label / "clients.csv") as fh:
            return [float(row["pm.l_acc"]) for row in csv.DictReader(fh)]

    reference = per_client("local")
    for label, summary in summaries.items():
        comp = reference_metrics(per_client(label), reference)
        summary["metrics"].update(
            {
                "gain.mean": comp["gain.mean"],
                "gain.std": comp["gain.std"],
                "r_acc.mean": comp["r.mean"],
                "ptr": comp["ptr"],
            }
        )


def _bar_plot(
    summaries: Summaries, metric: str, path: Path, highlight: str | None = None, title: str | None = None
) -> Path:
    """Bars of ``metric`` per run with ± std over clients; the axis spans every error bar (an
    accuracy's mean + std may pass 1.0, which the bar must show, not cut)."""
    from pfl.metrics.plots import plt, save_figure

    labels = list(summaries)
    means = [summaries[k]["metrics"].get(metric, 0.0) for k in labels]
    stds = [summaries[k]["metrics"].get(metric.replace(".mean", ".std"), 0.0) for k in labels]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(labels)), 3.5))
    colors = ["tab:orange" if k == highlight else "tab:blue" for k in labels]
    ax.bar(labels, means, yerr=stds, capsize=3, color=colors)
    low = min(m - s for m, s in zip(means, stds, strict=True))
    high = max(m + s for m, s in zip(means, stds, strict=True))
    ax.set_ylim(max(0.0, low - 0.05), high + 0.02)
    ax.set_ylabel(f"{metric} (± std over clients)")
    ax.set_xlabel("run")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(axis="x", rotation=60)
    save_figure(fig, path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pfl reproduce", description="Run the paper-reproduction suite.")
    parser.add_argument("--out", type=Path, default=Path("reproduce"))
    parser.add_argument(
        "--only", nargs="*", default=None, help=f"claims to run: {', '.join(c.key for c in all_claims())}"
    )
    parser.add_argument("--quick", action="store_true", help="10%% of the rounds (smoke test, not a reproduction)")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (cores are split between them)")
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished (continue a suite)")
    args = parser.parse_args(argv)
    print(run_claims(args.out, args.only, args.quick, args.workers, args.reuse))
