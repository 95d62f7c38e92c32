"""The paper-reproduction suite: the small-scale, embedded-data analogue of each paper's headline
comparison, run on CPU over several seeds, written to ``reproduce/REPORT.md`` with tables (mean ± std
over seeds), paired per-seed differences, a verdict per claim (held / not held / tie) and plots.

Every run of a claim is repeated on each of its seeds, in ``<out>/<claim>/<label>/s<seed>``. A claim
with an ``lr_grid`` first picks each run's learning rate on validation from short runs on its first
seed (``<out>/<claim>/_lr/<label>/lr<value>``). Claims whose methods are not registered are listed
as not run. How verdicts are decided: docs/reproduce.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pfl import numeric_platform
from pfl.config import RunConfig
from pfl.errors import EXIT_DIVERGED, ConfigError, require
from pfl.methods import methods
from pfl.metrics.compare_plots import clients_figure, curve_figure, plot_groups
from pfl.metrics.plots import save_figure
from pfl.metrics.protocols import reference_metrics
from pfl.metrics.report import build_table, flatten, load_config, render
from pfl.runner.args import parse_fit_args
from pfl.runner.claims import (
    RESULT_FIX,
    Claim,
    Contrast,
    SeedSummaries,
    all_claims,
    claim_verdict,
    client_pairs,
    client_rows,
    only_runs,
    verdict_text,
)
from pfl.runner.fit_help import method_defaults
from pfl.runner.reproduce_options import check_runs, check_suite_options, parse_args
from pfl.runner.rundir import check_creatable
from pfl.runner.suite_estimate import Planned, device_label, estimate, evaluations, split_of
from pfl.runner.sweep import run_parallel
from pfl.runner.warm_workers import WorkerPool
from pfl.safe_files import write_atomic

QUICK_SHARE = 10  # QUICK runs 1/10 of each run's rounds, on the first seed only
LR_DIR = "_lr"
UNSTABLE = "unstable.json"  # in <claim>/_lr/: label -> the chosen lrs at which one of its claim runs diverged
RUN_FLAGS = ["--trainer.progress", "false", "--tracking.overwrite", "true"]


def checkpoint_flags(keep: bool) -> list[str]:
    """The suite regenerates its runs (an interrupted suite re-runs the unfinished ones from round 0 with
    --reuse) and no verdict reads a checkpoint, so by default its runs write none (a pFedMe run's left
    114 MB, a whole suite tens of GB). ``keep``: each run checkpoints as the Python API's ``Run.model()``
    needs, as often as costs ~5 % of a run (PAGE's 100 replay buffers made it 40 % every round)."""
    return ["--trainer.checkpoint_every", "1000000" if keep else "0"]


@dataclass
class Job:
    """One run of the suite: a claim's label on one seed (or one lr of its grid)."""

    claim: str
    label: str
    seed: int
    argv: list[str]
    run_dir: Path
    name: str  # in the progress lines and seconds.json: the run folder under the suite's
    chosen: tuple[str, float] | None = None  # the grid's choice: (config key, lr), as config.yaml records it

    def done(self) -> bool:
        """It has a summary, trained with the lr the grid chose (a label whose lr was changed after a
        divergence, ``UNSTABLE``, may have seeds of the earlier lr left by a stopped suite)."""
        if not (self.run_dir / "summary.json").exists():
            return False
        return self.chosen is None or recorded_value(self.run_dir, self.chosen[0]) == self.chosen[1]


_CONFIG_READ_ERRORS = (OSError, UnicodeDecodeError, yaml.YAMLError)  # what reading a run's config.yaml raises


def recorded_value(run_dir: Path, key: str) -> object:
    """``key`` (dotted) of the run's config.yaml; None when the file is missing or unreadable."""
    try:
        config = load_config(run_dir)
    except _CONFIG_READ_ERRORS:
        return None
    return flatten(config).get(key) if isinstance(config, dict) else None


def check_reused_runs(folder: Path) -> None:
    """Every run result under a claim's ``folder`` that ``--reuse`` may read (its ``summary.json`` with the
    ``config.yaml`` and ``clients.csv`` beside it) is read now, before any run starts: one that is not what a
    run writes is refused in one line naming the file, not found by the report after the runs have gone."""
    for path in sorted(folder.rglob("summary.json")):
        summary = _json(path, "a run's summary", RESULT_FIX)
        ok = isinstance(summary, dict) and isinstance(summary.get("metrics"), dict)
        require(ok, str(path), "not a run's summary (a JSON object with its metrics)", RESULT_FIX)
        try:
            config = load_config(path.parent)
        except _CONFIG_READ_ERRORS as err:
            reason = " ".join(str(err).split())  # a YAML error spans lines: the refusal is one
            raise ConfigError(
                str(path.parent / "config.yaml"), f"not a run's configuration ({reason})", RESULT_FIX
            ) from None
        require(config is None or isinstance(config, dict), str(path.parent / "config.yaml"),
                "not a run's configuration (a mapping of its settings)", RESULT_FIX)  # fmt: skip
        client_rows(path.parent)


def run_dir(out: Path, claim: str, label: str, seed: int) -> Path:
    return out / claim / label / f"s{seed}"


def shortened(argv: list[str], rounds: int) -> list[str]:
    """``argv`` cut to ``rounds`` rounds, evaluated at the last one."""
    return [*argv, "--trainer.rounds", str(rounds), "--trainer.eval_every", str(rounds)]


class Configs:
    """The suite's parsing of run arguments: each method's parser built once, each argv parsed once (a
    full suite parses every run's configuration before the first starts, and its report reads some
    again: hundreds of parses, each as costly as building a parser)."""

    def __init__(self) -> None:
        self.parsers: dict = {}
        self.parsed: dict[tuple[str, ...], RunConfig] = {}

    def config(self, argv: list[str]) -> RunConfig:
        """``parse_fit_args(argv)``'s validated configuration (raises its ConfigError)."""
        key = tuple(argv)
        if key not in self.parsed:
            self.parsed[key] = parse_fit_args(argv, self.parsers)[0]
        return self.parsed[key]


def quick_rounds(argv: list[str], configs: Configs | None = None) -> int:
    return max(1, (configs or Configs()).config(argv).trainer.rounds // QUICK_SHARE)


def claim_jobs(
    claim: Claim,
    out: Path,
    quick: bool,
    lrs: dict[str, float] | None = None,
    configs: Configs | None = None,
    check: bool = True,
) -> list[Job]:
    """The claim's runs, seed by seed (every label of the first seed, then of the next: a suite stopped
    part-way has whole seeds, each a complete paired comparison); QUICK: the first seed, 1/10 of the
    rounds. ``lrs`` are the learning rates the grid chose (label -> lr). Every label's configuration is
    parsed here, before anything runs, on the first seed: a later seed's arguments differ only in
    ``--seed`` and the run's folder, both made here (``configs``: the suite's parses, kept; ``check``
    false: not parsed, for a caller that only plans)."""
    configs = configs or Configs()
    seeds = claim.seeds[:1] if quick else claim.seeds
    require(bool(seeds), f"{claim.key}.seeds", "a claim needs at least one seed")
    jobs = []
    for seed in seeds:
        check = check and seed == seeds[0]
        for label, args in claim.runs.items():
            chosen = [claim.lr_grid.arg, str(lrs[label])] if lrs and label in lrs and claim.lr_grid else []
            setting = (claim.lr_grid.arg.removeprefix("--"), float(chosen[1])) if chosen else None
            where = run_dir(out, claim.key, label, seed)
            argv = [*claim.base, *args, *chosen, "--seed", str(seed)]
            argv += ["--tracking.root", str(where.parent), "--tracking.name", where.name, *RUN_FLAGS]
            if quick:
                argv = shortened(argv, quick_rounds(argv, configs))
            if check:
                configs.config(argv)
            jobs.append(Job(claim.key, label, seed, ["fit", *argv], where, f"{claim.key}/{label}/s{seed}", setting))
    return jobs


def grid_jobs(
    claim: Claim, out: Path, edge: dict[str, float] | None = None, configs: Configs | None = None
) -> list[Job]:
    """The lr-grid stage's short runs on the claim's first seed (none without a grid); ``edge``: instead,
    the one extra lr of each label whose choice sat on the grid's edge (``beyond_edge``)."""
    configs = configs or Configs()
    grid = claim.lr_grid
    if grid is None:
        return []
    seed, jobs = claim.seeds[0], []
    for label, args in claim.runs.items():
        if not grid.applies(label) or (edge is not None and label not in edge):
            continue
        for lr in grid.values if edge is None else (edge[label],):
            where = out / claim.key / LR_DIR / label / f"lr{lr:g}"
            argv = [*claim.base, *args, grid.arg, str(lr), "--seed", str(seed)]
            argv = shortened([*argv, "--tracking.root", str(where.parent), "--tracking.name", where.name, *RUN_FLAGS],
                             grid.rounds)  # fmt: skip
            cfg = configs.config(argv)
            require(
                cfg.data.val_frac > 0,
                f"{claim.key}.lr_grid",
                "the learning rate is chosen on validation, and the base configuration has none",
                "add --data.val_frac (e.g. 0.1) to the claim's base",
            )
            name = f"{claim.key}/{LR_DIR}/{label}/{where.name}"
            jobs.append(Job(claim.key, label, seed, ["fit", *argv], where, name))
    return jobs


def beyond_edge(values: tuple[float, ...], lr: float) -> float | None:
    """The grid's next value past ``lr`` when ``lr`` is its smallest or largest value (the ratio to its
    neighbour once more: 0.1 in 0.01, 0.05, 0.1 gives 0.2; 0.01 gives 0.002); None inside the grid or
    for a grid of one value (no direction to extend in)."""
    ordered = sorted(values)
    if len(ordered) < 2 or lr not in (ordered[0], ordered[-1]):
        return None
    step = ordered[-1] / ordered[-2] if lr == ordered[-1] else ordered[0] / ordered[1]
    return float(f"{lr * step:.6g}")


def edge_steps(claim: Claim, chosen: dict[str, float]) -> dict[str, float]:
    """label -> the extra lr of each label whose chosen lr sits on the grid's edge."""
    grid = claim.lr_grid
    if grid is None:
        return {}
    steps = {label: beyond_edge(grid.values, lr) for label, lr in chosen.items()}
    return {label: lr for label, lr in steps.items() if lr is not None}


def choose_lrs(
    claim: Claim,
    out: Path,
    finished: set[Path],
    edge: dict[str, float] | None = None,
    unstable: dict[str, list[float]] | None = None,
) -> tuple[dict[str, float], list[str]]:
    """label -> the grid lr with the highest validation metric (the first of equals), and the report's
    lines saying what each lr scored. ``finished``: the folders of the grid runs with a result of this
    suite (``_finished_jobs``); a label none of whose grid runs finished keeps its configured lr.
    ``edge``: each label's extra lr one step past the grid's edge (``edge_steps``), chosen among the others.
    ``unstable``: label -> lrs at which one of its claim runs diverged (``unstable_lrs``), not chosen: the next is."""
    edge = edge or {}
    grid = claim.lr_grid
    if grid is None:
        return {}, []
    unstable = unstable or {}
    chosen: dict[str, float] = {}
    lines = [f"Learning rate chosen on validation (`{grid.metric}` after {grid.rounds} rounds, seed "
             f"{claim.seeds[0]}) from {', '.join(f'{v:g}' for v in grid.values)}:", ""]  # fmt: skip
    for label in claim.runs:
        if not grid.applies(label):
            continue
        scores = {}
        for lr in [*grid.values, *([edge[label]] if label in edge else [])]:
            where = out / claim.key / LR_DIR / label / f"lr{lr:g}"
            if where in finished:
                score = json.loads((where / "summary.json").read_text())["metrics"].get(grid.metric)
                if score is not None and math.isfinite(score):
                    scores[lr] = score
        text = ", ".join(f"{lr:g}: {v:.4f}" for lr, v in scores.items()) or "no grid run finished"
        if label in edge:
            text += f"; {edge[label]:g} added: the grid's choice was on its edge"
        for lr in unstable.get(label, []):
            scores.pop(lr, None)
            text += f"; {lr:g} left out: a run of the claim diverged at it"
        if scores:
            chosen[label] = max(scores, key=scores.__getitem__)
            lines.append(f"- {label}: **{chosen[label]:g}** ({text})")
        else:
            lines.append(f"- {label}: the configured lr ({text})")
    return chosen, [*lines, ""]


def unstable_lrs(claim: Claim, out: Path) -> dict[str, list[float]]:
    """label -> the lrs the grid chose at which one of the label's claim runs diverged (``UNSTABLE``)."""
    path = out / claim.key / LR_DIR / UNSTABLE
    value = _read_json(path, {})
    for label, lrs in value.items():
        require(isinstance(lrs, list) and all(isinstance(v, float) for v in lrs), str(path),
                f"{label!r} is not a list of learning rates", "remove or restore it")  # fmt: skip
    return value


def mark_unstable(claim: Claim, out: Path, label: str, lr: float) -> None:
    value = unstable_lrs(claim, out)
    value[label] = sorted({*value.get(label, []), lr})
    _write_json(out / claim.key / LR_DIR / UNSTABLE, value)


def next_lrs(
    claim: Claim, out: Path, finished: set[Path], edge: dict[str, float], diverged: dict[str, float]
) -> set[str]:
    """The labels whose chosen lr (``diverged``: label -> lr) diverged on a seed and that have another
    finished grid lr: that lr is recorded as unstable (``mark_unstable``), so ``choose_lrs`` takes the next.
    A label with none keeps its lr and its diverged run."""
    moved = set()
    for label, lr in diverged.items():
        unstable = unstable_lrs(claim, out)
        unstable[label] = [*unstable.get(label, []), lr]
        if label in choose_lrs(claim, out, finished, edge, unstable)[0]:
            mark_unstable(claim, out, label, lr)
            moved.add(label)
    return moved


def run_claims(
    out: Path,
    only: list[str] | None = None,
    quick: bool = False,
    workers: int = 1,
    reuse: bool = False,
    accelerator: str = "auto",
    fresh: bool = False,
    keep_checkpoints: bool = False,
    pool: WorkerPool | None = None,
    runs: list[str] | None = None,
) -> Path:
    """Run the claims over their seeds in ``workers`` processes and write ``out/REPORT.md``. ``quick``:
    the first seed and 1/10 of the rounds, no lr grid (a smoke test: every verdict is indicative).
    ``reuse`` keeps runs that already have a summary (an interrupted suite continues where it stopped).
    ``accelerator``: every run's ``trainer.accelerator`` (auto: a GPU when there is one; cpu: the
    machine's cores, one run per worker). ``fresh``: a new process per run instead of warm workers
    (``pfl.runner.warm_workers``). ``keep_checkpoints``: each run leaves its final checkpoint (``checkpoint_flags``).
    The warm workers serve every phase (lr grid, its edge steps, the claims' runs) and end with the suite, or
    wait in ``pool`` when one is given (several suites in one session). ``runs``: only these labels of the
    claims (``only_runs``: a partial table of each claim that has any of them)."""
    every = all_claims()
    check_suite_options([c.key for c in every], only, workers, accelerator)
    check_runs(every, only, runs)
    check_creatable(out, "--out")
    claims = [c for c in every if not only or c.key in only]
    if runs:
        claims = [p for p in (only_runs(c, runs) for c in claims) if p is not None]
    settings = (quick, workers, reuse, accelerator, fresh, keep_checkpoints)
    if pool is not None:
        return _run_claims(out, claims, *settings, pool)
    with WorkerPool() as own:
        return _run_claims(out, claims, *settings, own)


def _run_claims(
    out: Path,
    claims: list[Claim],
    quick: bool,
    workers: int,
    reuse: bool,
    accelerator: str,
    fresh: bool,
    keep_checkpoints: bool,
    pool: WorkerPool,
) -> Path:
    """``run_claims`` for the checked ``claims``, its runs in ``pool``'s warm workers."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    ready = [c for c in claims if not c.methods() - set(methods())]
    failures: list[str] = []
    diverged: list[str] = []
    times = RunTimes(out, workers, device=device_label(accelerator))
    if reuse:
        for c in ready:
            check_reused_runs(out / c.key)
    on = ["--trainer.accelerator", accelerator, *checkpoint_flags(keep_checkpoints)]
    launch = functools.partial(
        _run, workers=workers, reuse=reuse, times=times, failures=failures, diverged=diverged, extra=on, fresh=fresh,
        pool=pool,
    )  # fmt: skip

    # Every run's configuration is checked before the first one starts (the chosen lrs are grid values).
    configs = Configs()
    print(f"checking the runs' configurations of {len(ready)} claim(s) before any run starts", flush=True)
    checking = time.perf_counter()
    grids = {c.key: [] if quick else grid_jobs(c, out, configs=configs) for c in ready}
    jobs = {c.key: claim_jobs(c, out, quick, configs=configs) for c in ready}
    print(f"{len(configs.parsed)} configurations checked in {time.perf_counter() - checking:.0f} s", flush=True)
    started = time.time()
    ran = launch([j for c in ready for j in grids[c.key]], "lr grid")
    ran_here = set(ran)  # every phase's runs that this invocation trained (the report's count)
    grid_done = {key: _finished_jobs(grid, started, ran) for key, grid in grids.items()}
    # A choice on the grid's edge may lie past it: one more lr in that direction, and the choice again.
    edges = {c.key: edge_steps(c, choose_lrs(c, out, {j.run_dir for j in grid_done[c.key]})[0]) for c in ready}
    beyond = {c.key: grid_jobs(c, out, edges[c.key], configs) if edges[c.key] else [] for c in ready}
    started = time.time()
    ran = launch([j for c in ready for j in beyond[c.key]], "lr grid edge")
    ran_here |= ran
    grid_lines: dict[str, list[str]] = {}
    for c in ready:
        grid_done[c.key] += _finished_jobs(beyond[c.key], started, ran)
        if grids[c.key]:  # the claim's runs again, with the chosen learning rates
            done_dirs = {j.run_dir for j in grid_done[c.key]}
            chosen, grid_lines[c.key] = choose_lrs(c, out, done_dirs, edges[c.key], unstable_lrs(c, out))
            jobs[c.key] = claim_jobs(c, out, quick, chosen, configs)
    started = time.time()
    seen = len(diverged)
    ran = launch([j for c in ready for j in jobs[c.key]], "reproduce")
    # A label's verdict needs every seed at one lr: where the grid's choice diverged on a seed, that lr is
    # left out and the label's runs go again, every seed, at the next lr on validation.
    while len(diverged) > seen:
        fallen, seen = set(diverged[seen:]), len(diverged)
        again = []
        for c in ready:
            unstable = {j.label: j.chosen[1] for j in jobs[c.key] if j.name in fallen and j.chosen is not None}
            if not unstable:
                continue
            done_dirs = {j.run_dir for j in grid_done[c.key]}
            moved = next_lrs(c, out, done_dirs, edges[c.key], unstable)
            chosen, grid_lines[c.key] = choose_lrs(c, out, done_dirs, edges[c.key], unstable_lrs(c, out))
            jobs[c.key] = claim_jobs(c, out, quick, chosen, configs)
            again += [j for j in jobs[c.key] if j.label in moved]
        ran |= launch(again, "reproduce (the next lr after a divergence)")
    ran_here |= ran
    done = {key: _finished_jobs(claim_runs, started, ran) for key, claim_runs in jobs.items()}

    # each claim's time: its finished runs and grid runs, and every try of its runs that diverged
    tried = {c.key: [*grids[c.key], *beyond[c.key], *jobs[c.key]] for c in ready}
    per_claim = {c.key: times.of(done[c.key], grid_done[c.key], tried[c.key]) for c in ready}
    sections: list[str] = []
    verdicts: dict[str, str] = {}
    for claim in claims:
        sections += [f"## {claim.paper}: {claim.key}", "", f"Claim: {claim.statement}.", ""]
        if claim.key not in jobs:
            missing = ", ".join(sorted(claim.methods() - set(methods())))
            sections += [f"Not run: methods not available yet: {missing}.", ""]
            continue
        if claim.lr_grid is not None:
            sections += (
                ["Learning-rate grid: off in QUICK (the configured learning rates).", ""]
                if quick
                else grid_lines.get(claim.key, [])
            )
        lines, verdicts[claim.key] = claim_section(claim, jobs[claim.key], done[claim.key], out, per_claim[claim.key])
        sections += lines
    reused = sum(j.name not in ran_here and j.done() for c in ready for j in tried[c.key])
    timing = SuiteTime(time.perf_counter() - t0, workers, len(ran_here), reused, per_claim, times.invocations())
    timing.device = times.device
    timing.platforms = platform_lines([j.run_dir for runs in (*done.values(), *grid_done.values()) for j in runs])
    if quick:
        timing.estimate = full_suite_estimate(ready, out, jobs, times, configs)
    report = out / "REPORT.md"
    # replaced whole: a stop never leaves half a report, nor writes through a second name of the file
    write_atomic(report, "\n".join([*_header(claims, verdicts, quick, timing), *sections]) + "\n")
    if failures:
        raise ConfigError("reproduce", f"{'; '.join(failures)} (left out of {report})")
    if diverged:  # a finding about the method and its learning rate, not a failure of the suite
        print(f"{len(diverged)} run(s) diverged, named in {report}: {', '.join(diverged)}", flush=True)
    return report


def full_suite_estimate(
    claims: list[Claim], out: Path, quick_jobs: dict[str, list[Job]], times: RunTimes, configs: Configs | None = None
) -> list[str]:
    """QUICK: the report's estimate of the full suite (every seed, every round, the lr grids) from the QUICK
    runs' records: each run's first round kept once, its later rounds scaled by the full run's rounds, its
    evaluations by the full run's evaluations, the rest of its wall time kept once; a run recorded without
    that split has its whole wall time scaled by its rounds (``pfl.runner.suite_estimate``). A label's
    rounds are read from its first seed's run (the seeds' arguments differ in the seed and the run folder
    alone)."""
    configs = configs or Configs()
    planned, quick_rounds = [], {}
    for c in claims:
        quick_of = {j.label: j for j in quick_jobs[c.key]}
        quick_rounds.update({j.name: _schedule(j, configs)[0] for j in quick_of.values()})
        label_schedule: dict[str, tuple[int, int]] = {}
        for j in claim_jobs(c, out, quick=False, configs=configs, check=False):
            if j.label not in label_schedule:
                label_schedule[j.label] = _schedule(j, configs)
            planned.append(Planned(quick_of[j.label].name, *label_schedule[j.label]))
        grid = c.lr_grid
        if grid is not None:  # every label it applies to, at each of its values; a grid run evaluates once
            planned += [
                Planned(quick_of[k].name, grid.rounds, 1) for k in c.runs if grid.applies(k) for _ in grid.values
            ]
    splits = {name: split for name, record in times.timing.items() if (split := split_of(record)) is not None}
    got = estimate(planned, times.wall, quick_rounds, splits)
    devices = sorted({times.devices[n] for n in quick_rounds if n in times.devices}) or ["an unrecorded device"]
    how = []
    if got.split:
        how.append("each QUICK run's first round kept once, its later rounds scaled by the full run's, its "
                   "evaluations by its evaluations, the rest of its wall time (start-up, data, model, outputs) "
                   "kept once per run")  # fmt: skip
    if got.unsplit:
        how.append(f"{got.unsplit} QUICK run(s) recorded without the time of their rounds (an older pfl): "
                   f"wall time scaled by rounds, {got.startup:.0f} s of start-up per run kept as is")  # fmt: skip
    left_out = f"; {got.missing} run(s) without a QUICK record left out" if got.missing else ""
    total = got.seconds
    return [
        f"**Estimate**, not a measurement, of the full suite on {', '.join(devices)}: {len(planned)} runs, "
        f"{total / 60:.1f} run-minutes, about {total / 60 / times.workers:.1f} min with {times.workers} worker(s) "
        f"({'; '.join(how)}; the lr grids included, their edge steps not{left_out})."
    ]


def _schedule(job: Job, configs: Configs) -> tuple[int, int]:
    """The run's rounds and how many times it evaluates."""
    trainer = configs.config(job.argv[1:]).trainer
    return trainer.rounds, evaluations(trainer.rounds, trainer.eval_every)


def _run(
    jobs: list[Job],
    what: str,
    workers: int,
    reuse: bool,
    times: RunTimes,
    failures: list[str],
    diverged: list[str],
    extra: list[str],
    fresh: bool,
    pool: WorkerPool,
) -> set[str]:
    """Run the jobs (``reuse``: those without a summary yet) with ``extra`` after each one's arguments; the
    names of the runs started. Runs that diverged go to ``diverged``; any other failure to ``failures``
    (the suite then ends in an error)."""
    todo = {j.name: [*j.argv, *extra] for j in jobs if not (reuse and j.done())}
    if not jobs:
        return set()
    print(f"{what}: {len(todo)} runs to do, {len(jobs) - len(todo)} reused, {workers} worker(s)", flush=True)
    dirs = {j.name: j.run_dir for j in jobs}

    def finished(name: str, code: int, wall: float, cpu: float | None) -> None:
        times.record(name, code, wall, cpu, _summary_entry(dirs[name], "timing"))

    try:
        run_parallel(todo, workers, what=what, on_finish=finished, fresh=fresh, pool=pool)
    except ConfigError as err:  # the failed runs are named in the report; the others still count
        codes = {name: times.codes.get(name) for name in todo}  # None: a run that never reported its end
        diverged += [name for name, code in codes.items() if code == EXIT_DIVERGED]
        if any(code not in (0, EXIT_DIVERGED) for code in codes.values()):
            failures.append(str(err))
    return set(todo)


def _summary_entry(folder: Path, key: str) -> object:
    """``key`` of the run's ``summary.json`` (``timing``: its rounds' and evaluations' seconds; ``platform``:
    where it ran): None where the run wrote none (a pfl older than it, or a run that failed before its
    summary)."""
    try:
        return json.loads((folder / "summary.json").read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def platform_lines(folders: list[Path]) -> list[str]:
    """The report's line on where its runs computed their numbers (``numeric_platform.where_computed``)."""
    counts = numeric_platform.platform_counts(_summary_entry(folder, "platform") for folder in folders)
    line = numeric_platform.where_computed(counts)
    return [] if line is None else [line]


INVOCATIONS = "invocations.json"
TIMING = "timing.json"
DIVERGED_TIMES = "diverged_seconds.json"  # run name -> [wall, CPU] seconds of its last try that diverged


@dataclass
class RunTimes:
    """Each run's wall and CPU seconds, its device and the seconds of its rounds and evaluations
    (``seconds.json``, ``cpu_seconds.json``, ``devices.json``, ``timing.json`` in ``out``), written as each
    run ends, so a suite that is stopped keeps the times of every run it finished, and merged with earlier
    suites': a reused run keeps its measured times. A run that diverged is timed apart (``DIVERGED_TIMES``):
    the suite spent that time, and a second try at the next lr under the same name replaces none of it.
    ``invocations.json`` lists every invocation that ran runs in ``out``: when it started, its workers, how
    many runs it finished and its wall time up to the last of them, so a suite stopped and continued with
    ``--reuse`` adds up its measured time."""

    out: Path
    workers: int = 1
    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)  # this invocation's runs' exit codes
    devices: dict[str, str] = field(default_factory=dict)  # the device each run trained on (``devices.json``)
    # each run's rounds and evaluations, their counts and seconds (``timing.json``; null: not recorded)
    timing: dict[str, object] = field(default_factory=dict)
    device: str = field(default_factory=device_label)  # this invocation's
    diverged: dict[str, list] = field(default_factory=dict)  # name -> [wall, CPU or None] of a diverged try

    def __post_init__(self) -> None:
        self.wall.update(_record(self.out / "seconds.json", _seconds, "seconds"))
        self.devices.update(_record(self.out / "devices.json", _device, "a device's name"))
        self.cpu.update(_record(self.out / "cpu_seconds.json", _seconds, "seconds"))
        self.timing.update(_read_json(self.out / TIMING, {}))  # any value: split_of reads what it can
        self.diverged.update(_record(self.out / DIVERGED_TIMES, _diverged, "[wall seconds, CPU seconds or null]"))
        self.t0, self.finished, self.last = time.perf_counter(), 0, 0.0
        self.started = time.strftime("%Y-%m-%d %H:%M")
        self.earlier: list[dict] = _invocations(self.out / INVOCATIONS)

    def record(self, name: str, code: int, wall: float, cpu: float | None, timing: object = None) -> None:
        """One run ended: its times (when it ran to the end; ``timing``: its ``summary.json``'s) and this
        invocation's line, on disk now."""
        self.codes[name] = code
        if code == EXIT_DIVERGED:
            self.diverged[name] = [wall, cpu]
            _write_json(self.out / DIVERGED_TIMES, self.diverged)
        if code == 0:
            self.wall[name] = wall
            if cpu is not None:
                self.cpu[name] = cpu
            self.devices[name] = self.device
            self.timing[name] = timing  # None too: an earlier run's split must not stand beside this wall time
            self.finished, self.last = self.finished + 1, time.perf_counter() - self.t0
            _write_json(self.out / "seconds.json", self.wall)
            _write_json(self.out / "devices.json", self.devices)
            _write_json(self.out / "cpu_seconds.json", self.cpu)
            _write_json(self.out / TIMING, self.timing)
            _write_json(self.out / INVOCATIONS, self.invocations())

    def invocations(self) -> list[dict]:
        """The earlier invocations' lines and this one's (when it has finished a run)."""
        now = {"started": self.started, "workers": self.workers, "runs": self.finished,
               "wall_s": round(self.last, 1)}  # fmt: skip
        return [*self.earlier, now] if self.finished else list(self.earlier)

    def of(self, jobs: list[Job], grid: list[Job] | None = None, tried: list[Job] | None = None) -> ClaimTime:
        """The recorded times of ``jobs`` and of the lr-grid runs ``grid`` (those with a result), and of the
        tries of ``tried`` (every run of the claim) that diverged."""
        names = [j.name for j in [*jobs, *(grid or [])]]
        lost = [self.diverged[n] for n in dict.fromkeys(j.name for j in tried or []) if n in self.diverged]
        return ClaimTime(
            len(names),
            sum(self.wall.get(n, 0.0) for n in names) + sum(wall for wall, _ in lost),
            sum(self.cpu.get(n, 0.0) for n in names) + sum(cpu for _, cpu in lost if cpu is not None),
            sum(n not in self.cpu for n in names),
            len(grid or []),
            len(lost),
        )


@dataclass
class ClaimTime:
    """A claim's runs with a result, their recorded wall and CPU seconds, and how many have no CPU
    record (reused runs of a suite older than the record, or whose files were lost). The seconds include
    those of its ``diverged`` tries: runs that stopped at a divergence, not among ``runs`` (a second try
    of one, at the next lr, is)."""

    runs: int
    wall: float
    cpu: float
    unrecorded: int
    grid: int = 0  # how many of ``runs`` are the lr grid's short runs
    diverged: int = 0

    def count(self) -> str:
        runs = f"{self.runs} ({self.grid} lr grid)" if self.grid else str(self.runs)
        return f"{runs} + {self.diverged} diverged" if self.diverged else runs

    def text(self) -> str:
        missing = f"; {self.unrecorded} without a recorded CPU time" if self.unrecorded else ""
        return f"{self.count()} runs, {self.cpu / 60:.1f} CPU-minutes, {self.wall / 60:.1f} run-minutes{missing}"


@dataclass
class SuiteTime:
    """What the report says about time: this invocation's wall time, and per claim its runs' recorded
    times (an interrupted suite continued with ``--reuse`` still adds up to the whole suite). The CPU
    time is the budget figure: unlike wall time it does not grow when other work shares the machine."""

    wall: float
    workers: int
    ran: int
    reused: int
    claims: dict[str, ClaimTime]
    invocations: list[dict] = field(default_factory=list)  # every invocation that finished runs here
    device: str = field(default_factory=device_label)  # the training device of this invocation's runs
    estimate: list[str] = field(default_factory=list)  # QUICK: the full suite's estimated time
    platforms: list[str] = field(default_factory=list)  # where the report's runs computed their numbers

    def lines(self) -> list[str]:
        runs = sum(c.runs for c in self.claims.values())
        cpu = sum(c.cpu for c in self.claims.values()) / 60
        wall = sum(c.wall for c in self.claims.values()) / 60
        missing = sum(c.unrecorded for c in self.claims.values())
        diverged = sum(c.diverged for c in self.claims.values())
        tries = f" and of {diverged} diverged run(s)" if diverged else ""
        return [
            *self.platforms,
            f"Measured wall time of this invocation: {self.wall / 60:.1f} min with {self.workers} worker(s); "
            f"it ran {self.ran} run(s) and reused {self.reused}.",
            f"Recorded time of the report's {runs} runs{tries}: {cpu:.1f} CPU-minutes, "
            f"about {cpu / self.workers:.1f} min of wall time with {self.workers} worker(s) on an otherwise idle "
            f"machine ({wall:.1f} run-minutes of wall time as measured, which grows with other load on the machine)"
            + (f"; {missing} reused run(s) have no recorded CPU time and are not in those sums." if missing else "."),
            *self.invocation_lines(),
            *self.estimate,
        ]

    def invocation_lines(self) -> list[str]:
        """With ``--reuse`` after a stop: the measured wall time of each invocation that made the runs,
        each up to its last finished run, and their sum."""
        if len(self.invocations) < 2:
            return []
        each = "; ".join(
            f"{i['started']}, {i['wall_s'] / 60:.1f} min, {i['runs']} run(s), {i['workers']} worker(s)"
            for i in self.invocations
        )
        total = sum(i["wall_s"] for i in self.invocations) / 60
        return [
            f"The runs were made by {len(self.invocations)} invocations ({each}; each up to its last finished "
            f"run): {total:.1f} min of measured wall time in all."
        ]


def _header(claims: list[Claim], verdicts: dict[str, str], quick: bool, timing: SuiteTime) -> list[str]:
    mode = (
        f"QUICK: one seed, 1/{QUICK_SHARE} of the rounds, no lr grid: a smoke test, every verdict indicative"
        if quick
        else "full: every claim over its seeds"
    )
    lines = [
        "# Reproduction report",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M')} on {timing.device}, embedded data; {mode}.",
        *timing.lines(),
        "",
        "Verdicts (docs/reproduce.md): per seed, the paired difference of a contrast (positive in the paper's "
        "favour) beyond its margin; **held** when their mean is above their sample std over seeds and every "
        "seed's is positive, **not held** when the mean is below minus that std, **tie** otherwise. A claim "
        "holds when all its contrasts hold, fails when any fails.",
        "",
        "| claim | verdict | runs | CPU-minutes | run-minutes |",
        "|---|---|---|---|---|",
    ]
    for c in claims:
        t = timing.claims.get(c.key, ClaimTime(0, 0.0, 0.0, 0))
        unrecorded = f" ({t.unrecorded} runs unrecorded)" if t.unrecorded else ""
        cells = [
            c.key,
            verdicts.get(c.key, "not run"),
            t.count(),
            f"{t.cpu / 60:.1f}{unrecorded}",
            f"{t.wall / 60:.1f}",
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return [*lines, ""]


def claim_section(
    claim: Claim, jobs: list[Job], finished: list[Job], out: Path, spent: ClaimTime
) -> tuple[list[str], str]:
    """The claim's report lines (table, contrasts, verdict, causes, plot, its time ``spent``) and its verdict;
    ``finished``: those of its ``jobs`` with a result of this suite."""
    lines = []
    failed = [j.name for j in jobs if j not in finished]
    if failed:
        lines += [f"Failed (left out of the table and the check): {', '.join(failed)}.", ""]
    s: SeedSummaries = {}
    for job in finished:
        summary = json.loads((job.run_dir / "summary.json").read_text())
        summary.setdefault("run_dir", str(job.run_dir))  # checks may read a run's files (clients.csv)
        s.setdefault(job.seed, {})[job.label] = summary
    if not s:
        return lines, "not run"
    if any("local" in runs for runs in s.values()):
        for runs in s.values():
            if "local" in runs:
                add_gain_over_local(runs)
        lines += ["Gain, R-Acc and PTR are per client against the suite's own `local` run (same split, seed).", ""]
    names = [job.label for job in finished]
    summaries = [s[job.seed][job.label] for job in finished]
    configs = [load_config(job.run_dir) for job in finished]
    header, rows, best = build_table(summaries, names, list(claim.metrics), configs, defaults=method_defaults)
    for row in rows:  # a row is a label over its seeds (column n), not the first run "+k"
        row[0] = str(row[0]).split(" +")[0]
    seeds = sorted(s)
    lines += [f"Mean ± std over {len(seeds)} seed(s) ({', '.join(map(str, seeds))}):", ""]
    lines += render(header, rows, best).splitlines()
    if claim.partial:
        lines += ["", f"Partial: only the runs {', '.join(claim.runs)} (`--runs`); the verdict covers their contrasts."]
    if claim.notes is not None:
        lines += ["", *_sentences(claim, claim.notes, s)]
    try:
        contrasts = claim.contrasts(s)
    except (KeyError, ValueError) as missing:  # a run every contrast needs failed on every seed
        contrasts, lines = [], [*lines, "", f"Not decidable: {missing!s} has no result."]
    result = claim_verdict(contrasts) + (" (indicative, 1 seed)" if len(seeds) < 2 else "")
    result += " (partial)" if claim.partial else ""
    lines += ["", *contrast_table(contrasts, seeds), "", f"**Verdict: {result}**"]
    if not result.startswith("held") and claim.diagnose is not None:
        lines += ["", "Measured causes:", "", *(f"- {sentence}" for sentence in _sentences(claim, claim.diagnose, s))]
    title = f"{claim.paper}: {claim.key} ({result})"
    plot = seed_plot(s, claim.plot_metric, out / f"{claim.key}.png", claim.winner, title)
    lines += ["", f"![{claim.key}]({plot.name})", "", *comparison_plots(claim.key, finished, out, title)]
    lines += [f"({spent.text()})", ""]
    return lines, result


def _sentences(claim: Claim, write: Callable[[SeedSummaries], list[str]], s: SeedSummaries) -> list[str]:
    """A claim's notes or causes (``write``); for a partial table (``--runs``), a run they need that did not
    run is named instead."""
    try:
        return write(s)
    except KeyError as missing:
        if not claim.partial:
            raise
        return [f"Not computed: needs the run {missing!s}, not among `--runs`."]


def comparison_plots(key: str, finished: list[Job], out: Path, title: str) -> list[str]:
    """The claim's runs as ``pfl report --plot/--plot-clients`` draws them, a row per label: the curves
    over rounds (``<key>_curves.png``) and the per-client scores (``<key>_clients.png``); the report's lines."""
    groups = plot_groups(
        [j.run_dir for j in finished], [j.label for j in finished], label_by_name=True, defaults=method_defaults
    )
    lines = []
    for name, draw in (("curves", curve_figure), ("clients", clients_figure)):
        path = out / f"{key}_{name}.png"
        try:
            save_figure(draw(groups, None, title)[0], path)
        except ConfigError as err:  # e.g. runs without a common metric: the report says so and goes on
            lines += [f"No {name} plot: {err.problem}.", ""]
            continue
        lines += [f"![{key} {name}]({path.name})", ""]
    return lines


def contrast_table(contrasts: list[Contrast], seeds: list[int]) -> list[str]:
    """Per contrast: each seed's paired difference, their mean and std, the margin, the verdict."""
    if not contrasts:
        return ["No contrast could be computed."]
    head = ["contrast", *(f"s{seed}" for seed in seeds), "mean", "std", "margin", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in contrasts:
        cells = [f"{c.diffs[seed]:+.4f}" if seed in c.diffs else "-" for seed in seeds]
        mean = statistics.fmean(c.diffs.values()) if c.diffs else math.nan
        note = f" ({c.note})" if c.note else ""
        lines.append(
            f"| {c.name}{note} | {' | '.join(cells)} | {mean:+.4f} | {c.spread:.4f} | {c.margin:+.4f} "
            f"| {verdict_text(c)} |"
        )
    return lines


def _finished_jobs(jobs: list[Job], started: float, ran: set[str]) -> list[Job]:
    """The jobs with a result of this suite: reused, or run by it (``ran``) and written since ``started``.
    A run that failed can leave an earlier suite's result in its folder (a run that fails before writing
    anything moves the old folder back): that one is neither reported, counted in the suite's time, nor
    read for the lr grid's choice."""

    def finished(job: Job) -> bool:
        path = job.run_dir / "summary.json"
        return path.exists() and (job.name not in ran or path.stat().st_mtime >= started)

    return [j for j in jobs if finished(j)]


def add_gain_over_local(runs: dict[str, dict]) -> None:
    """Add gain.{mean,std}, r_acc.mean and ptr of every run's P-models against the ``local`` run of the
    same seed, client by client from the runs' clients.csv (all runs of a seed share the split)."""

    for summary in runs.values():
        pairs = client_pairs(summary, runs["local"], "pm.l_acc")
        comp = reference_metrics([mine for mine, _ in pairs], [local for _, local in pairs])
        summary["metrics"].update(
            {
                "gain.mean": comp["gain.mean"],
                "gain.std": comp["gain.std"],
                "r_acc.mean": comp["r.mean"],
                "ptr": comp["ptr"],
            }  # fmt: skip
        )


def seed_plot(
    s: SeedSummaries, metric: str, path: Path, highlight: str | None = None, title: str | None = None
) -> Path:
    """Bars of ``metric``'s mean over seeds per run, ± its std over seeds, each seed a dot; the axis spans
    every error bar and dot."""
    from pfl.metrics.plots import new_figure, save_figure

    labels = list(dict.fromkeys(label for runs in s.values() for label in runs))
    values = {k: [runs[k]["metrics"][metric] for runs in s.values() if metric in runs.get(k, {}).get("metrics", {})]
              for k in labels}  # fmt: skip
    labels = [k for k in labels if values[k]]
    means = [statistics.fmean(values[k]) for k in labels]
    stds = [statistics.stdev(values[k]) if len(values[k]) > 1 else 0.0 for k in labels]
    fig, ax = new_figure((max(5, 0.6 * len(labels)), 3.5))
    colors = ["tab:orange" if k == highlight else "tab:blue" for k in labels]
    ax.bar(labels, means, yerr=stds, capsize=3, color=colors, alpha=0.8)
    for i, k in enumerate(labels):
        ax.plot([i] * len(values[k]), values[k], "k.", markersize=4)
    points = [v for k in labels for v in values[k]]
    low = min([m - sd for m, sd in zip(means, stds, strict=True)] + points, default=0.0)
    high = max([m + sd for m, sd in zip(means, stds, strict=True)] + points, default=1.0)
    ax.set_ylim(max(0.0, low - 0.05), high + 0.02)
    ax.set_ylabel(f"{metric} (± std over seeds; dots: seeds)", fontsize=8)
    ax.set_xlabel("run")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(axis="x", rotation=60)
    save_figure(fig, path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> None:
    """``python -m pfl reproduce``: the suite the command line asks for (``reproduce_options``)."""
    run_parsed(parse_args(argv))


def run_parsed(args: argparse.Namespace) -> None:
    """Run the suite of a parsed command line and print its report's path."""
    print(
        run_claims(
            args.out,
            args.only,
            args.quick,
            args.workers,
            args.reuse,
            args.accelerator,
            args.fresh_processes,
            args.keep_checkpoints,
            runs=args.runs,
        )  # fmt: skip
    )


def _read_json(path: Path, empty: dict | list) -> dict | list:
    """A time record of the suite's folder (``empty`` when absent); one that is not what the suite
    writes is refused by name before any run starts, not overwritten."""
    if not path.exists():
        return empty
    value = _json(path, "a time record of the suite", "remove or restore it")
    require(type(value) is type(empty), str(path), f"holds a {type(value).__name__}, not a {type(empty).__name__}",
            "remove or restore it")  # fmt: skip
    return value


def _json(path: Path, what: str, fix: str) -> object:
    """The JSON file's value; a file that cannot be read as JSON is refused in one line naming it."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(str(path), f"not {what} ({err})", fix) from None


def _record(path: Path, ok: Callable[[object], bool], shape: str) -> dict:
    """A time record of run name -> value (empty when absent); a value that ``ok`` refuses is refused by
    the run's name and ``shape`` before any run starts."""
    record = _read_json(path, {})
    for name, value in record.items():  # type: ignore[union-attr]
        require(ok(value), str(path), f"{name}: {value!r} is not {shape}", "remove or restore it")
    return record  # type: ignore[return-value]


def _invocations(path: Path) -> list[dict]:
    """``INVOCATIONS`` (empty when absent): one line per invocation, as ``RunTimes.invocations`` writes it;
    anything else is refused by its position before any run starts."""
    lines = _read_json(path, [])
    for i, line in enumerate(lines):
        ok = isinstance(line, dict) and isinstance(line.get("started"), str) and _count(line.get("workers"), 1)
        ok = ok and _count(line.get("runs"), 1) and _seconds(line.get("wall_s"))
        require(ok, str(path), f"entry {i}: {line!r} is not {{started, workers, runs, wall_s}}", "remove or restore it")
    return lines  # type: ignore[return-value]


def _diverged(value: object) -> bool:
    """[wall seconds, CPU seconds or null] (``DIVERGED_TIMES``)."""
    if not isinstance(value, list) or len(value) != 2:
        return False
    return _seconds(value[0]) and (value[1] is None or _seconds(value[1]))


def _device(value: object) -> bool:
    return isinstance(value, str)


def _count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _write_json(path: Path, value: dict | list) -> None:
    """Replaced whole (write_atomic): a stop mid-write leaves the last record."""
    write_atomic(path, json.dumps(value, indent=1, sort_keys=True) + "\n")
