"""Warm worker processes: many ``python -m pfl ...`` runs in one long-lived process each.

A sweep or the reproduction suite runs hundreds of short runs; started one process per run, each pays
Python's, torch's and Lightning's start-up again (about 6 CPU-s on a small CPU, more where a GPU is
initialised), often more than a short run trains. A warm worker imports once and then runs one command
after another in its own process, exactly as ``python -m pfl`` would: the same exit codes, stdout
discarded, stderr kept per run, CPU seconds measured per run. The runs' numbers do not depend on it:
every random draw in pfl is keyed by (seed, round, client, purpose) (``pfl.seeding``) and a run sets
and restores its torch threads itself, so what an earlier run in the same process did changes nothing.

Isolation where it matters: a worker that dies (killed, out of memory, a crash in native code) reports
the run as failed with its signal, and a fresh worker takes the next run; after a run that ended in an
unexpected exception, and after ``max_runs`` runs (memory that a library never gives back), the worker
is replaced too. ``fresh=True`` starts one process per run, as before.

Protocol: the parent writes one JSON line per run to the worker's stdin (the argv and the path of the
run's stderr file); the worker answers one JSON line (exit code, CPU seconds) on the file descriptor
that was its stdout, whose descriptor 1 is then ``/dev/null``, so nothing a run prints can break it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import IO, Any

from pfl.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, require

MAX_RUNS = 40  # per worker process, then a fresh one (bounds what leaks across runs)
STDERR_LIMIT = 20_000  # characters of a run's stderr kept for its error line
CLEAN_EXITS = (0, EXIT_BAD_INPUT, EXIT_DIVERGED)  # pfl.cli's own verdicts: the process is sound


def require_workers(workers: int) -> None:
    """Refuse a number of worker processes below 1 (``--workers`` of ``pfl sweep`` and ``pfl reproduce``),
    before anything runs."""
    require(workers >= 1, "--workers", f"{workers} is not a number of worker processes", "give 1 or more")


def run_child(argv: list[str], env: dict[str, str]) -> tuple[int, str, float | None]:
    """Run ``argv`` in a process of its own to its end: (exit code, its stderr, its CPU seconds: user +
    system of the process and the children it waited for; None where ``os.wait4`` does not exist).
    Stdout is discarded."""
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        if not hasattr(os, "wait4"):
            code, cpu = proc.wait(), None
        else:
            _, status, usage = os.wait4(proc.pid, 0)
            code = proc.returncode = os.waitstatus_to_exitcode(status)
            cpu = usage.ru_utime + usage.ru_stime
        err.seek(0)
        return code, err.read(), cpu


class WarmWorker:
    """One long-lived ``python -m pfl.runner.warm_workers`` process that runs ``pfl`` commands in turn;
    ``fresh`` runs each command in a process of its own instead. Not thread-safe: one per thread."""

    def __init__(self, env: dict[str, str], fresh: bool = False, max_runs: int = MAX_RUNS):
        self.env, self.fresh, self.max_runs = env, fresh, max_runs
        self.proc: subprocess.Popen[str] | None = None
        self.log: IO[str] | None = None  # the worker's own stderr (outside runs): why it could not start
        self.runs = 0

    def run(self, argv: list[str]) -> tuple[int, str, float | None]:
        """``python -m pfl ARGV``: (exit code, stderr, CPU seconds or None)."""
        if self.fresh:
            return run_child([sys.executable, "-m", "pfl", *argv], self.env)
        proc = self._ready()
        with tempfile.NamedTemporaryFile(mode="w+", prefix="pfl-run-", suffix=".err", delete=False) as err:
            err_path = Path(err.name)
        try:
            answer = self._ask(proc, {"argv": argv, "stderr": str(err_path)})
            text = err_path.read_text(errors="replace")[-STDERR_LIMIT:]
        finally:
            err_path.unlink(missing_ok=True)
        self.runs += 1
        if answer is None:  # the worker died during the run: its signal (negative) or exit status
            code = proc.wait()
            text += self._log_text()
            self.close()
            return (code if code != 0 else 1), text, None
        if answer["code"] not in CLEAN_EXITS or self.runs >= self.max_runs or answer.get("unsound"):
            self.close()
        return answer["code"], text, answer["cpu"]

    def _ready(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the worker)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pfl.runner.warm_workers"],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                text=True,
            )
            self.runs = 0
        return self.proc

    def _log_text(self) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read()[-STDERR_LIMIT:]

    @staticmethod
    def _ask(proc: subprocess.Popen[str], request: dict[str, Any]) -> dict[str, Any] | None:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return None
        line = proc.stdout.readline()
        return json.loads(line) if line else None

    def close(self) -> None:
        """End the worker process (it exits when its stdin closes)."""
        _reap(self._release())

    def _release(self) -> subprocess.Popen[str] | None:
        """Let the worker process go: its stdin closed (it starts exiting), the process to wait for."""
        proc, self.proc = self.proc, None
        if self.log is not None:
            self.log.close()
            self.log = None
        if proc is None:
            return None
        with contextlib.suppress(BrokenPipeError, OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        return proc


def close_all(workers: list[WarmWorker]) -> None:
    """End every worker: each one's stdin is closed before any is waited for, so they exit side by side
    (each exit frees its run's memory, a CUDA context, W&B's service) instead of one after another."""
    for proc in [worker._release() for worker in workers]:
        _reap(proc)


class WorkerPool:
    """Warm workers kept from one ``run_parallel`` call to the next (the reproduction suite's phases: its
    lr grid, the grid's edge steps, its claims' runs): a worker whose call ended waits here for the next
    call with the same environment instead of exiting and being started again, and every worker waiting
    ends when the pool closes. Thread-safe; a context manager."""

    def __init__(self) -> None:
        self._idle: dict[tuple[tuple[str, str], ...], list[WarmWorker]] = {}
        self._lock = threading.Lock()

    def take(self, env: dict[str, str]) -> WarmWorker:
        """A waiting worker started with ``env``, or a new one."""
        with self._lock:
            waiting = self._idle.get(_env_key(env))
            return waiting.pop() if waiting else WarmWorker(env)

    def give_back(self, workers: list[WarmWorker]) -> None:
        """``workers``, whose runs have ended, wait for the next call."""
        with self._lock:
            for worker in workers:
                self._idle.setdefault(_env_key(worker.env), []).append(worker)

    def close(self) -> None:
        """End every waiting worker."""
        with self._lock:
            waiting = [worker for workers in self._idle.values() for worker in workers]
            self._idle.clear()
        close_all(waiting)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _env_key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(env.items()))


def _reap(proc: subprocess.Popen[str] | None) -> None:
    """Wait for a released worker process to exit (killed if it has not within 30 s)."""
    if proc is None:
        return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_one(argv: list[str], stderr_path: str) -> dict[str, Any]:
    """Run ``python -m pfl ARGV`` in this process (``runpy``, as the interpreter's ``-m`` does) with its
    stderr (Python's and native code's) in ``stderr_path``: its exit code and its CPU seconds."""
    saved = os.dup(2)
    start = _cpu_seconds()
    with open(stderr_path, "w") as err:
        os.dup2(err.fileno(), 2)
        sys.argv = ["pfl", *argv]
        try:
            runpy.run_module("pfl", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:  # how ``python -m pfl`` ends, with its exit code
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except Exception:  # what an uncaught exception does to ``python -m pfl``: a traceback, exit 1
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
    released = release_memory()
    # the run stands; a worker whose allocator is broken is not lent another one
    return {"code": code, "cpu": _cpu_seconds() - start, "unsound": not released}


def release_memory() -> bool:
    """Give back what the run left: its objects (cycles included) and, where it used a GPU, the blocks
    torch's caching allocator keeps, so that workers sharing one card hold only what their runs use.
    False where the allocator refused: after a failed CUDA graph capture some torch versions keep it
    marked as capturing, and every later ``empty_cache`` raises."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            return False
    return True


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Answer each request line with its run's result line, until the requests end."""
    for line in requests:
        request = json.loads(line)
        answers.write(json.dumps(run_one(request["argv"], request["stderr"])) + "\n")
        answers.flush()


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # a run's prints (and native code's) go nowhere, never into the answers
    os.close(devnull)
    serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
