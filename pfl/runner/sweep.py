"""W&B sweep files, run without a W&B server: validate, expand (grid / random), run in workers.

The same ``sweeps/*.yaml`` works with ``wandb sweep`` + ``wandb agent``. Expansion is done here
rather than by the ``sweeps`` package, which pins numpy<2 and drops nested ``parameters:`` groups.
Every expanded run is parsed by the ``fit`` parser before anything starts, so a typo in a key or
an out-of-range value fails the whole sweep up front.

Macros: ``${args}`` (``--key=value``) and ``${args_no_hyphens}`` (``key=value``, which ``fit`` reads
as ``--key=value``) are filled in; ``${env}``, ``${interpreter}`` and ``${program}`` are dropped, as
the local runner starts ``sys.executable -m pfl`` itself (no activated venv needed). The file's
``project:`` becomes ``--tracking.project``, so local runs and ``wandb agent`` runs share a project;
each run is grouped under the sweep (``--tracking.group``, ``--tracking.job_type sweep``).

A ``--config`` path in the command is read relative to the sweep file's own folder, else as a config that
ships with pfl (``conf/default.yaml``), so a sweep file runs from any working directory. ``--set KEY=VALUE``
fixes an option in every run. Each run is named after the values it sweeps (``lr0.01-mu0.1``), and the
result table is saved beside the runs (``results.md``, ``results.csv``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm.auto import tqdm

from pfl.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, ConfigError, require, yaml_problem
from pfl.metrics.report import report
from pfl.runner.args import parse_fit_args
from pfl.runner.config_files import shipped_config
from pfl.runner.rundir import check_creatable
from pfl.runner.warm_workers import WarmWorker, WorkerPool, close_all, require_workers

SEARCH_METHODS = ("grid", "random", "bayes")
DISTRIBUTIONS = ("uniform", "log_uniform_values", "int_uniform", "normal", "categorical")
ARG_MACROS = ("${args}", "${args_no_hyphens}")
DROPPED_MACROS = ("${env}", "${interpreter}", "${program}")  # the local runner starts python -m pfl itself
UNSUPPORTED_MACROS = ("${args_no_boolean_flags}", "${args_json}", "${args_json_file}")
# Set by the sweep runner itself for every run (``--root`` chooses the folder).
RUNNER_KEYS = ("tracking.root", "tracking.name")
RESULTS = {"results.md": "markdown", "results.csv": "csv"}  # the sweep's table, beside its runs


@dataclass
class SweepRun:
    index: int
    params: dict[str, Any]
    argv: list[str]  # arguments after `python -m pfl`
    name: str  # the run folder's name, from the swept values
    overwrite: bool  # tracking.overwrite: the run replaces its folder (moved to _replaced/)


def load_sweep(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    require(path.exists(), "sweep", f"file not found: {path}", "pass a W&B sweep YAML such as sweeps/fedprox_mu.yaml")
    require(path.is_file(), "sweep", f"{path} is not a file", "pass a W&B sweep YAML such as sweeps/fedprox_mu.yaml")
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(
            "sweep", f"{path} is not valid YAML{yaml_problem(err)}", "quote ${...} macros in flow lists"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("sweep", f"cannot read {path}: {err}", "pass a W&B sweep YAML (UTF-8 text)") from None
    require(isinstance(spec, dict), "sweep", f"{path} is not a YAML mapping")
    validate_spec(spec)
    return spec


def validate_spec(spec: dict[str, Any]) -> None:
    require(
        spec.get("method") in SEARCH_METHODS, "sweep.method", f"got {spec.get('method')!r}", f"one of {SEARCH_METHODS}"
    )
    params = spec.get("parameters")
    require(isinstance(params, dict) and params, "sweep.parameters", "missing or empty")
    for key, p in params.items():
        field = f"sweep.parameters.{key}"
        require(isinstance(p, dict), field, "must be a mapping with values/value/distribution")
        require("parameters" not in p, field, "nested parameter groups are not supported", "use dotted keys (a.b)")
        if "values" in p:
            require(isinstance(p["values"], list) and p["values"], field, "values must be a non-empty list")
        elif "value" not in p:
            dist = p.get("distribution", "uniform" if "min" in p else None)
            require(dist in DISTRIBUTIONS, field, f"distribution {dist!r} is not supported", f"use {DISTRIBUTIONS}")
            require(dist != "categorical", field, "categorical needs values", "give values: [...]")
            _check_bounds(field, dist, p)
            require(spec["method"] != "grid", field, "grid search needs discrete values", "give values: [...]")
    command = spec.get("command")
    require(
        isinstance(command, list) and any(m in command for m in ARG_MACROS),
        "sweep.command",
        "must be a list containing ${args} or ${args_no_hyphens}",
    )
    for macro in UNSUPPORTED_MACROS:
        require(macro not in command, "sweep.command", f"{macro} is not read by pfl fit", "use ${args}")
    require(
        isinstance(spec.get("project", ""), str), "sweep.project", "must be a W&B project name", "e.g. project: pfl"
    )
    require(
        any(c in ("pfl", "-m") for c in command) or spec.get("program"),
        "sweep.command",
        "must run pfl (`${interpreter} -m pfl fit ${args}`)",
    )
    metric = spec.get("metric")
    if metric is not None:
        require(isinstance(metric, dict) and "name" in metric, "sweep.metric", "needs a name")
        require(metric.get("goal", "maximize") in ("maximize", "minimize"), "sweep.metric.goal", "maximize|minimize")


def _check_bounds(field: str, dist: str, p: dict[str, Any]) -> None:
    """A distribution's bounds are given and are numbers it can draw from: finite (integers for
    int_uniform), min <= max, min > 0 on a log scale, sigma >= 0."""
    need = ("mu", "sigma") if dist == "normal" else ("min", "max")
    require(all(k in p for k in need), field, f"{dist} needs {' and '.join(need)}")
    integer = dist == "int_uniform"
    for key in need:
        value = p[key]
        number = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
        require(
            number and math.isfinite(value),
            f"{field}.{key}",
            f"must be a finite {'integer' if integer else 'number'} (got {value!r})",
            "YAML reads 1e-3 as text: write 1.0e-3 or 0.001" if isinstance(value, str) else "",
        )
    if dist == "normal":
        require(p["sigma"] >= 0, f"{field}.sigma", f"must be >= 0 (got {p['sigma']})")
        return
    require(p["min"] <= p["max"], field, f"min {p['min']} is above max {p['max']}")
    if dist == "log_uniform_values":
        require(p["min"] > 0, f"{field}.min", f"must be > 0 on a log scale (got {p['min']})")


def expand(spec: dict[str, Any], count: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Parameter sets of the sweep: the full grid (cut to ``count``) or ``count`` random draws.
    Bayes has no model without a server, so it is expanded as random search."""
    if count is not None:
        require(count >= 1, "--count", f"{count} is not a number of runs", "give 1 or more, or none for the whole grid")
    params = spec["parameters"]
    if spec["method"] == "grid":
        keys = list(params)
        choices = [params[k]["values"] if "values" in params[k] else [params[k]["value"]] for k in keys]
        grid = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*choices)]
        return grid[:count]
    require(count is not None, "--count", f"{spec['method']} search needs --count N")
    rng = np.random.default_rng(seed)
    return [{k: _draw(p, rng) for k, p in params.items()} for _ in range(count)]


def _draw(p: dict[str, Any], rng: np.random.Generator) -> Any:
    if "value" in p:
        return p["value"]
    if "values" in p:
        return p["values"][int(rng.integers(len(p["values"])))]
    dist = p.get("distribution", "uniform")
    if dist == "uniform":
        return float(rng.uniform(p["min"], p["max"]))
    if dist == "log_uniform_values":
        return float(math.exp(rng.uniform(math.log(p["min"]), math.log(p["max"]))))
    if dist == "int_uniform":
        return int(rng.integers(p["min"], p["max"] + 1))
    return float(rng.normal(p["mu"], p["sigma"]))


def command_argv(spec: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """The agent's command with its macros filled in, as arguments after ``python -m pfl``."""
    args = {
        "${args}": [f"--{k}={_format(v)}" for k, v in params.items()],
        "${args_no_hyphens}": [f"{k}={_format(v)}" for k, v in params.items()],
    }
    out: list[str] = []
    for token in spec["command"]:
        if token in args:
            out += args[token]
        elif token not in DROPPED_MACROS:
            out.append(_format(token))  # YAML reads an unquoted 4 or false as a number or a boolean
    if out[:2] == ["-m", "pfl"]:
        out = out[2:]
    return out


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def tracking_args(spec: dict[str, Any], argv: list[str], root: Path) -> list[str]:
    """W&B project (the file's ``project:``), group (the sweep folder) and job type of a local sweep's
    runs, unless the command sets them itself."""
    given = {a.split("=", 1)[0].lstrip("-") for a in argv}
    out = []
    for key, value in (("project", spec.get("project")), ("group", root.name), ("job_type", "sweep")):
        if value and f"tracking.{key}" not in given:
            out += [f"--tracking.{key}", str(value)]
    return out


def config_paths(argv: list[str], folder: Path) -> list[str]:
    """``argv`` with each relative ``--config`` path that names a file beside the sweep file (in ``folder``),
    else a shipped config (``shipped_config``), made absolute; any other left as given (the fit parser
    then names it)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            out.append("--config=" + _config_file(arg[len("--config=") :], folder))
        elif i > 0 and argv[i - 1] == "--config":
            out.append(_config_file(arg, folder))
        else:
            out.append(arg)
    return out


def _config_file(path: str, folder: Path) -> str:
    given = Path(path)
    if given.is_absolute():
        return path
    beside = folder / given
    found = beside if beside.is_file() else shipped_config(given)
    return str(found.resolve()) if found is not None else path


def set_args(overrides: list[str], params: dict[str, Any]) -> list[str]:
    """``--set KEY=VALUE`` as ``--KEY=VALUE``; a key the file sweeps, or one the runner sets, is a ConfigError."""
    out = []
    for item in overrides:
        key, eq, value = item.partition("=")
        key = key.strip().removeprefix("--")
        require(bool(eq) and bool(key), "--set", f"expected KEY=VALUE, got {item!r}", "e.g. --set trainer.rounds=5")
        require(key not in params, "--set", f"{key} is swept by the file", "remove it from --set or from parameters")
        require(key not in RUNNER_KEYS, "--set", f"{key} is set by the sweep runner", "choose the folder with --root")
        out.append(f"--{key}={value}")
    return out


def run_names(runs: list[dict[str, Any]]) -> list[str]:
    """A folder name per run from the values it sweeps: ``lr0.01-mu0.1`` (a key by its last part, unless
    two swept keys share it); only the keys whose values differ between runs. Repeated names get the
    run's index (``lr0.01-003``); a sweep of one run is ``run000``."""
    keys = [k for k in dict.fromkeys(k for params in runs for k in params) if len({_text(p.get(k)) for p in runs}) > 1]
    short = [k.rsplit(".", 1)[-1] for k in keys]
    labels = [s if short.count(s) == 1 else k for k, s in zip(keys, short, strict=True)]
    names = [
        "-".join(f"{label}{_text(params.get(k))}" for k, label in zip(keys, labels, strict=True)) for params in runs
    ]
    names = [_safe(n) or f"run{i:03d}" for i, n in enumerate(names)]
    return [f"{n}-{i:03d}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return _format(value)


def _safe(name: str) -> str:
    """Letters, digits and ``.+-_`` only: a folder name on every system, never read as an option."""
    return "".join(c if c.isalnum() or c in ".+-_" else "_" for c in name).lstrip("-")


def default_root(path: str | Path) -> Path:
    """A sweep's folder when ``--root`` is not given: ``runs/sweeps/<file>-<time>``."""
    return Path("runs") / "sweeps" / f"{Path(path).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def plan(
    path: str | Path, count: int | None = None, root: Path | None = None, overrides: list[str] | None = None
) -> tuple[list[SweepRun], Path]:
    """The sweep's runs (each parsed by the ``fit`` parser: a bad key or value fails here, before anything
    runs) and their folder ``root`` (default ``runs/sweeps/<file>-<time>``)."""
    spec = load_sweep(path)
    root = root or default_root(path)
    folder = Path(path).resolve().parent
    drawn = expand(spec, count)
    runs, parsers = [], {}  # each method's parser built once (building one costs as much as a parse)
    for i, (params, name) in enumerate(zip(drawn, run_names(drawn), strict=True)):
        argv = config_paths(command_argv(spec, params), folder)
        require(argv[:1] == ["fit"], "sweep.command", "must call `pfl fit`")
        argv += set_args(overrides or [], params)
        argv += tracking_args(spec, argv, root)
        argv += ["--tracking.root", str(root), "--tracking.name", name, "--trainer.progress", "false"]
        cfg, *_ = parse_fit_args(argv[1:], parsers)  # raises ConfigError on any bad key or value, before anything runs
        runs.append(SweepRun(i, params, argv, name, cfg.tracking.overwrite))
    return runs, root


def run_parallel(
    jobs: dict[str, list[str]],
    workers: int = 1,
    what: str = "sweep",
    on_finish: Callable[[str, int, float, float | None], None] | None = None,
    fresh: bool = False,
    pool: WorkerPool | None = None,
) -> None:
    """Run ``python -m pfl <argv>`` for every job in ``workers`` warm worker processes
    (``pfl.runner.warm_workers``: each imports once and runs job after job; ``fresh``: a new process
    per job); the cores are split between workers. The workers end with the call, or, given a ``pool``,
    wait there for its next call (unless a stop or an error ends this one early). A line per finished run
    (with elapsed time and ETA) and, on a terminal, a live bar below them; ``on_finish`` (when given) is
    called as each run ends with its name, exit code, wall seconds and CPU seconds (None where the
    platform cannot measure them; unlike wall time, CPU time does not grow when other work shares the
    machine), so a caller can record it before the next run ends.
    Raises ConfigError naming every failed job.

    Threads: each run sets torch's threads itself (``trainer.threads``, default 1); the split of the
    cores in OMP_NUM_THREADS is what a run with ``trainer.threads: null`` gets, and bounds the other
    OpenMP pools, so workers x threads never exceeds the cores by default."""
    threads = str(max(1, (os.cpu_count() or 1) // max(workers, 1)))
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    env.pop("WANDB_SERVICE", None)  # each run starts its own W&B service: a killed run frees its id with it
    progress = RunProgress(len(jobs), what, workers)
    own = threading.local()  # each thread's worker process
    started_workers: list[WarmWorker] = []
    pool = None if fresh else pool  # a process per run: nothing to keep

    def launch(name: str, argv: list[str]) -> tuple[int, str, float, float | None]:
        if not hasattr(own, "worker"):
            own.worker = pool.take(env) if pool is not None else WarmWorker(env, fresh=fresh)
            started_workers.append(own.worker)
        started = progress.started(name)
        code, err, cpu = own.worker.run(argv)
        return code, err, time.perf_counter() - started, cpu

    failed = []
    ended = False
    try:
        with ThreadPoolExecutor(max_workers=workers) as executor:
            pending = {executor.submit(launch, name, argv): name for name, argv in jobs.items()}
            while pending:
                done, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    name = pending.pop(future)
                    code, err, took, cpu = future.result()
                    progress.finished(name, run_status(code), took)
                    if on_finish is not None:
                        on_finish(name, code, took, cpu)
                    if code != 0:
                        failed.append(f"{name}: {(err.strip().splitlines() or [''])[-1]}")
                progress.tick()
        ended = True
    finally:  # the worker processes end with the runs, and always when a stop or an error ends the call early
        if ended and pool is not None:
            pool.give_back(started_workers)
        else:
            close_all(started_workers)
    progress.close()
    if failed:
        raise ConfigError(what, f"{len(failed)} of {len(jobs)} runs failed: {'; '.join(failed)}")


class RunProgress:
    """Runs done out of ``total``: a line per finished run on stdout,
    ``[3/8] run002 method.mu=0.1: ok in 41 s (elapsed 02:05, ETA 03:28)``, and on a terminal a tqdm
    bar below them, ``sweep:  38%|███▊      | 3/8 [02:05, ETA 03:28]``, that those lines never break.

    ETA: with d the mean duration of the finished runs, each running run is expected to end d after
    it started (now at the earliest), and the runs still queued take d each on the first worker to
    come free; the ETA is when the last one ends. With parallel workers this is what the mean time
    per finished run (wall time / runs done) gets wrong: after the first of two simultaneous runs it
    would predict three more run-lengths for three runs, not one and a half."""

    def __init__(self, total: int, what: str, workers: int):
        self.total, self.workers, self.done = total, max(workers, 1), 0
        self.durations: list[float] = []
        self.running: dict[str, float] = {}  # name -> start time
        self.lock = threading.Lock()
        self.start = time.perf_counter()
        self.bar = tqdm(
            total=total,
            desc=what,
            unit="run",
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
            postfix="ETA ?",
            disable=True if total == 0 else None,
        )

    def started(self, name: str) -> float:
        now = time.perf_counter()
        with self.lock:
            self.running[name] = now
        return now

    def eta_seconds(self, now: float) -> float | None:
        if not self.durations:
            return None
        d = sum(self.durations) / len(self.durations)
        with self.lock:
            free = [max(start + d - now, 0.0) for start in self.running.values()]
        free += [0.0] * max(self.workers - len(free), 0)  # idle workers
        heapq.heapify(free)
        queued = self.total - self.done - len(self.running)
        for _ in range(max(queued, 0)):
            heapq.heappush(free, heapq.heappop(free) + d)
        return max(free)  # never empty: an entry per worker at least (workers >= 1)

    def eta(self, now: float) -> str:
        seconds = self.eta_seconds(now)
        return "?" if seconds is None else tqdm.format_interval(seconds)

    def finished(self, name: str, status: str, seconds: float) -> None:
        now = time.perf_counter()
        with self.lock:
            self.running.pop(name, None)
        self.done += 1
        self.durations.append(seconds)
        eta = self.eta(now)
        elapsed = tqdm.format_interval(now - self.start)
        tqdm.write(f"[{self.done}/{self.total}] {name}: {status} in {seconds:.0f} s (elapsed {elapsed}, ETA {eta})")
        sys.stdout.flush()
        self.bar.set_postfix_str(f"ETA {eta}", refresh=False)
        self.bar.update(1)

    def tick(self) -> None:
        """Redraw (the elapsed time and the ETA move while long runs are still going)."""
        self.bar.set_postfix_str(f"ETA {self.eta(time.perf_counter())}")

    def close(self) -> None:
        self.bar.close()


EXIT_MEANINGS = {EXIT_BAD_INPUT: "bad input", EXIT_DIVERGED: "training diverged"}  # pfl.cli's exit codes


def run_status(code: int) -> str:
    """A run's line in the progress table: ok only for exit code 0."""
    if code == 0:
        return "ok"
    return f"FAILED (exit {code}: {EXIT_MEANINGS.get(code, 'killed' if code < 0 else 'error')})"


def run_sweep(
    path: str | Path,
    count: int | None = None,
    workers: int = 1,
    root: Path | None = None,
    overrides: list[str] | None = None,
    fresh: bool = False,
    resume: Path | None = None,
) -> list[Path]:
    """Run every expanded run in ``workers`` processes (``fresh``: a new one per run), then save the
    table of their results beside them (``RESULTS``); returns their run directories. ``resume``: the
    folder of an earlier, interrupted call of the same sweep, continued (``continued``)."""
    require_workers(workers)
    if resume is not None:
        require(root is None, "--root", "is given with --resume, which names the sweep's folder itself", "drop --root")
        require(resume.is_dir(), "--resume", f"{resume} is not a folder", "give the folder of the sweep to continue")
        root = resume
    root = root or default_root(path)
    check_creatable(root, "--root")  # before the runs are parsed
    runs, root = plan(path, count, root, overrides)
    started = {r.name for r in runs if (root / r.name / "config.yaml").is_file()}
    if resume is None:
        kept = [r.name for r in runs if r.name in started and not r.overwrite]
        shown = ", ".join(kept[:3]) + (", ..." if len(kept) > 3 else "")
        require(
            not kept,
            "--root",
            f"{root} already holds runs named as this sweep's ({shown})",
            f"continue that sweep with --resume {root}, or choose another --root",
        )
    else:
        print(
            f"resuming the sweep in {root}: {len(started)} of {len(runs)} runs started there (finished ones are "
            "checked and kept, the others continue from their last checkpoint), the others start",
            flush=True,
        )
    root.mkdir(parents=True, exist_ok=True)
    labels = [r.name + " " + ", ".join(f"{k}={v}" for k, v in r.params.items()) for r in runs]
    argvs = [continued(r.argv, root / r.name) if resume and r.name in started else r.argv for r in runs]
    dirs = [root / r.name for r in runs]
    try:
        run_parallel(dict(zip(labels, argvs, strict=True)), workers, fresh=fresh)
    except ConfigError as failed:  # some runs failed: the table of those that finished is saved all the same
        finished = [d for d in dirs if (d / "summary.json").is_file()]
        if not finished:
            raise
        save_results(root, finished)
        fix = f"the table of the {len(finished)} runs that finished is in {root / 'results.md'}"
        raise ConfigError(failed.field, failed.problem, fix) from None
    save_results(root, dirs)
    return dirs


def continued(argv: list[str], folder: Path) -> list[str]:
    """A planned run's ``fit`` arguments as a resume of its ``folder``: the resume compares the planned
    settings with the recorded ones and refuses any it may not change (another sweep's run is not mixed
    in), says a finished run is finished without touching it, and continues an interrupted one from its
    last checkpoint (from the start where it wrote none)."""
    return [argv[0], "--resume", str(folder), *argv[1:]]


def save_results(root: Path, dirs: list[Path]) -> None:
    """The report's table of ``dirs`` as ``root/results.md`` and ``root/results.csv``."""
    for name, fmt in RESULTS.items():
        (root / name).write_text(report(dirs, fmt=fmt))
