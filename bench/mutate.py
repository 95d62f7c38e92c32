"""``make mutate``: mutation testing of pfl's update rules and their plumbing with mutmut's operators, fast.

``python -m bench.mutate [FILE ...] [--workers N] [--strings] [--report]``: with no FILE, every file
bench/mutate_targets.toml names, and every module of pfl/methods and pfl/optim.

mutmut 2 writes each mutant to disk and starts a fresh ``python -m pytest`` for it, so the ~5 s torch
import dominates every mutant. Here mutmut only generates the mutants (its standard operators, so the
counts mean what "mutmut" means). This parent imports the heavy third-party modules once, never
``pfl`` or the tests, and forks a child per mutant; the child serves the mutated source of that one
module from a ``sys.meta_path`` finder (nothing is written to disk, so workers can run side by side)
and runs ``pytest.main`` on the tests bench/mutate_targets.toml names for the file.

A mutant is killed when pytest exits non-zero, survives when it exits 0, and times out (counted with
the killed) past 3x the clean run + 30 s. A clean run with line tracing comes first: it must pass, and
mutants on statements it never executed are "not covered" and are not run. The clean run also notes
which test files executed each statement; a mutant's run takes those files first (the others after),
so pytest's -x stops a killed mutant's run sooner, while a survivor still runs every test. String and f-string
mutants are skipped unless ``--strings``: they change message text, not rules. Survivors with a reason
in bench/mutate_equivalent.toml are "explained" (equivalent mutants); the rest are "unexplained".

Results are cached in runs/mutation/cache.json per file, keyed by the file's content hash and mutmut's
mutant id (line, index in line): an edited file is mutated afresh, and when the tests change only the
survivors and timeouts are run again. Runs over different files may go at the same time: each writes
only its file's entry, under a lock. The report goes to stdout and runs/mutation/report.md.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import gc
import hashlib
import importlib.abc
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the toml package comes with mutmut
    import toml as tomllib

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "bench" / "mutate_targets.toml"
EXPLAINED = ROOT / "bench" / "mutate_equivalent.toml"
OUT = ROOT / "runs" / "mutation"
PACKAGES = ("pfl/methods", "pfl/optim")
# Imported once in the parent, inherited by every child; pfl and the tests are imported fresh per child.
HEAVY = (
    "numpy", "scipy", "torch", "torchvision", "torchmetrics", "lightning", "jsonargparse", "omegaconf",
    "yaml", "matplotlib.pyplot", "PIL", "sklearn", "sympy", "tqdm", "rich", "pytest",
)  # fmt: skip
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]
KILLED, TIMEOUT, SURVIVED, NOT_COVERED = "killed", "timeout", "survived", "not covered"


@dataclass
class Mutant:
    key: str  # mutmut's id: "line:index", the index counting mutants within the line
    line: int  # 1-based
    original: str
    mutated: str
    source: str = field(repr=False)


@dataclass
class Job:
    path: Path  # the source file under test
    args: list[str]  # pytest arguments selecting the tests
    log: Path
    mutant: Mutant | None = None  # None: the clean run
    trace: Path | None = None  # the clean run writes the executed lines here


# --- mutants ----------------------------------------------------------------------------------------


def generate(path: Path, strings: bool = False) -> list[Mutant]:
    """Every mutant mutmut 2 makes of ``path`` (``# pragma: no mutate`` lines excluded)."""
    from mutmut import Context, list_mutations, mutate, mutations_by_type

    types = set(mutations_by_type) - (set() if strings else {"string", "fstring"})
    config = SimpleNamespace(mutation_types_to_apply=types, covered_lines_by_filename=None)
    source = path.read_text()
    lines = source.split("\n")
    mutants = []
    for mid in list_mutations(Context(source=source, filename=str(path), config=config)):
        ctx = Context(source=source, mutation_id=mid, filename=str(path), config=config)
        mutated, _ = mutate(ctx)
        new = mutated.split("\n")
        line = mid.line_number
        shown = new[line] if line < len(new) else ""  # a multi-line statement mutated to one line: its start
        mutants.append(Mutant(f"{line + 1}:{mid.index}", line + 1, lines[line], shown, mutated))
    return mutants


def statement_spans(source: str) -> dict[int, tuple[int, int]]:
    """Line -> lines of the innermost statement holding it (a compound statement: its header).

    Tracing reports the lines where bytecode starts, so a constant on a continuation line counts as
    executed when any line of its statement ran.
    """
    spans: dict[int, tuple[int, int]] = {}
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)]
    for node in sorted(nodes, key=lambda n: (n.lineno, -(n.end_lineno or n.lineno))):  # outer first
        body = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
        end = min(c.lineno for c in body) - 1 if body else node.end_lineno or node.lineno
        for line in range(node.lineno, max(end, node.lineno) + 1):
            spans[line] = (node.lineno, max(end, node.lineno))
    return spans


def covered(mutant: Mutant, executed: set[int], spans: dict[int, tuple[int, int]]) -> bool:
    lo, hi = spans.get(mutant.line, (mutant.line, mutant.line))
    return any(line in executed for line in range(lo, hi + 1))


# --- the child: one pytest run, the module served from memory ---------------------------------------


class MutantFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``source`` for module ``name`` (with ``origin`` as its __file__); leaves the rest alone."""

    def __init__(self, name: str, origin: Path, source: str) -> None:
        self.name, self.origin, self.source = name, origin, source

    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201
        if fullname != self.name:
            return None
        spec = importlib.util.spec_from_loader(fullname, self, origin=str(self.origin))
        if self.origin.name == "__init__.py":  # a package: its submodules are still found in its folder
            spec.submodule_search_locations = [str(self.origin.parent)]
        spec.has_location = True  # sets __file__
        return spec

    def create_module(self, spec: object) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.source, str(self.origin), "exec"), module.__dict__)


def module_name(path: Path) -> str:
    """The import name of a source file; a package's ``__init__.py`` is imported as the package."""
    parts = path.resolve().relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class RunningTestFile:
    """A pytest plugin that knows which test file is running ("" while collecting, i.e. importing)."""

    def __init__(self) -> None:
        self.current = ""

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.current = nodeid.split("::")[0]


def start_tracing(path: Path, running: RunningTestFile) -> dict[str, set[int]]:
    """Lines of ``path`` executed from now on, per test file running (sys.settrace: the coverage
    package is not a dependency)."""
    target, lines, seen = str(path.resolve()), {}, {}

    def add(line: int) -> None:
        lines.setdefault(running.current, set()).add(line)

    def local(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "line":
            add(frame.f_lineno)
        return local

    def calls(frame, event, arg):  # noqa: ANN001, ANN202
        name = frame.f_code.co_filename
        if name not in seen:
            seen[name] = os.path.realpath(name) == target
        if seen[name]:
            add(frame.f_lineno)
            return local
        return None

    sys.settrace(calls)
    threading.settrace(calls)
    return lines


def child(job: Job, basetemp: Path) -> None:
    """Runs in the forked process; never returns."""
    code = 3
    try:
        os.setpgid(0, 0)  # the parent kills the whole group on a timeout
        gc.freeze()  # pytest's gc.collect() calls then skip the inherited heap (0.8 s each with torch loaded)
        fd = os.open(job.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115 - not whatever captured the parent's
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)  # noqa: SIM115
        os.chdir(ROOT)
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no plugins are used; scanning for them is slow
        if job.mutant is not None:
            sys.meta_path.insert(0, MutantFinder(module_name(job.path), job.path, job.mutant.source))
        running = RunningTestFile()
        lines = start_tracing(job.path, running) if job.trace else None
        code = int(pytest_main([*PYTEST_ARGS, f"--basetemp={basetemp}", *job.args], [running]))
        if lines is not None:
            sys.settrace(None)
            job.trace.write_text(json.dumps({file: sorted(executed) for file, executed in lines.items()}))
    except BaseException:  # noqa: BLE001 - report anything, then leave without running the parent's code
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def pytest_main(args: list[str], plugins: list[object]) -> int:
    import pytest

    return pytest.main(args, plugins=plugins)


# --- the parent: a pool of forked children ----------------------------------------------------------


def import_heavy() -> None:
    for name in HEAVY:
        with contextlib.suppress(ImportError):
            __import__(name)
    project = [m for m in sys.modules if m == "pfl" or m.startswith(("pfl.", "tests", "conftest", "methods_"))]
    assert not project, f"the parent must not import the project: {project}"


def slot_folders(workers: int) -> list[Path]:
    """pytest's ``--basetemp`` for each worker slot of this process's run: pytest empties it for every
    child that takes the slot, so a run holds one folder per slot, not one per mutant."""
    return [Path(tempfile.gettempdir()) / f"pfl-mutate-{os.getpid()}-{slot}" for slot in range(workers)]


def run_jobs(jobs: list[Job], workers: int, timeout: float) -> Iterator[tuple[Job, str, int, float]]:
    """Yields (job, status, exit code, seconds) as the children end; at most ``workers`` at a time. The
    slots' pytest folders are removed when the jobs end."""
    folders = slot_folders(workers)
    try:
        yield from _run_jobs(jobs, folders, timeout)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _run_jobs(jobs: list[Job], folders: list[Path], timeout: float) -> Iterator[tuple[Job, str, int, float]]:
    pending, running, free = list(jobs), {}, list(range(len(folders)))
    while pending or running:
        while pending and free:
            job, slot = pending.pop(0), free.pop()
            pid = os.fork()
            if pid == 0:
                child(job, folders[slot])
            running[pid] = (job, slot, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            job, slot, t0 = running.pop(pid)
            free.append(slot)
            code = os.waitstatus_to_exitcode(status)
            yield job, SURVIVED if code == 0 else KILLED, code, time.monotonic() - t0
            continue
        for pid, (job, slot, t0) in list(running.items()):
            if time.monotonic() - t0 > timeout:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
                free.append(slot)
                yield job, TIMEOUT, -signal.SIGKILL, time.monotonic() - t0
        time.sleep(0.01)


def first_failure(log: Path) -> str:
    """The test that killed a mutant, from pytest's short summary."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0][:200]
    return ""


# --- cache, targets, explanations -------------------------------------------------------------------


def sha(*texts: str) -> str:
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode())
    return h.hexdigest()[:16]


def tests_fingerprint(args: list[str]) -> str:
    """Changes with the selection or any file beside the selected tests: survivors are then run again."""
    dirs = {(ROOT / a.split("::")[0]).parent for a in args if not a.startswith("-")}
    files = sorted(f for d in dirs for f in d.glob("*.py"))
    return sha(json.dumps(args), *(f.read_text() for f in files))


def load_targets(path: Path = TARGETS) -> dict[str, list[str]]:
    return {file: entry["tests"] for file, entry in tomllib.loads(path.read_text()).items()}


def load_explained(path: Path = EXPLAINED) -> list[dict]:
    return tomllib.loads(path.read_text()).get("equivalent", []) if path.exists() else []


def explanation(file: str, result: dict, explained: list[dict]) -> str | None:
    """The reason a survivor is equivalent: matched on file + line + mutated text, or, after edits
    moved the line, on file + original and mutated text."""
    mutated, original = result["mutated"].strip(), result["original"].strip()
    same = [e for e in explained if e["file"] == file and e["mutant"].strip() == mutated]
    for e in same:
        if e.get("line") == result["line"]:
            return e["reason"]
    moved = [e for e in same if e.get("original", original).strip() == original]
    return moved[0]["reason"] if len(moved) == 1 else None


def load_cache(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save_entry(path: Path, cache: dict, rel: str, entry: dict) -> None:
    """Writes one file's entry: re-reads the cache under a lock and replaces only that entry, so runs
    over different files at the same time (two shells, two workers' make mutate) keep each other's results."""
    cache[rel] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        on_disk = load_cache(path)
        on_disk[rel] = entry
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(on_disk, indent=1, sort_keys=True))
        tmp.replace(path)
    cache.update({k: v for k, v in on_disk.items() if k != rel})


class CleanRunFailed(Exception):
    """The tests fail (or select nothing) on the unmutated code: the file's mutants mean nothing."""


# --- one file ---------------------------------------------------------------------------------------


def clean_run(path: Path, args: list[str], log_dir: Path) -> tuple[dict[str, set[int]], float]:
    """Runs the tests on the unmutated code with line tracing: the lines each test file executed
    ("" for those run while collecting) and seconds."""
    job = Job(path, args, log_dir / "clean.log", trace=log_dir / "clean.lines.json")
    ((_, status, code, seconds),) = run_jobs([job], 1, timeout=3600)
    if code != 0:
        tail = "\n".join(job.log.read_text(errors="replace").splitlines()[-30:])
        raise CleanRunFailed(f"{path}: the tests fail on the unmutated code (exit {code}); nothing mutated.\n{tail}")
    return {file: set(lines) for file, lines in json.loads(job.trace.read_text()).items()}, seconds


def covering_first(
    mutant: Mutant, args: list[str], by_file: dict[str, set[int]], spans: dict[int, tuple[int, int]]
) -> list[str]:
    """The target's test files that executed the mutant's statement first, the rest after, each group
    in the target's order. pytest runs files in the order given and -x stops at the first failure, so a
    killed mutant is killed sooner; a survivor still runs every test, so no verdict changes. A target
    with options (anything but test paths) keeps its order."""
    if any(a.startswith("-") for a in args):
        return args
    ran = {file for file, lines in by_file.items() if file and covered(mutant, lines, spans)}
    first = [a for a in args if a.split("::")[0] in ran]
    return [*first, *(a for a in args if a not in first)]


def mutate_file(path: Path, args: list[str], cache: dict, cache_path: Path, workers: int, strings: bool) -> dict:
    rel = str(path.resolve().relative_to(ROOT))
    source = path.read_text()
    fingerprint = tests_fingerprint(args)
    entry = cache.get(rel, {})
    if entry.get("source") != source_key(source, strings):
        entry = {"source": source_key(source, strings), "results": {}}
    # Killed stays killed as tests are added; survivors and timeouts are run again when the tests change.
    reuse = (KILLED, TIMEOUT, SURVIVED) if entry.get("tests") == fingerprint else (KILLED,)
    old = {k: r for k, r in entry["results"].items() if r["status"] in reuse}
    t0 = time.monotonic()
    log_dir = OUT / "logs" / rel.replace("/", ".")
    log_dir.mkdir(parents=True, exist_ok=True)
    by_file, clean_s = clean_run(path, args, log_dir)
    executed = set().union(*by_file.values())
    timeout = 3 * clean_s + 30
    spans = statement_spans(source)
    mutants = generate(path, strings)
    results: dict[str, dict] = {}
    jobs = []
    for m in mutants:
        base = {"line": m.line, "original": m.original, "mutated": m.mutated}
        if not covered(m, executed, spans):
            results[m.key] = {**base, "status": NOT_COVERED}
        elif m.key in old and old[m.key]["mutated"] == m.mutated:
            results[m.key] = old[m.key]
        else:
            ordered = covering_first(m, args, by_file, spans)
            jobs.append(Job(path, ordered, log_dir / f"{m.key.replace(':', '_')}.log", mutant=m))
    print(f"{rel}: {len(mutants)} mutants, {len(jobs)} to run (clean run {clean_s:.1f} s)", flush=True)
    entry.update(tests=fingerprint, args=args, clean_s=round(clean_s, 2))
    for n, (job, status, code, seconds) in enumerate(run_jobs(jobs, workers, timeout), 1):
        m = job.mutant
        killer = first_failure(job.log) if status == KILLED else ""
        results[m.key] = {"line": m.line, "original": m.original, "mutated": m.mutated, "status": status,
                          "exit": code, "seconds": round(seconds, 2), "killer": killer}  # fmt: skip
        if status != SURVIVED:
            job.log.unlink(missing_ok=True)  # survivors' logs stay for inspection
        print(f"  [{n}/{len(jobs)}] {m.line}: {status:8s} {seconds:5.1f} s  {m.mutated.strip()[:90]}", flush=True)
        if n % 10 == 0:
            entry["results"] = {**entry["results"], **results}
            save_entry(cache_path, cache, rel, entry)
    entry["results"] = results
    entry["wall_s"] = round(time.monotonic() - t0, 1)
    save_entry(cache_path, cache, rel, entry)
    return entry


def source_key(source: str, strings: bool) -> str:
    return sha(source, f"strings={strings}")


# --- report -----------------------------------------------------------------------------------------


def summary(rel: str, entry: dict, explained: list[dict]) -> tuple[dict, list[tuple[dict, str | None]]]:
    results = list(entry["results"].values())
    count = {s: sum(r["status"] == s for r in results) for s in (KILLED, TIMEOUT, SURVIVED, NOT_COVERED)}
    survivors = [(r, explanation(rel, r, explained)) for r in results if r["status"] == SURVIVED]
    survivors.sort(key=lambda s: s[0]["line"])
    count["explained"] = sum(reason is not None for _, reason in survivors)
    count["generated"] = len(results)
    return count, survivors


def report(cache: dict, files: list[str], explained: list[dict]) -> str:
    head = "| file | generated | killed | timeout | survived | explained | unexplained | not covered | wall s |"
    rows = [head, "|" + "---|" * 9]
    details, total = [], dict.fromkeys(("generated", KILLED, TIMEOUT, SURVIVED, "explained", NOT_COVERED), 0)
    wall = 0.0
    for rel in files:
        if rel not in cache:
            continue
        entry = cache[rel]
        count, survivors = summary(rel, entry, explained)
        for k in total:
            total[k] += count[k]
        wall += entry.get("wall_s", 0)
        rows.append(
            f"| {rel} | {count['generated']} | {count[KILLED]} | {count[TIMEOUT]} | {count[SURVIVED]} | "
            f"{count['explained']} | {count[SURVIVED] - count['explained']} | {count[NOT_COVERED]} | "
            f"{entry.get('wall_s', '')} |"
        )
        for r, reason in survivors:
            mark = f"explained: {reason}" if reason else "UNEXPLAINED"
            details.append(f"- `{rel}:{r['line']}`  `{r['original'].strip()}` → `{r['mutated'].strip()}`  ({mark})")
        uncovered = [r for r in entry["results"].values() if r["status"] == NOT_COVERED]
        for r in sorted(uncovered, key=lambda r: r["line"]):
            details.append(f"- `{rel}:{r['line']}`  not covered: `{r['mutated'].strip()}`")
    rows.append(
        f"| **total** | {total['generated']} | {total[KILLED]} | {total[TIMEOUT]} | {total[SURVIVED]} | "
        f"{total['explained']} | {total[SURVIVED] - total['explained']} | {total[NOT_COVERED]} | {wall:.0f} |"
    )
    note = (
        "mutmut 2 operators; string and f-string mutants skipped (message text, not rules) unless --strings. "
        "Timeouts count as killed. Not covered: the statement never ran under the file's tests (not run)."
    )
    return "\n".join(["# Mutation testing (`make mutate`)", "", note, "", *rows, "", "## Survivors and uncovered", "",
                      *details, ""])  # fmt: skip


def default_files(targets: Path = TARGETS) -> list[Path]:
    """What a run with no files mutates: every file with a target, and every module of PACKAGES (one
    without a target is reported as skipped, so a new method file cannot go unmutated unnoticed)."""
    modules = {p for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py") if p.name != "__init__.py"}
    return sorted(modules | {ROOT / rel for rel in load_targets(targets)})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "every file of the targets, and pfl/methods and pfl/optim"
    parser.add_argument("files", nargs="*", type=Path, help=f"source files (default: {default})")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--strings", action="store_true", help="mutate string and f-string literals too")
    parser.add_argument("--report", action="store_true", help="only print the report of the cached results")
    parser.add_argument("--cache", type=Path, default=OUT / "cache.json")
    parser.add_argument("--targets", type=Path, default=TARGETS)
    args = parser.parse_args(argv)
    files = [p.resolve() for p in args.files] or default_files(args.targets)
    rels = [str(p.relative_to(ROOT)) for p in files]
    cache = load_cache(args.cache)
    if not args.report:
        targets = load_targets(args.targets)
        missing = [r for r in rels if r not in targets]
        if missing and args.files:
            raise SystemExit(f"no tests mapped for {', '.join(missing)}: add them to {args.targets}")
        import_heavy()
        failed = []
        for path, rel in zip(files, rels, strict=True):
            if rel not in targets:
                print(f"{rel}: skipped, no tests mapped in {args.targets.name}", flush=True)
                continue
            try:
                mutate_file(path, targets[rel], cache, args.cache, args.workers, args.strings)
            except CleanRunFailed as err:  # the other files still count
                print(err, flush=True)
                failed.append(rel)
    cache = load_cache(args.cache)  # with what runs over other files wrote meanwhile
    explained = load_explained()
    everything = [str(p.relative_to(ROOT)) for p in default_files(args.targets)]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.md").write_text(report(cache, everything + [r for r in rels if r not in everything], explained))
    print(report(cache, rels, explained))
    if not args.report and failed:
        raise SystemExit(f"clean run failed, not mutated: {', '.join(failed)}")


if __name__ == "__main__":
    main()
