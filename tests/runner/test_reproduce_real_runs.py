"""The reproduction suite end to end on real tiny runs: label x seed runs, paired per-seed contrasts,
verdicts, and a report with tables (mean ± std over seeds), contrasts, verdicts and plots. Its logic piece
by piece, on fake runs: test_reproduce.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

import pfl.runner.reproduce as rep
from pfl.errors import ConfigError
from pfl.runner.claims import Claim, LrGrid, beats
from pfl.runner.warm_workers import WorkerPool

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--data.num_clients", "4", "--trainer.rounds", "3", "--model.hidden", "[16]", "--tracking.wandb", "false"]


@pytest.fixture(scope="module")
def pool():
    """The module's warm workers: each suite below runs in them, as one suite's phases do (a worker starts
    once for the module, not once per phase)."""
    with WorkerPool() as shared:
        yield shared


@pytest.fixture
def run_claims(pool, monkeypatch):
    """``rep.run_claims`` in the module's warm workers. A worker is lent only to a call with the environment
    it was started with, and pytest names the current test in it: that name is left out of the runs'."""

    def run(*args, **kw) -> Path:
        monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
        return rep.run_claims(*args, pool=pool, **kw)

    return run


def tiny_claim(**kw) -> Claim:
    runs = {"local": ["--method.name", "local"], "ditto": ["--method.name", "ditto", "--method.lam", "0.1"]}
    args = dict(key="tiny", paper="test", statement="ditto personalizes better than local", base=TINY, runs=runs)
    return Claim(**{**args, "contrasts": beats("ditto", ["local"], "pm.l_acc.mean"), **kw})


def test_report_has_seed_table_paired_diffs_verdict_plot_and_time(tmp_path, monkeypatch, capsys, run_claims):
    monkeypatch.chdir(ROOT)
    claim = tiny_claim(seeds=(0, 1), diagnose=lambda s: [f"{len(s)} seeds measured"])
    absent = Claim("absent", "test", "needs a missing method", TINY, {"x": ["--method.name", "nope"]}, claim.contrasts)
    monkeypatch.setattr(rep, "all_claims", lambda: [claim, absent])
    report = run_claims(tmp_path).read_text()
    for label in ("local", "ditto"):  # label x seed, one folder each
        for seed in (0, 1):
            summary = json.loads((tmp_path / "tiny" / label / f"s{seed}" / "summary.json").read_text())
            assert summary["seed"] == seed
    assert re.search(r"\| ditto \| ditto \| 2 \| (\*\*)?\d\.\d{4} ± \d\.\d{4}", report)  # mean ± std over 2 seeds
    assert "| contrast | s0 | s1 | mean | std | margin | verdict |" in report
    row = next(line for line in report.splitlines() if line.startswith("| ditto - local (pm.l_acc.mean)"))
    assert re.search(r"\| [+-]\d\.\d{4} \| [+-]\d\.\d{4} \| [+-]\d\.\d{4} \| \d\.\d{4} \| \+0\.0000 \| ", row)
    assert re.search(r"\*\*Verdict: (held|not held|tie)\*\*", report) and "indicative" not in report
    assert ("- 2 seeds measured" in report) != ("**Verdict: held**" in report)  # causes only when not held
    assert "Measured wall time of this invocation: " in report and "it ran 4 run(s) and reused 0." in report
    row = r"\| tiny \| (held|not held|tie) \| 4 \| \d+\.\d \| \d+\.\d \|"
    assert re.search(row, report) and "| absent | not run | 0 | 0.0 | 0.0 |" in report
    assert (tmp_path / "tiny.png").exists() and "Not run: methods not available yet: nope" in report
    for name in ("curves", "clients"):  # the runs as `pfl report --plot/--plot-clients` draws them
        assert (tmp_path / f"tiny_{name}.png").exists() and f"![tiny {name}](tiny_{name}.png)" in report
    assert "against the suite's own `local` run" in report
    assert not list(tmp_path.rglob("checkpoint*"))  # no verdict reads one: the suite's runs write none
    seconds = json.loads((tmp_path / "seconds.json").read_text())
    assert set(seconds) == {f"tiny/{label}/s{seed}" for label in ("local", "ditto") for seed in (0, 1)}
    timing = json.loads((tmp_path / "timing.json").read_text())  # each run's rounds and evaluation, apart
    assert set(timing) == set(seconds) and all(t["rounds"] == 3 and t["evaluations"] == 1 for t in timing.values())
    assert all(0 < t["rounds_s"] + t["evaluations_s"] < seconds[k] for k, t in timing.items())  # parts of the whole
    # progress: a line per finished run with the runs done / total, the elapsed time and the ETA
    assert re.search(r"\[4/4\] tiny/\w+/s\d: ok in \d+ s \(elapsed \d\d:\d\d, ETA 00:00\)", capsys.readouterr().out)
    mtime = (tmp_path / "tiny" / "ditto" / "s1" / "summary.json").stat().st_mtime
    again = run_claims(tmp_path, reuse=True).read_text()  # finished runs are kept, not re-run
    assert (tmp_path / "tiny" / "ditto" / "s1" / "summary.json").stat().st_mtime == mtime
    assert "(4 runs, " in again and re.search(r"\| ditto \| ditto \| 2 \|", again)
    assert "it ran 0 run(s) and reused 4." in again and "without a recorded" not in again
    cpu = json.loads((tmp_path / "cpu_seconds.json").read_text())
    assert set(cpu) == set(seconds) and all(0.0 < cpu[k] < 3 * seconds[k] for k in cpu)  # its own CPU time
    total = sum(cpu.values()) / 60
    assert f"Recorded time of the report's 4 runs: {total:.1f} CPU-minutes, about {total:.1f} min" in again
    (tmp_path / "cpu_seconds.json").write_text(json.dumps({"tiny/local/s0": 60.0}))  # the others' lost
    lost = run_claims(tmp_path, reuse=True, workers=2).read_text()
    assert "4 runs: 1.0 CPU-minutes, about 0.5 min of wall time with 2 worker(s)" in lost
    assert "3 reused run(s) have no recorded CPU time" in lost and "| 4 | 1.0 (3 runs unrecorded) |" in lost
    assert "(4 runs, 1.0 CPU-minutes, " in lost and "; 3 without a recorded CPU time)" in lost


def test_quick_runs_the_first_seed_shortened_and_marks_verdicts_indicative(tmp_path, monkeypatch, run_claims):
    monkeypatch.chdir(ROOT)
    claim = tiny_claim(seeds=(4, 5), base=[*TINY, "--trainer.rounds", "20"])
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    report = run_claims(tmp_path, quick=True, keep_checkpoints=True).read_text()
    assert sorted(p.name for p in (tmp_path / "tiny" / "ditto").iterdir()) == ["s4"]
    assert (tmp_path / "tiny" / "ditto" / "s4" / "checkpoint.pt").is_file()  # kept, for Run.model()
    assert json.loads((tmp_path / "tiny" / "ditto" / "s4" / "summary.json").read_text())["rounds"] == 2
    assert "QUICK" in report and re.search(r"\*\*Verdict: (held|not held|tie) \(indicative, 1 seed\)\*\*", report)


def test_the_lr_grid_picks_the_best_validation_lr_and_the_runs_use_it(tmp_path, monkeypatch, run_claims):
    monkeypatch.chdir(ROOT)
    grid = LrGrid((1e-5, 0.5), labels=("ditto",), rounds=3)
    # the edge step is 25 000: Ditto's exact proximal step keeps that run finite, so it counts as a grid run
    runs = {"local": ["--method.name", "local"], "ditto": ["--method.name", "ditto", "--method.lam", "0.1"]}
    runs["ditto"] += ["--method.prox", "exact"]
    claim = tiny_claim(seeds=(0,), base=[*TINY, "--data.val_frac", "0.2"], lr_grid=grid, runs=runs)
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    report = run_claims(tmp_path).read_text()
    scores = {
        lr: json.loads((tmp_path / "tiny" / "_lr" / "ditto" / f"lr{lr:g}" / "summary.json").read_text())["metrics"]
        for lr in grid.values
    }
    assert scores[0.5]["pm.val_acc.mean"] > scores[1e-5]["pm.val_acc.mean"]  # a near-zero lr barely moves
    assert "- ditto: **0.5** (1e-05: " in report
    # the grid's runs are part of the claim's cost: 2 runs + 2 grid runs + 1 past the grid's edge (0.5 was its
    # top), each with its CPU time recorded
    assert re.search(r"^\| tiny \| [^|]+ \| 5 \(3 lr grid\) \| ", report, re.M)
    cpu = json.loads((tmp_path / "cpu_seconds.json").read_text())
    assert {"tiny/_lr/ditto/lr1e-05", "tiny/_lr/ditto/lr0.5"} <= set(cpu) and "5 (3 lr grid) runs" in report
    config = (tmp_path / "tiny" / "ditto" / "s0" / "config.yaml").read_text()
    assert (
        re.search(r"lr: 0\.5\b", config)
        and "lr: 0.5" not in (tmp_path / "tiny" / "local" / "s0" / "config.yaml").read_text()
    )


def test_a_diverged_run_is_named_and_the_rest_of_the_claim_still_reported(tmp_path, monkeypatch, capsys, run_claims):
    monkeypatch.chdir(ROOT)
    runs = {"local": ["--method.name", "local"], "blowup": ["--method.name", "fedavg", "--client.lr", "1e30"]}
    claim = Claim("tiny", "test", "local beats a diverging run", TINY, runs, beats("local", ["blowup"], "pm.l_acc"))
    claim.seeds = (0,)
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    report = run_claims(tmp_path).read_text()  # a divergence is a finding: the suite itself succeeds
    assert "Failed (left out of the table and the check): tiny/blowup/s0." in report
    assert "| local |" in report and "| blowup |" not in report
    assert "| local - blowup (pm.l_acc) | - |" in report and "**Verdict: tie (indicative, 1 seed)**" in report
    assert "1 run(s) diverged, named in " in capsys.readouterr().out
    assert set(json.loads((tmp_path / "seconds.json").read_text())) == {"tiny/local/s0"}  # only finished runs


def test_a_run_that_fails_other_than_by_diverging_fails_the_suite_after_the_report(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    claim = tiny_claim(seeds=(0,))
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])

    def one_crashes(jobs, workers, what, on_finish, fresh=False, pool=None):
        name = next(iter(jobs))
        on_finish(name, 1, 1.0, 1.0)
        raise ConfigError(what, f"1 of {len(jobs)} runs failed: {name}: boom")

    monkeypatch.setattr(rep, "run_parallel", one_crashes)
    with pytest.raises(ConfigError, match="tiny/local/s0: boom"):
        rep.run_claims(tmp_path)
    assert "Failed (left out of the table and the check): " in (tmp_path / "REPORT.md").read_text()


def test_a_stopped_suite_keeps_its_finished_runs_times_and_adds_up_its_invocations(tmp_path, monkeypatch, run_claims):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(seeds=(0, 1))])
    real = rep.run_parallel

    def stopped_after_one(jobs, workers, what, on_finish, fresh=False, pool=None):
        real(dict(list(jobs.items())[:1]), workers, what=what, on_finish=on_finish, pool=pool)
        raise KeyboardInterrupt  # the process is stopped with the suite unfinished

    monkeypatch.setattr(rep, "run_parallel", stopped_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_claims(tmp_path)
    assert len(json.loads((tmp_path / "seconds.json").read_text())) == 1
    assert len(json.loads((tmp_path / "cpu_seconds.json").read_text())) == 1
    [first] = json.loads((tmp_path / "invocations.json").read_text())
    assert first["runs"] == 1 and first["workers"] == 1 and first["wall_s"] > 0
    monkeypatch.setattr(rep, "run_parallel", real)
    report = run_claims(tmp_path, reuse=True).read_text()
    assert "it ran 3 run(s) and reused 1." in report and "without a recorded" not in report
    ledger = json.loads((tmp_path / "invocations.json").read_text())
    assert [i["runs"] for i in ledger] == [1, 3] and ledger[0] == first
    line = re.search(
        r"The runs were made by 2 invocations \(.+, (\d+\.\d) min, 1 run\(s\), 1 worker\(s\); .+, (\d+\.\d) min, "
        r"3 run\(s\), 1 worker\(s\); each up to its last finished run\): (\d+\.\d) min of measured wall time in all\.",
        report,
    )
    assert line and abs(float(line[1]) + float(line[2]) - float(line[3])) <= 0.1 + 1e-9  # each rounded to 0.1
    assert float(line[3]) == round(sum(i["wall_s"] for i in ledger) / 60, 1)
    again = run_claims(tmp_path, reuse=True).read_text()  # nothing ran: no new line in the ledger
    assert len(json.loads((tmp_path / "invocations.json").read_text())) == 2 and "made by 2 invocations" in again


def test_every_claim_names_only_configurations_that_parse(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    from pfl.runner.claims import all_claims

    configs = rep.Configs()  # each method's parser built once for the whole suite, as pfl reproduce does
    for claim in all_claims():
        assert len(claim.seeds) >= 3, claim.key  # every claim over >= 3 seeds
        every = rep.claim_jobs(claim, tmp_path, False, check=False)
        assert len(every) == len(claim.runs) * len(claim.seeds)
        # a later seed's arguments differ only in --seed and the run's folder, so the first seed's are parsed
        varying = {"--seed", "--tracking.root", "--tracking.name"}
        masked = [(j.label, tuple("*" if a in varying else v for a, v in zip(["", *j.argv[:-1]], j.argv, strict=True)))
                  for j in every]  # fmt: skip
        fixed = set(masked)
        assert len(fixed) == len(claim.runs), claim.key
        first = replace(claim, seeds=claim.seeds[:1])
        assert len(rep.claim_jobs(first, tmp_path, False, configs=configs)) == len(claim.runs)
        rep.grid_jobs(claim, tmp_path, configs=configs)
    assert len(configs.parsers) > 1 and len(configs.parsed) > len(all_claims())


def test_runs_that_differ_only_outside_the_summary_get_a_row_each(tmp_path, monkeypatch, run_claims):
    monkeypatch.chdir(ROOT)
    runs = {"plain": ["--method.name", "fedavg"], "decay": ["--method.name", "fedavg", "--client.weight_decay", "0.01"]}
    claim = Claim("tiny", "test", "two fedavg runs", TINY, runs, beats("plain", ["decay"], "pm.l_acc"), seeds=(0,))
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    report = run_claims(tmp_path).read_text()
    assert "| plain |" in report and "| decay |" in report and "+1" not in report


def test_make_reproduce_quick_runs_the_smoke_suite_apart_from_the_full_one():
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # --no-print-directory: under `make test` this make is nested and would print "Leaving directory" last
    make = ["make", "-n", "--no-print-directory", "reproduce"]
    quick = subprocess.run([*make, "QUICK=1"], cwd=ROOT, capture_output=True, text=True).stdout
    full = subprocess.run(make, cwd=ROOT, capture_output=True, text=True).stdout
    assert "pfl reproduce --quick --out reproduce_quick" in quick.splitlines()[-1]
    assert full.splitlines()[-1].endswith("pfl reproduce --out reproduce")
