"""W&B tells the truth, read back from the offline run's own transaction log (``run-<id>.wandb``):
its summary equals summary.json, its config carries summary.json's platform, ids are unique across sweeps
and reruns, a killed and resumed run is one W&B run with the whole history, and W&B's console output stays
out of the progress bar."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pfl import numeric_platform
from pfl.cli import main
from pfl.runner import wandb_identity, wandb_run
from pfl.runner.args import parse_fit_args
from pfl.runner.experiment import run_experiment
from pfl.runner.sweep import RunProgress, command_argv, load_sweep, plan
from tests.helpers.cli_runs import child_env

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--data.num_clients", "6", "--model.hidden", "[16]", "--trainer.rounds", "4", "--trainer.eval_every", "1",
    "--trainer.progress", "false",
]  # fmt: skip
MEDIA = wandb_run.MEDIA_KEYS


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, with its config and caches inside the test's folder."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    return tmp_path


# -- reading a .wandb transaction log (LevelDB log format: 32 KiB blocks of CRC, length, type, data) ---
def _chunks(data: bytes):
    block, pos, pending = 32768, 7, b""  # 7: the ":W&B" header, magic and version
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:  # FULL
            yield chunk
        elif kind == 2:  # FIRST
            pending = chunk
        elif kind == 3:  # MIDDLE
            pending += chunk
        elif kind == 4:  # LAST
            yield pending + chunk


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out = []
    for raw in _chunks(data):
        record = pb.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def finished_records(path: Path, wait_s: float = 30.0) -> list[Any]:
    """The records of a finished run's log. ``run.finish()`` can return while W&B's service is still
    writing the log's tail (the last history's summary, pfl's removals, the exit record), so read until
    the exit record is there."""
    deadline = time.monotonic() + wait_s
    while True:
        recs = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)


def run_record(recs: list[Any]) -> Any:
    return next(r.run for r in recs if r.WhichOneof("record_type") == "run")


def history(recs: list[Any]) -> list[dict[str, Any]]:
    rows = [r.history for r in recs if r.WhichOneof("record_type") == "history"]
    return [{_key(i): json.loads(i.value_json) for i in row.item} for row in rows]


def summary(recs: list[Any]) -> dict[str, Any]:
    """The run's final summary: every summary record's updates and removals, in order."""
    out: dict[str, Any] = {}
    for r in recs:
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                out[_key(item)] = json.loads(item.value_json)
            for item in r.summary.remove:
                out.pop(_key(item), None)
    return out


def run_config(recs: list[Any]) -> dict[str, Any]:
    """The run's final config: the run record's, then every config record's updates and removals, in order."""
    out: dict[str, Any] = {}
    for r in recs:
        kind = r.WhichOneof("record_type")
        if kind in ("run", "config"):
            items = r.run.config if kind == "run" else r.config
            for item in items.update:
                out[_key(item)] = json.loads(item.value_json)
            for item in items.remove:
                out.pop(_key(item), None)
    return out


def platform_entries(reported: dict[str, Any]) -> dict[str, Any]:
    """What the W&B config's ``platform`` holds for a run whose summary.json is ``reported``."""
    return {"label": numeric_platform.label(reported["platform"]), **reported["platform"]}


def offline_logs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def reported_metrics(s: dict[str, Any]) -> dict[str, Any]:
    """The W&B summary without W&B's own keys and the table/plot entries."""
    return {k: v for k, v in s.items() if not k.startswith("_") and not k.startswith(MEDIA)}


def same(a: Any, b: Any) -> bool:
    """Equal, where W&B stores NaN as null."""
    nan = lambda v: v is None or (isinstance(v, float) and v != v)  # noqa: E731
    return (nan(a) and nan(b)) or a == b


def fit(tmp_path: Path, name: str, *extra: str) -> dict[str, Any]:
    cfg, ns, parser, resume = parse_fit_args([*TINY, "--tracking.root", str(tmp_path), "--tracking.name", name, *extra])
    return run_experiment(cfg, parser.dump(ns), resume_dir=resume)


# -- the summary is what pfl reports -----------------------------------------------------------------
def test_wandb_summary_equals_summary_json(offline, capfd):
    extra = ["--client.lr", "0.5", "--data.val_frac", "0.2", "--eval.select", "best_val", "--eval.target", "0.3"]
    extra += ["--data.new_clients", "0.34"]
    fit(offline, "best", *extra)
    run_dir = offline / "best"
    reported = json.loads((run_dir / "summary.json").read_text())
    assert reported["selected_round"] != reported["rounds"], "pick a setting whose best round is not the last"
    assert {"rounds_to_target", "new.acc.mean"} <= set(reported["metrics"])
    (log,) = offline_logs(run_dir)
    recs = finished_records(log)
    kept = reported_metrics(summary(recs))
    expected = {**reported["metrics"], "selected_round": reported["selected_round"]}
    assert set(kept) == set(expected)
    assert all(same(kept[k], v) for k, v in expected.items()), {k: (kept[k], v) for k, v in expected.items()}
    # the history is every evaluated round at step = round
    assert [row["_step"] for row in history(recs)] == [1, 2, 3, 4]
    # the platform is config (W&B groups and filters runs by it), beside the run's settings
    config = run_config(recs)
    assert config["platform"] == platform_entries(reported) and config["platform"]["cpu_kernels"]
    assert config["seed"] == 0 and config["client"]["lr"] == 0.5
    # W&B started silently: none of its console lines, one line of pfl's at start and one at the end
    out = capfd.readouterr()
    assert "wandb:" not in out.out + out.err
    assert f"W&B run {run_record(recs).run_id} (offline)" in out.out


def test_best_test_summary_drops_the_last_rounds_unreported_keys(offline):
    fit(offline, "bt", "--eval.select", "best_test")
    reported = json.loads((offline / "bt" / "summary.json").read_text())
    kept = reported_metrics(summary(finished_records(offline_logs(offline / "bt")[0])))
    assert "pm.l_acc.mean" not in kept and "best_test.pm.l_acc.mean" in kept
    assert set(kept) == {*reported["metrics"], "selected_round"}


# -- identity: ids, group, tags, job type, project ---------------------------------------------------
SWEEP = """
project: pfl-sweep-test
method: grid
metric: {name: pm.l_acc.mean, goal: maximize}
parameters:
  client.lr: {values: [0.05]}
command: ["${env}", "${interpreter}", -m, pfl, fit, --data.num_clients, "6", --model.hidden, "[16]",
          --trainer.rounds, "2", "${args_no_hyphens}"]
"""


def test_ids_unique_across_two_local_sweeps_and_reruns(offline):
    sweep = offline / "grid.yaml"
    sweep.write_text(SWEEP)
    ids, seen_dirs = [], []
    for label in ("sweep-a", "sweep-b"):
        runs, root = plan(sweep, root=offline / label)
        for run in runs:
            cfg, ns, parser, _ = parse_fit_args(run.argv[1:])
            run_experiment(cfg, parser.dump(ns))
            run_dir = root / f"run{run.index:03d}"
            (log,) = offline_logs(run_dir)
            rec = run_record(finished_records(log))
            ids.append(rec.run_id)
            seen_dirs.append(run_dir)
            assert rec.display_name == run_dir.name == "run000"  # readable
            assert rec.run_group == label and rec.job_type == "sweep"
            assert rec.project == "pfl-sweep-test"  # the sweep file's project
            assert set(rec.tags) == {"fedavg", "digits"}
            assert json.loads((run_dir / wandb_identity.IDENTITY_FILE).read_text())["id"] == rec.run_id
    assert len(ids) == 2 and len(set(ids)) == 2, ids  # every local sweep names its first run run000
    # a new run reusing a name (overwrite, not --resume) is a new W&B run
    runs, _ = plan(sweep, root=offline / "sweep-a")
    cfg, ns, parser, _ = parse_fit_args([*runs[0].argv[1:], "--tracking.overwrite", "true"])
    run_experiment(cfg, parser.dump(ns))
    latest = json.loads((seen_dirs[0] / wandb_identity.IDENTITY_FILE).read_text())["id"]
    assert latest not in ids


def test_plain_fit_groups_by_experiment_and_tags_method_and_dataset(offline):
    fit(offline, "g", "--method", "fedprox", "--tracking.tags", "[baseline]", "--tracking.job_type", "tuning")
    rec = run_record(finished_records(offline_logs(offline / "g")[0]))
    assert rec.run_group == "digits-6c-dir0.5" and rec.job_type == "tuning"
    assert list(rec.tags) == ["fedprox", "digits", "baseline"]
    fit(offline, "g2", "--tracking.group", "mine")
    assert run_record(finished_records(offline_logs(offline / "g2")[0])).run_group == "mine"


def test_new_run_id_is_readable_and_in_wandbs_alphabet():
    a, b = wandb_identity.new_run_id("sweeps/x:run 001"), wandb_identity.new_run_id("sweeps/x:run 001")
    assert a != b and a.startswith("sweeps-x-run-001-")
    assert all(c.isalnum() or c in "-_" for c in a)
    assert len(wandb_identity.new_run_id("n" * 500)) <= wandb_identity.ID_NAME_CHARS + 9


def test_history_is_flushed_as_it_goes(tmp_path, wandb_init_kwargs):
    """The run asks W&B to write its transaction log every FLUSH_SECONDS (W&B's default is 15 s)."""
    seen = wandb_init_kwargs
    ident = wandb_identity.WandbIdentity("x-1", "x", "p", "g")
    with pytest.raises(RuntimeError, match="stop here"):
        wandb_run.WandbRun(ident, tmp_path, {})._init("offline")
    assert seen["settings"].x_transaction_log_flush_interval == wandb_run.FLUSH_SECONDS <= 1
    assert seen["settings"].silent and seen["id"] == "x-1" and seen["resume"] is None


# -- kill and resume ---------------------------------------------------------------------------------
KILLER = """
import os, signal, sys, time
from pathlib import Path
from pfl.federation import checkpoint

KILL_AT = {kill_at}
save = checkpoint.Checkpointer.save

def save_then_die(self):
    save(self)
    if self.state.progress.round == KILL_AT:
        # die like a SIGKILL: no clean-up; first wait (bounded) until W&B's log holds the rounds
        sys.path.insert(0, {root!r})
        from tests.runner.test_wandb import history, records
        logs = list(Path(self.run_dir, "wandb").glob("offline-run-*/run-*.wandb"))
        for _ in range(600):
            if logs and len(history(records(logs[0]))) >= KILL_AT:
                break
            time.sleep(0.1)
            logs = list(Path(self.run_dir, "wandb").glob("offline-run-*/run-*.wandb"))
        os.kill(os.getpid(), signal.SIGKILL)

checkpoint.Checkpointer.save = save_then_die
from pfl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_killed_then_resumed_run_is_one_wandb_run_with_the_whole_history(offline):
    rounds, kill_at = 6, 3
    script = offline / "killer.py"
    script.write_text(textwrap.dedent(KILLER.format(kill_at=kill_at, root=str(ROOT))))
    args = [*TINY, "--trainer.rounds", str(rounds), "--tracking.root", str(offline), "--tracking.name", "victim"]
    env = child_env()
    env.pop("WANDB_SERVICE", None)  # its own W&B service, as a separate `pfl fit` has (not this process's)
    killed = subprocess.run([sys.executable, str(script), "fit", *args], cwd=ROOT, env=env, capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    run_dir = offline / "victim"
    assert not (run_dir / "summary.json").exists()
    (first,) = offline_logs(run_dir)
    run_id = run_record(records(first)).run_id
    killed_platform = run_config(records(first))["platform"]  # recorded as it started, so the killed run has it
    assert [r["_step"] for r in history(records(first))] == [1, 2, 3]  # the killed run kept its rounds

    assert main(["fit", "--resume", str(run_dir), "--trainer.progress", "false"]) == 0
    logs = offline_logs(run_dir)
    assert len(logs) == 1 and logs[0] != first, "the superseded offline folder must go"
    recs = finished_records(logs[0])
    assert run_record(recs).run_id == run_id  # the same W&B run
    rows = history(recs)
    assert [r["_step"] for r in rows] == list(range(1, rounds + 1))  # complete, once each, in order
    csv_rows = (run_dir / "metrics.csv").read_text().splitlines()
    header = csv_rows[0].split(",")
    for row, line in zip(rows, csv_rows[1:], strict=True):
        values = dict(zip(header, line.split(","), strict=True))
        assert row["_step"] == int(values["round"])
        assert row["pm.l_acc.mean"] == pytest.approx(float(values["pm.l_acc.mean"]), abs=1e-12)
    reported = json.loads((run_dir / "summary.json").read_text())
    kept = reported_metrics(summary(recs))
    assert all(same(kept[k], v) for k, v in reported["metrics"].items())
    assert run_config(recs)["platform"] == platform_entries(reported)  # the resumed process's, as in summary.json
    assert killed_platform == platform_entries(reported)  # one machine: the killed process's is the same


def test_a_resumed_run_replaces_the_platform_its_wandb_config_holds(tmp_path):
    """Online, W&B's resume brings back the config of the run's earlier process: a finished run resumed
    with more rounds on another machine changes its platform there, which W&B refuses unless allowed."""
    from wandb.sdk.wandb_config import Config

    class Run:
        config, summary, offline, url = Config(), {}, False, "https://wandb.ai/r"

        def finish(self):
            pass

    class Loop:
        device = torch.device("cpu")
        history: list = []

    ident = wandb_identity.WandbIdentity("x-1", "x", "p", "g")
    callback = wandb_run.WandbRun(ident, tmp_path, {})
    callback.run, callback.mode = Run(), "disabled"
    callback.run.config.update({"platform": {"label": "an earlier machine", "cpu": "Intel"}})
    callback.on_fit_start(Loop())
    reported = {"platform": numeric_platform.record(torch.device("cpu"))}  # this process's, as summary.json's
    assert dict(callback.run.config) == {"platform": platform_entries(reported)}
    assert callback.run.summary == {}  # the platform is no summary entry


# -- sweep files and the runner's progress -----------------------------------------------------------
def test_args_no_hyphens_parses_like_args_and_launcher_macros_are_dropped(monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_sweep(ROOT / "sweeps" / "fedprox_mu.yaml")
    params = {"method.mu": 0.1, "seed": 3, "trainer.progress": False}
    hyphens = command_argv(spec, params)
    bare = command_argv(
        {**spec, "command": [t.replace("${args}", "${args_no_hyphens}") for t in spec["command"]]}, params
    )
    assert hyphens[:1] == bare[:1] == ["fit"] and "method.mu=0.1" in bare and "--method.mu=0.1" in hyphens
    assert not any("${" in t for t in bare + hyphens)
    a, b = parse_fit_args(hyphens[1:])[0], parse_fit_args(bare[1:])[0]
    assert a.method.mu == b.method.mu == 0.1 and a.seed == b.seed == 3 and a.trainer.progress is b.trainer.progress


def test_unsupported_macro_and_every_sweep_file_has_a_project(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    from pfl.errors import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text(  # the macros quoted: unquoted, a flow list reads ${ as YAML and the file is refused as such
        'method: grid\nparameters:\n  seed: {values: [0]}\ncommand: [python, -m, pfl, fit, "${args}", "${args_json}"]\n'
    )
    with pytest.raises(ConfigError, match=r"^sweep\.command: \$\{args_json\} is not read by pfl fit"):
        load_sweep(bad)
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        spec = load_sweep(path)
        assert spec.get("project") == "pfl", path.name  # the same project as fit's default
        runs, _ = plan(path, count=1, root=tmp_path / path.stem)
        argv = runs[0].argv
        assert argv[argv.index("--tracking.project") + 1] == "pfl"
        assert argv[argv.index("--tracking.group") + 1] == path.stem


def test_run_progress_lines_and_bar_carry_elapsed_and_eta(monkeypatch, capsys):
    from tests.data.test_ecosystem_data import Terminal

    now = [0.0]
    monkeypatch.setattr("pfl.runner.sweep.time.perf_counter", lambda: now[0])
    monkeypatch.setattr("tqdm.std.time", lambda: now[0])  # the bar's own clock
    terminal = Terminal(tty=True)
    monkeypatch.setattr("sys.stderr", terminal)
    progress = RunProgress(4, "sweep", workers=2)
    progress.started("a"), progress.started("b")
    now[0] = 10.0  # a took 10 s; b runs since 0, ends ~10; c and d take 10 s each on the two workers
    progress.finished("a", "ok", 10.0)
    progress.started("c")
    now[0] = 12.0  # mean 11 s: c (since 10) ends at 21, d starts now and ends at 23
    progress.finished("b", "ok", 12.0)
    progress.started("d")
    now[0] = 21.0  # mean 11 s: d (since 12) ends at 23
    progress.finished("c", "FAILED (1)", 11.0)
    now[0] = 23.0
    progress.finished("d", "ok", 11.0)
    progress.close()
    assert capsys.readouterr().out.splitlines() == [
        "[1/4] a: ok in 10 s (elapsed 00:10, ETA 00:10)",
        "[2/4] b: ok in 12 s (elapsed 00:12, ETA 00:11)",
        "[3/4] c: FAILED (1) in 11 s (elapsed 00:21, ETA 00:02)",
        "[4/4] d: ok in 11 s (elapsed 00:23, ETA 00:00)",
    ]
    shown = terminal.text.split("\r")[-1].strip() or terminal.text.split("\r")[-2].strip()
    assert shown.startswith("sweep: 100%") and shown.endswith("4/4 [00:23, ETA 00:00]"), shown


# -- a W&B that cannot start leaves nothing that blocks a rerun -------------------------------------------
def _fit_cli(capsys, root: Path, name: str, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["fit", *TINY, "--trainer.rounds", "1", "--tracking.root", str(root), "--tracking.name", name, *extra])
    return code, capsys.readouterr().err


def test_a_wandb_start_that_fails_is_one_line_and_leaves_no_folder(offline, capsys):
    """An empty tag (as a user's Method class without a name gave) used to end in pydantic's traceback
    and leave config.yaml and wandb/ behind, so a rerun under the same name was refused."""
    code, err = _fit_cli(capsys, offline, "w", "--tracking.wandb", "true", "--tracking.tags", '[""]')
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: tracking.wandb: W&B could not start run w-") and "Tag at index 2 is empty" in err
    assert not (offline / "w").exists()
    assert _fit_cli(capsys, offline, "w", "--tracking.wandb", "false")[0] == 0  # the same name runs at once


def test_a_resumed_run_keeps_its_wandb_folder_when_wandb_cannot_start(offline, capsys, monkeypatch):
    assert _fit_cli(capsys, offline, "r", "--tracking.wandb", "false")[0] == 0
    (offline / "r" / "wandb").mkdir()
    (offline / "r" / "wandb" / "earlier.txt").write_text("an earlier W&B run's files")
    before = sorted(p.name for p in (offline / "r").iterdir())

    def no_network(self, mode):
        raise ConnectionError("wandb.ai is unreachable\nretry later")

    monkeypatch.setattr(wandb_run.WandbRun, "_init", no_network)
    capsys.readouterr()
    code = main(["fit", "--resume", str(offline / "r"), "--trainer.rounds", "2", "--tracking.wandb", "true"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "(ConnectionError: wandb.ai is unreachable retry later)" in err
    assert sorted(p.name for p in (offline / "r").iterdir()) == before
    assert (offline / "r" / "wandb" / "earlier.txt").read_text() == "an earlier W&B run's files"
