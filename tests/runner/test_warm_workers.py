"""Tests of pfl/runner/warm_workers.py: runs in a warm worker process give what a process per run gives."""

from __future__ import annotations

import gc
import io
import json
import os
import resource
import signal
import subprocess
import sys
import types
import weakref

import pytest

import pfl.cli
import pfl.runner.sweep as sweep
import pfl.runner.warm_workers as warm_workers
from pfl.errors import ConfigError
from pfl.runner.warm_workers import (
    WarmWorker,
    WorkerPool,
    close_all,
    release_memory,
    require_workers,
    run_child,
    run_one,
    serve,
)
from tests.helpers.cli_runs import TINY, child_env


def _argv(root, name, *extra):
    return ["fit", *TINY, "--tracking.root", str(root), "--tracking.name", name, *extra]


def _metrics(root, name):
    """The run's numbers (its measured times left out)."""
    metrics = json.loads((root / name / "summary.json").read_text())["metrics"]
    return {k: v for k, v in metrics.items() if not k.startswith(("time.", "throughput."))}


def test_runs_after_one_another_in_one_process_give_the_numbers_of_a_process_per_run(tmp_path):
    """Ditto, then bad input (exit 2, its line, the process kept), then FedProx on another seed and Ditto
    again, all in one process; FedProx's numbers equal those of a process of its own."""
    warm = WarmWorker(child_env())
    try:
        runs = {"a": ["--method", "ditto"], "bad": ["--client.lr", "-1"]}
        runs |= {"b": ["--method", "fedprox", "--seed", "1"], "c": ["--method", "ditto"]}
        pids, codes = set(), {}
        for name, extra in runs.items():
            codes[name], err, cpu = warm.run(_argv(tmp_path / "warm", name, *extra))
            assert cpu is not None and cpu > 0
            pids.add(warm.proc.pid)
    finally:
        warm.close()
    assert codes == {"a": 0, "bad": 2, "b": 0, "c": 0}
    assert len(pids) == 1  # one process ran them all
    code, err, _ = WarmWorker(child_env(), fresh=True).run(_argv(tmp_path / "fresh", "b", *runs["b"]))
    assert code == 0, err
    assert _metrics(tmp_path / "warm", "b") == _metrics(tmp_path / "fresh", "b")
    assert _metrics(tmp_path / "warm", "a") == _metrics(tmp_path / "warm", "c")


def test_a_failed_process_is_replaced_and_reported_as_python_m_pfl_would_end(tmp_path):
    """A worker killed during a run reports its signal; an unexpected exception is exit 1 with its
    traceback and the worker is replaced (it may be in any state); bad input keeps the worker."""
    w = WarmWorker(child_env())
    try:
        code, err, cpu = w.run(_argv(tmp_path, "k", "--method.class_path", "tests.helpers.crashing.KilledMethod"))
        assert (code, cpu, w.proc) == (-signal.SIGKILL, None, None)
        assert "killed while building the method" in err  # what the run wrote before it died
        code, err, _ = w.run(_argv(tmp_path, "bad", "--client.lr", "-1"))
        pid = w.proc.pid
        assert code == 2 and "client.lr" in err.splitlines()[-1]
        code, err, _ = w.run(_argv(tmp_path, "r", "--method.class_path", "tests.helpers.crashing.RaisingMethod"))
        assert w.proc is None and code == 1
        assert "Traceback" in err and "an unexpected failure inside a user's method" in err
        assert "client.lr" not in err  # each run's stderr is its own
        code, _, cpu = w.run(_argv(tmp_path, "e", "--method.class_path", "tests.helpers.crashing.ExitingMethod"))
        assert (code, cpu, w.proc) == (1, None, None)  # ended without an answer: a failed run, even on status 0
        assert w.run(["methods"])[0] == 0 and w.proc.pid != pid
    finally:
        w.close()


def test_a_number_of_workers_below_one_is_refused_in_one_line_naming_the_option():
    require_workers(1)  # the least: one worker process
    for workers in (0, -1):
        with pytest.raises(ConfigError) as refused:
            require_workers(workers)
        assert str(refused.value) == f"--workers: {workers} is not a number of worker processes (give 1 or more)"


def test_a_worker_is_replaced_after_max_runs():
    w = WarmWorker(child_env(), max_runs=2)
    try:
        assert w.run(["methods"])[0] == 0
        pid = w.proc.pid
        assert w.run(["methods"])[0] == 0 and w.proc is None
        assert w.run(["methods"])[0] == 0 and w.proc.pid != pid
    finally:
        w.close()


def test_a_worker_that_cannot_start_says_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = WarmWorker(child_env(PYTHONPATH=str(tmp_path)))  # a pfl that cannot be imported
    (tmp_path / "pfl").mkdir()
    (tmp_path / "pfl" / "__init__.py").write_text("raise ImportError('this pfl is broken')\n")
    try:
        code, err, cpu = w.run(["methods"])
        assert (code, cpu) == (1, None) and err.startswith("Traceback") and "this pfl is broken" in err
    finally:
        w.close()


class _Pipe:
    def __init__(self, events: list[str], what: str):
        self.events, self.what = events, what

    def close(self) -> None:
        self.events.append(self.what)


class _Process:
    """A worker process's handles, noting what is done to them; ``stuck``: it does not exit in time."""

    def __init__(self, events: list[str], name: str, stuck: bool = False):
        self.events, self.name, self.stuck = events, name, stuck
        self.stdin, self.stdout = _Pipe(events, f"stdin {name}"), _Pipe(events, f"stdout {name}")

    def wait(self, timeout: float | None = None) -> int:
        self.events.append(f"wait {self.name}" + ("" if timeout is None else f" {timeout:g} s"))
        if self.stuck and timeout is not None:
            raise subprocess.TimeoutExpired("worker", timeout)
        return 0

    def kill(self) -> None:
        self.events.append(f"kill {self.name}")


def _workers(events: list[str], stuck: str = "") -> list[WarmWorker]:
    workers = [WarmWorker({}) for _ in "abc"]
    for worker, name in zip(workers, "abc", strict=True):
        worker.proc = _Process(events, name, stuck=name == stuck)
        worker.log = _Pipe(events, f"log {name}")
    return workers


def test_a_pool_closes_every_workers_stdin_before_it_waits_for_any():
    events: list[str] = []
    workers = _workers(events, stuck="b")
    close_all([*workers, WarmWorker({})])  # one that never started a process: nothing to end
    assert events == [
        "log a", "stdin a", "log b", "stdin b", "log c", "stdin c",  # all asked to exit, then each waited for
        "wait a 30 s", "stdout a",
        "wait b 30 s", "kill b", "wait b", "stdout b",  # one that does not exit in time is killed
        "wait c 30 s", "stdout c",
    ]  # fmt: skip
    assert all(w.proc is None and w.log is None for w in workers)
    events.clear()
    workers[0].close()  # closed twice: nothing more
    assert events == []


def test_one_worker_closes_as_one_of_a_pool_would():
    events: list[str] = []
    _workers(events, stuck="a")[0].close()
    assert events == ["log a", "stdin a", "wait a 30 s", "kill a", "wait a", "stdout a"]


class _Worker:
    """A warm worker without a process: counts its runs; a run given ``--bad`` exits with 2, as pfl's would."""

    made: list[_Worker] = []

    def __init__(self, env, fresh=False):
        self.env, self.fresh, self.runs = env, fresh, 0
        _Worker.made.append(self)

    def run(self, argv):
        self.runs += 1
        return (2 if "--bad" in argv else 0), "error: --bad", 0.1


@pytest.fixture
def fake_workers(monkeypatch) -> list[list]:
    """Warm workers without processes; what ``close_all`` is called with, call by call."""
    closed: list[list] = []
    _Worker.made = []
    for module in (sweep, warm_workers):
        monkeypatch.setattr(module, "WarmWorker", _Worker)
        monkeypatch.setattr(module, "close_all", lambda workers: closed.append(list(workers)))
    return closed


def test_a_pools_workers_are_closed_together_when_its_runs_end(fake_workers):
    sweep.run_parallel({"x": ["methods"], "y": ["methods"]}, workers=2)
    [workers] = fake_workers
    assert workers and all(isinstance(w, _Worker) for w in workers)


def test_each_finished_run_is_reported_with_its_code_wall_seconds_and_cpu_seconds(fake_workers):
    ended = []
    with pytest.raises(ConfigError, match=r"^sweep: 1 of 2 runs failed: b: error: --bad$"):
        sweep.run_parallel({"a": ["methods"], "b": ["fit", "--bad"]}, on_finish=lambda *got: ended.append(got))
    assert sorted((name, code, cpu) for name, code, _, cpu in ended) == [("a", 0, 0.1), ("b", 2, 0.1)]
    assert all(0 <= wall < 60 for _, _, wall, _ in ended)  # the run's own seconds, from its start


def test_the_cores_are_split_between_the_workers_one_by_default(fake_workers, monkeypatch):
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: 4)
    sweep.run_parallel({"x": ["methods"]})
    sweep.run_parallel({"y": ["methods"]}, workers=3)
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: None)  # not known: one core
    sweep.run_parallel({"z": ["methods"]})
    assert [w.env["OMP_NUM_THREADS"] for w in _Worker.made] == ["4", "1", "1"]  # 4 // 3 cores each


def test_a_pools_workers_serve_its_next_calls_and_end_when_it_closes(fake_workers):
    pool = WorkerPool()
    sweep.run_parallel({"a": ["methods"], "b": ["methods"]}, pool=pool)
    sweep.run_parallel({"c": ["methods"]}, what="next", pool=pool)
    [worker] = _Worker.made
    assert worker.runs == 3 and fake_workers == []  # one process served both calls, none ended
    with pool:
        pass  # the pool closes on leaving
    assert fake_workers == [[worker]]
    sweep.run_parallel({"d": ["methods"]})  # without a pool: the call's workers end with it
    assert len(_Worker.made) == 2 and fake_workers[1] == [_Worker.made[1]]


def test_a_pool_lends_a_worker_only_to_a_call_with_its_environment(fake_workers):
    pool = WorkerPool()
    first = pool.take({"OMP_NUM_THREADS": "2"})
    pool.give_back([first])
    assert pool.take({"OMP_NUM_THREADS": "1"}) is not first  # another share of the cores: another process
    assert pool.take({"OMP_NUM_THREADS": "2"}) is first
    assert pool.take({"OMP_NUM_THREADS": "2"}) is not first  # lent once: no longer waiting
    pool.close()
    assert fake_workers == [[]]


def test_a_call_that_stops_early_ends_its_workers_and_one_whose_runs_failed_keeps_them(fake_workers):
    pool = WorkerPool()

    def stop(name, code, wall, cpu):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run_parallel({"a": ["methods"]}, on_finish=stop, pool=pool)
    assert fake_workers == [[_Worker.made[0]]]  # it may be in the middle of a run: ended, not kept
    with pytest.raises(ConfigError, match="1 of 1 runs failed"):
        sweep.run_parallel({"b": ["fit", "--bad"]}, pool=pool)
    failed = _Worker.made[1]  # a new one: the stopped call's worker was not kept
    sweep.run_parallel({"c": ["methods"]}, pool=pool)
    assert len(_Worker.made) == 2 and failed.runs == 2  # a run that failed leaves its worker sound: kept
    pool.close()
    assert fake_workers[-1] == [failed]


def test_a_process_per_run_keeps_nothing_in_the_pool(fake_workers):
    pool = WorkerPool()
    sweep.run_parallel({"a": ["methods"]}, fresh=True, pool=pool)
    [fresh] = _Worker.made
    assert fresh.fresh and fake_workers == [[fresh]]
    pool.close()
    assert fake_workers[-1] == []


def test_after_a_run_its_cycles_are_collected_and_a_gpus_cached_blocks_given_back(monkeypatch):
    class Node:
        pass

    node = Node()
    node.me = node  # a cycle: only the collector frees it
    alive = weakref.ref(node)
    del node
    emptied = []
    cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=lambda: emptied.append(True))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    gc.disable()  # no automatic collection in between
    try:
        release_memory()
    finally:
        gc.enable()
    assert alive() is None and emptied == [True]
    cuda.is_initialized = lambda: False  # a run that never touched the GPU
    release_memory()
    assert emptied == [True]


def test_a_worker_whose_gpu_allocator_refuses_to_give_back_reports_its_run_and_is_replaced(tmp_path, monkeypatch):
    def refuse():  # what torch does after a failed capture left the allocator marked as capturing
        raise RuntimeError("captures_underway.empty() INTERNAL ASSERT FAILED")

    cuda = types.SimpleNamespace(is_initialized=lambda: True, empty_cache=refuse)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert release_memory() is False
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(pfl.cli, "main", _ends_with(0))
    answer = run_one(["methods"], str(tmp_path / "err"))
    assert answer["code"] == 0 and answer["unsound"] is True  # the run stands
    cuda.empty_cache = lambda: None
    assert release_memory() is True and run_one(["methods"], str(tmp_path / "err"))["unsound"] is False

    # the pool's side: the run's result is returned and that worker is not lent another run
    class Proc:
        pid, stdin = 1, None

        def poll(self):
            return None

    def lent_again(unsound: bool) -> bool:
        w, closed = WarmWorker(child_env()), []
        monkeypatch.setattr(w, "_ready", Proc)
        answer = {"code": 0, "cpu": 1.5, "unsound": unsound}
        monkeypatch.setattr(WarmWorker, "_ask", staticmethod(lambda proc, request: answer))
        monkeypatch.setattr(w, "close", lambda: closed.append(True))
        assert w.run(["methods"]) == (0, "", 1.5)
        return not closed

    assert lent_again(False) and not lent_again(True)


def test_a_process_per_run_reports_its_exit_code_whole_stderr_and_user_plus_system_seconds(tmp_path):
    busy = (
        "import os, sys\n"
        f"for i in range(3000):\n    open({str(tmp_path / 'f')!r}, 'w').write(str(i))\n"  # system time
        "sum(range(3 * 10**6))\n"  # user time
        "sys.stderr.write('first line\\nlast line')\n"
        "sys.exit(3)\n"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, err, cpu = run_child([sys.executable, "-c", busy], dict(os.environ))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert (code, err) == (3, "first line\nlast line")
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    assert system > 0 and cpu == pytest.approx(user + system, abs=1e-4)  # timevals summed in floats
    code, _, _ = run_child([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], {})
    assert code == -signal.SIGKILL


def _ends_with(outcome):
    def main(argv=None):
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return main


@pytest.mark.parametrize(
    ("outcome", "code"),
    [(4, 4), (SystemExit(5), 5), (SystemExit(None), 0), (SystemExit("bye"), 1), (RuntimeError("boom"), 1)],
)
def test_a_run_in_the_worker_ends_with_the_code_python_m_pfl_would(tmp_path, monkeypatch, capsys, outcome, code):
    """(capsys.disabled: stderr is the process's descriptor 2, as in a worker.)"""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(pfl.cli, "main", _ends_with(outcome))
    err = tmp_path / "err"
    with capsys.disabled(), open(tmp_path / "own", "w") as own_file:
        # descriptor 2 on a file of this test's own: no other descriptor of the process is that file
        kept = os.dup(2)
        os.dup2(own_file.fileno(), 2)
        try:
            own = os.fstat(2)
            result = run_one(["methods"], str(err))
            after = os.fstat(2)
        finally:
            os.dup2(kept, 2)
            os.close(kept)
    assert (after.st_dev, after.st_ino) == (own.st_dev, own.st_ino)  # descriptor 2 is this process's own again
    assert result["code"] == code and result["cpu"] >= 0
    assert ("Traceback" in err.read_text() and "boom" in err.read_text()) == isinstance(outcome, RuntimeError)


def test_a_run_in_the_worker_writes_its_stderr_to_its_own_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    first, second = tmp_path / "a", tmp_path / "b"
    with capsys.disabled():
        assert run_one(["nonsense"], str(first))["code"] == 2
        monkeypatch.setattr(pfl.cli, "main", _ends_with(0))  # a run that writes nothing
        assert run_one(["methods"], str(second))["code"] == 0
    assert "unknown command 'nonsense'" in first.read_text() and second.read_text() == ""


def test_the_worker_answers_each_request_with_a_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    requests = io.StringIO(
        json.dumps({"argv": ["methods"], "stderr": str(tmp_path / "a")})
        + "\n"
        + json.dumps({"argv": ["nonsense"], "stderr": str(tmp_path / "b")})
        + "\n"
    )
    answers = io.StringIO()
    serve(requests, answers)
    assert [json.loads(line)["code"] for line in answers.getvalue().splitlines()] == [0, 2]


def test_a_run_in_the_worker_counts_its_own_and_its_childrens_user_and_system_seconds(tmp_path, monkeypatch):
    def busy(argv=None):
        for i in range(3000):  # system time
            (tmp_path / "f").write_text(str(i))
        sum(range(2 * 10**6))  # user time
        child = f"for i in range(3000): open({str(tmp_path / 'g')!r}, 'w').write(str(i))\nsum(range(4 * 10**6))"
        subprocess.run([sys.executable, "-c", child], check=True)  # a child's user and system time
        return 0

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(pfl.cli, "main", busy)
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = run_one(["methods"], str(tmp_path / "err"))["cpu"]
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    parts = {
        f"{who}.{field}": getattr(a, field) - getattr(b, field)
        for who, b, a in zip(("self", "children"), before, after, strict=True)
        for field in ("ru_utime", "ru_stime")
    }
    assert min(parts.values()) > 0.01, parts  # every part counts for something here
    assert cpu == pytest.approx(sum(parts.values()), abs=0.003)
