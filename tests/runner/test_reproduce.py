"""The reproduction suite's own logic on fake runs: jobs, the lr grid's choice, time records, the report's
header, sections, contrast tables and plots. The fake runner writes each run folder with the runner's own
writers and known numbers, so every figure of the report is known. The suite on real tiny runs:
test_reproduce_real_runs.py."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import pytest

import pfl.runner.reproduce as rep
import pfl.runner.reproduce_options as options
from pfl.errors import EXIT_DIVERGED, ConfigError
from pfl.runner.claims import Claim, Contrast, LrGrid, beats
from pfl.runner.suite_estimate import Split, device_label, evaluations, split_of, split_seconds
from tests.helpers.report_plots import write_run as write_plot_run

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--data.num_clients", "4", "--trainer.rounds", "20", "--tracking.wandb", "false"]
RUNS = {"local": ["--method.name", "local"], "ditto": ["--method.name", "ditto", "--method.lam", "0.1"]}
# (label, seed) -> the run's pm.l_acc.mean; its three clients score it -0.1, +0, +0.1
SCORES = {("local", 0): 0.5, ("ditto", 0): 0.6, ("local", 1): 0.55, ("ditto", 1): 0.7}


def tiny_claim(**kw) -> Claim:
    args = dict(key="tiny", paper="Paper", statement="ditto beats local", base=BASE, runs=RUNS, seeds=(0, 1))
    return Claim(**{**args, "contrasts": beats("ditto", ["local"], "pm.l_acc"), **kw})


def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The last value given to ``name`` (as the parser reads it), or ``default``."""
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1] if name in argv else default


class FakeRunner:
    """Stands in for ``run_parallel``: writes each run's folder (config, curves, clients, summary) with
    ``score(name, argv)`` as its pm.l_acc.mean and pm.val_acc.mean, exits with ``code(name, argv)``
    (default ``codes[name]``, 0 when absent), and reports ``wall`` and ``cpu`` seconds to ``on_finish`` as
    the real one does."""

    def __init__(self, score=None, codes: dict[str, int] | None = None, wall: float = 150.0, cpu: float | None = 120.0):
        self.score = score or (lambda name, argv: SCORES[(name.split("/")[-2], int(flag(argv, "--seed")))])
        self.codes, self.wall, self.cpu = codes or {}, wall, cpu
        self.code = lambda name, argv: self.codes.get(name, 0)
        self.calls: list[tuple[str, list[str], int]] = []
        self.argv: dict[str, list[str]] = {}
        self.fresh: list[bool] = []  # each call's fresh-processes setting
        self.pools: list = []  # each call's pool of warm workers

    def __call__(self, jobs, workers, what="sweep", on_finish=None, fresh=False, pool=None):
        self.calls.append((what, list(jobs), workers))
        self.fresh.append(fresh)
        self.pools.append(pool)
        failed = []
        for name, argv in jobs.items():
            self.argv[name] = argv
            code = self.code(name, argv)
            if code == 0:
                write_run(argv, self.score(name, argv))
            else:
                failed.append(f"{name}: boom")
            on_finish(name, code, self.wall, self.cpu)
        if failed:
            raise ConfigError(what, f"{len(failed)} of {len(jobs)} runs failed: {'; '.join(failed)}")


def write_run(argv: list[str], score: float) -> Path:
    """The run ``argv`` asks for, scoring ``score`` (validation too); its three clients -0.1, +0, +0.1."""
    where, name = Path(flag(argv, "--tracking.root")), flag(argv, "--tracking.name")
    seed, lr = int(flag(argv, "--seed")), float(flag(argv, "--client.lr", "0.05"))
    curves = {"pm.l_acc.mean": [score], "pm.val_acc.mean": [score]}
    clients = [score + d for d in (-0.1, 0.0, 0.1)]
    return write_plot_run(where, name, seed, lr, curves, clients, method=flag(argv, "--method.name"))


@pytest.fixture
def fake(monkeypatch) -> FakeRunner:
    monkeypatch.chdir(ROOT)
    runner = FakeRunner()
    monkeypatch.setattr(rep, "run_parallel", runner)
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim()])
    return runner


def section(report: str, key: str) -> str:
    return report.split(f": {key}\n", 1)[1].split("\n## ", 1)[0]


# --- the jobs -------------------------------------------------------------------------------------------


def test_a_run_folder_is_the_claim_label_and_seed():
    assert rep.run_dir(Path("out"), "c", "ditto", 7) == Path("out/c/ditto/s7")


def test_a_shortened_run_is_evaluated_at_its_last_round_and_quick_keeps_a_tenth_of_the_rounds():
    assert rep.shortened(["--x", "1"], 3) == ["--x", "1", "--trainer.rounds", "3", "--trainer.eval_every", "3"]
    assert rep.quick_rounds(["--trainer.rounds", "29"]) == 2
    assert rep.quick_rounds(["--trainer.rounds", "30"]) == 3
    assert rep.quick_rounds(["--trainer.rounds", "9"]) == 1  # never zero rounds


def test_jobs_go_seed_by_seed_so_a_stopped_suite_has_whole_paired_seeds(tmp_path):
    claim = tiny_claim(seeds=(3, 7))
    jobs = rep.claim_jobs(claim, tmp_path, quick=False)
    assert [(j.claim, j.label, j.seed) for j in jobs] == [
        ("tiny", "local", 3), ("tiny", "ditto", 3), ("tiny", "local", 7), ("tiny", "ditto", 7)]  # fmt: skip
    assert [j.name for j in jobs] == ["tiny/local/s3", "tiny/ditto/s3", "tiny/local/s7", "tiny/ditto/s7"]
    assert jobs[2].run_dir == tmp_path / "tiny" / "local" / "s7"
    assert flag(jobs[3].argv, "--seed") == "7" and flag(jobs[3].argv, "--tracking.name") == "s7"
    (local, ditto) = rep.claim_jobs(claim, tmp_path, quick=True)
    assert (local.seed, ditto.seed) == (3, 3) and flag(ditto.argv, "--trainer.rounds") == "2"
    assert flag(ditto.argv, "--trainer.eval_every") == "2"
    with pytest.raises(ConfigError, match=r"tiny\.seeds: a claim needs at least one seed"):
        rep.claim_jobs(tiny_claim(seeds=()), tmp_path, quick=False)


def test_each_run_writes_its_own_folder_without_progress_bars(tmp_path):
    (job, *_) = rep.claim_jobs(tiny_claim(), tmp_path, quick=False)
    assert job.argv[0] == "fit" and job.argv[1:4] == BASE[:3] and job.done() is False
    assert flag(job.argv, "--tracking.root") == str(tmp_path / "tiny" / "local")
    assert flag(job.argv, "--tracking.name") == "s0" and flag(job.argv, "--seed") == "0"
    assert flag(job.argv, "--trainer.progress") == "false" and flag(job.argv, "--tracking.overwrite") == "true"
    assert flag(rep.checkpoint_flags(keep=False), "--trainer.checkpoint_every") == "0"  # the default: none
    assert flag(rep.checkpoint_flags(keep=True), "--trainer.checkpoint_every") == "1000000"  # the cost ratio's
    (job.run_dir).mkdir(parents=True)
    (job.run_dir / "summary.json").write_text("{}")
    assert job.done()


def test_chosen_lrs_apply_only_to_their_labels_and_only_with_a_grid(tmp_path):
    grid = tiny_claim(lr_grid=LrGrid((0.1, 0.2), arg="--client.lr"))
    jobs = {j.name: j.argv for j in rep.claim_jobs(grid, tmp_path, quick=False, lrs={"ditto": 0.2})}
    assert flag(jobs["tiny/ditto/s1"], "--client.lr") == "0.2" and "--client.lr" not in jobs["tiny/local/s1"]
    plain = rep.claim_jobs(tiny_claim(), tmp_path, quick=False, lrs={"ditto": 0.2})
    assert not any("--client.lr" in j.argv for j in plain)


def test_a_configuration_that_does_not_parse_is_refused_when_the_jobs_are_built(tmp_path):
    broken = tiny_claim(runs={"local": ["--method.name", "local", "--trainer.rounds", "many"]})
    with pytest.raises(ConfigError, match="rounds"):
        rep.claim_jobs(broken, tmp_path, quick=False)


def test_the_suite_builds_each_methods_parser_once_and_parses_each_run_once(fake, tmp_path, monkeypatch):
    import pfl.runner.args as args

    built, parsed = [], []
    real_build, real_parse = args.build_fit_parser, args._parse
    monkeypatch.setattr(args, "build_fit_parser", lambda name: built.append(name) or real_build(name))
    monkeypatch.setattr(
        args, "_parse", lambda parser, argv, *a: parsed.append(tuple(argv)) or real_parse(parser, argv, *a)
    )
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(seeds=(0, 1, 2))])
    rep.run_claims(tmp_path, quick=True, workers=2)
    # QUICK: each label's full argv on the first seed (for its rounds), then its shortened run; the
    # estimate reads each label's rounds from that same first-seed argv, already parsed: 4 parses, not 10
    assert len(parsed) == len(set(parsed)) == 4
    built.clear()
    parsed.clear()
    configs = rep.Configs()
    (job, *_) = rep.claim_jobs(tiny_claim(seeds=(0, 1, 2)), tmp_path, quick=False, configs=configs)
    assert built == ["local", "ditto"]  # 6 runs, a parser per method
    # the later seeds' arguments differ only in --seed and the folder: the first seed's are parsed
    assert len(parsed) == 2 and {flag(list(argv), "--seed") for argv in parsed} == {"0"}
    kept = configs.config(job.argv[1:])
    assert configs.config(job.argv[1:]) is kept  # parsed once
    fresh = args.parse_fit_args(job.argv[1:])[0]
    assert (kept.trainer, kept.client, kept.data, kept.seed) == (fresh.trainer, fresh.client, fresh.data, fresh.seed)
    assert vars(kept.method) == vars(fresh.method)


def test_grid_jobs_run_each_lr_of_the_labels_it_applies_to_on_the_first_seed(tmp_path):
    assert rep.grid_jobs(tiny_claim(), tmp_path) == []
    claim = tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=LrGrid((0.5, 1e-3), labels=("ditto",), rounds=4))
    claim.seeds = (5, 6)
    jobs = rep.grid_jobs(claim, tmp_path)
    assert [j.name for j in jobs] == ["tiny/_lr/ditto/lr0.5", "tiny/_lr/ditto/lr0.001"]
    assert [j.run_dir for j in jobs] == [tmp_path / "tiny" / "_lr" / "ditto" / n for n in ("lr0.5", "lr0.001")]
    assert all(j.claim == "tiny" and j.label == "ditto" and j.seed == 5 for j in jobs)
    argv = jobs[1].argv
    assert argv[0] == "fit" and flag(argv, "--client.lr") == "0.001" and flag(argv, "--seed") == "5"
    assert flag(argv, "--trainer.rounds") == "4" and flag(argv, "--trainer.eval_every") == "4"
    assert flag(argv, "--tracking.root") == str(tmp_path / "tiny" / "_lr" / "ditto")
    assert flag(argv, "--tracking.checkpoint_every", "") == "" and flag(argv, "--trainer.progress") == "false"
    with pytest.raises(ConfigError, match=r"tiny\.lr_grid: .*has none.*--data\.val_frac"):
        rep.grid_jobs(tiny_claim(lr_grid=LrGrid((0.1,))), tmp_path)


# --- the lr grid's choice -------------------------------------------------------------------------------


def grid_scores(out: Path, label: str, scores: dict[float, float | None]) -> set[Path]:
    """The grid runs' folders, each with a summary of its score (None: without the metric)."""
    runs = set()
    for lr, score in scores.items():
        run = out / "tiny" / "_lr" / label / f"lr{lr:g}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"metrics": {} if score is None else {"v": score}}))
        runs.add(run)
    return runs


def test_the_lr_with_the_best_validation_score_is_chosen_the_first_of_equals(tmp_path):
    claim = tiny_claim(lr_grid=LrGrid((0.01, 0.1, 1.0, 2.0), metric="v", rounds=7))
    finished = grid_scores(tmp_path, "ditto", {0.01: 0.9, 0.1: 0.9, 1.0: float("nan")})  # 2.0 did not finish
    finished |= grid_scores(tmp_path, "local", {0.01: None, 0.1: 0.2, 2.0: float("inf")})
    chosen, lines = rep.choose_lrs(claim, tmp_path, finished)
    assert chosen == {"ditto": 0.01, "local": 0.1}
    assert lines == [
        "Learning rate chosen on validation (`v` after 7 rounds, seed 0) from 0.01, 0.1, 1, 2:",
        "",
        "- local: **0.1** (0.1: 0.2000)",
        "- ditto: **0.01** (0.01: 0.9000, 0.1: 0.9000)",
        "",
    ]


def test_a_label_without_a_finished_grid_run_keeps_its_lr_and_labels_outside_the_grid_are_not_listed(tmp_path):
    claim = tiny_claim(lr_grid=LrGrid((0.1,), labels=("ditto",), metric="v"))
    assert rep.choose_lrs(claim, tmp_path, set()) == ({}, [
        "Learning rate chosen on validation (`v` after 20 rounds, seed 0) from 0.1:", "",
        "- ditto: the configured lr (no grid run finished)", ""])  # fmt: skip
    assert rep.choose_lrs(tiny_claim(), tmp_path, set()) == ({}, [])


# --- the suite on fake runs -----------------------------------------------------------------------------


class SteppedClock:
    """``time`` for the suite's module, whose ``perf_counter`` moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.time, self.strftime = time.time, time.strftime

    def perf_counter(self) -> float:
        return self.now


def test_the_report_has_the_header_table_the_section_and_the_paired_contrast(fake, tmp_path, capsys, monkeypatch):
    absent = Claim(
        "absent", "Other", "needs a missing method", BASE, {"x": ["--method.name", "nope"]}, beats("x", [], "m")
    )
    monkeypatch.setattr(rep, "all_claims", lambda: [absent, tiny_claim(winner="ditto")])
    clock, claim_jobs = SteppedClock(), rep.claim_jobs
    monkeypatch.setattr(rep, "time", clock)

    def checked_in_125_s(*args, **kwargs):  # the check of the configurations is all this invocation's time
        clock.now += 125
        return claim_jobs(*args, **kwargs)

    monkeypatch.setattr(rep, "claim_jobs", checked_in_125_s)
    report = rep.run_claims(tmp_path / "new" / "out", workers=3).read_text()  # the folder is made
    tmp_path = tmp_path / "new" / "out"
    assert fake.calls == [("reproduce", ["tiny/local/s0", "tiny/ditto/s0", "tiny/local/s1", "tiny/ditto/s1"], 3)]
    out = capsys.readouterr().out.splitlines()
    assert "reproduce: 4 runs to do, 0 reused, 3 worker(s)" in out
    # the claim that can run (its method exists) is checked first, with a line before and after
    assert out[0] == "checking the runs' configurations of 1 claim(s) before any run starts"
    assert out[1] == "2 configurations checked in 125 s"
    assert report.startswith("# Reproduction report\n\nGenerated ")
    assert f"on {device_label()}, embedded data; full: every claim over its seeds.\n" in report
    assert "QUICK" not in report
    # the fake runs record no platform, as an older pfl's: said in the line after "Generated"
    assert "embedded data; full: every claim over its seeds.\nNumbers computed on a platform not recorded" in report
    assert "| claim | verdict | runs | CPU-minutes | run-minutes |\n|---|---|---|---|---|\n" in report
    assert "| absent | not run | 0 | 0.0 | 0.0 |\n| tiny | held | 4 | 8.0 | 10.0 |\n" in report
    # this invocation's own time (125 s), not its runs' recorded 10 run-minutes
    assert "\nMeasured wall time of this invocation: 2.1 min with 3 worker(s); it ran 4 run" in report
    assert "it ran 4 run(s) and reused 0.\n" in report
    assert (
        "Recorded time of the report's 4 runs: 8.0 CPU-minutes, about 2.7 min of wall time with 3 worker(s)" in report
    )
    assert "(10.0 run-minutes of wall time as measured, which grows with other load on the machine).\n" in report
    absent_section = "## Other: absent\n\nClaim: needs a missing method.\n\nNot run: methods not available yet: nope."
    assert f"{absent_section}\n\n## Paper: tiny\n" in report  # the claims after it are still reported
    tiny = section(report, "tiny")
    assert tiny.startswith("\nClaim: ditto beats local.\n\nGain, R-Acc and PTR are per client against the suite's own")
    assert "Mean ± std over 2 seed(s) (0, 1):" in tiny and "Failed" not in tiny
    assert re.search(r"^\| ditto \| ditto \| 2 \| \*\*0\.6500 ± 0\.0707\*\* \|", tiny, re.M)
    assert re.search(r"^\| local \| local \| 2 \| 0\.5250 ± 0\.0354 \|", tiny, re.M)
    assert "| contrast | s0 | s1 | mean | std | margin | verdict |\n|---|---|---|---|---|---|---|\n" in tiny
    assert "| ditto - local (pm.l_acc) | +0.1000 | +0.1500 | +0.1250 | 0.0354 | +0.0000 | held |" in tiny
    assert "\n**Verdict: held**\n" in tiny and "Measured causes" not in tiny
    assert "\n![tiny](tiny.png)\n\n![tiny curves](tiny_curves.png)\n\n![tiny clients](tiny_clients.png)\n" in tiny
    assert tiny.endswith("(4 runs, 8.0 CPU-minutes, 10.0 run-minutes)\n\n")  # the last section, then the end
    for name in ("tiny.png", "tiny_curves.png", "tiny_clients.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert not (tmp_path / "absent.png").exists()


def test_gain_over_local_reaches_the_table_client_by_client(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(metrics=("gain", "r_acc.mean", "ptr"))])
    tiny = section(rep.run_claims(tmp_path).read_text(), "tiny")
    # every ditto client is 0.1 (seed 0) or 0.15 (seed 1) above its local one: relative gains 0.1 / 0.4 ...
    r_acc = [sum(d / (m - 0.1 + k * 0.1) for k in range(3)) / 3 for d, m in ((0.1, 0.5), (0.15, 0.55))]
    assert f"{sum(r_acc) / 2:.4f} ± {abs(r_acc[0] - r_acc[1]) / math.sqrt(2):.4f}" == "0.2422 ± 0.0519"
    assert "| ditto | ditto | 2 | **0.1250 ± 0.0354** | **0.2422 ± 0.0519** | **1.0000 ± 0.0000** |" in tiny
    assert "| local | local | 2 | 0.0000 ± 0.0000 | 0.0000 ± 0.0000 | **1.0000 ± 0.0000** |" in tiny


def test_a_claim_without_a_local_run_has_no_gain_sentence(fake, tmp_path, monkeypatch):
    runs = {"strong": RUNS["ditto"], "plain": ["--method.name", "fedavg"]}
    fake.score = lambda name, argv: 0.6 if "strong" in name else 0.5
    claim = tiny_claim(runs=runs, contrasts=beats("strong", ["plain"], "pm.l_acc"))
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    tiny = section(rep.run_claims(tmp_path).read_text(), "tiny")
    assert "Gain, R-Acc" not in tiny and "| strong - plain (pm.l_acc) | +0.1000 | +0.1000 |" in tiny
    assert "| strong | ditto | 2 |" in tiny and "| plain | fedavg | 2 |" in tiny  # a row per label, not per run


def test_only_the_named_claims_run(fake, tmp_path, monkeypatch):
    other = tiny_claim(key="other")
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(), other])
    report = rep.run_claims(tmp_path, only=["other"]).read_text()
    assert fake.calls[0][1][0] == "other/local/s0" and "## Paper: tiny" not in report and "| tiny |" not in report


def test_runs_limits_each_claim_to_those_labels_and_its_verdict_to_their_contrasts(fake, tmp_path, monkeypatch):
    scores = {**SCORES, ("fedavg", 0): 0.4, ("fedavg", 1): 0.45}
    fake.score = lambda name, argv: scores[(name.split("/")[-2], int(flag(argv, "--seed")))]
    runs = {**RUNS, "fedavg": ["--method.name", "fedavg"]}
    seen: list[list[str]] = []

    def causes(s):
        seen.append(sorted({label for runs in s.values() for label in runs}))
        return [f"{s[0]['fedavg']}"]  # a cause that reads a run left out

    claim = tiny_claim(runs=runs, contrasts=beats("fedavg", ["local", "ditto"], "pm.l_acc"), diagnose=causes)
    without = tiny_claim(key="without", runs={"solo": runs["fedavg"]})  # none of the labels asked for
    monkeypatch.setattr(rep, "all_claims", lambda: [claim, without])
    tiny = section(rep.run_claims(tmp_path, runs=["local", "fedavg"]).read_text(), "tiny")
    ran = {name for _, jobs, _ in fake.calls for name in jobs}
    assert ran == {"tiny/local/s0", "tiny/local/s1", "tiny/fedavg/s0", "tiny/fedavg/s1"}
    assert "Partial: only the runs local, fedavg (`--runs`); the verdict covers their contrasts." in tiny
    assert tiny.index("| fedavg | fedavg |") < tiny.index("Partial: only")  # under the table of the runs that ran
    assert "fedavg - local (pm.l_acc)" in tiny and "fedavg - ditto" not in tiny  # no result: left out
    assert "**Verdict: not held (partial)**" in tiny and seen == [["fedavg", "local"]]
    assert "- Not computed: needs the run 'fedavg', not among `--runs`." not in tiny  # fedavg ran: no KeyError
    assert "## Paper: without" not in rep.run_claims(tmp_path / "b", runs=["local"]).read_text()
    assert not (tmp_path / "without").exists()


def test_runs_are_checked_against_the_runs_of_the_claims_chosen_only():
    claims = [tiny_claim(), tiny_claim(key="other", runs={"solo": RUNS["local"]})]
    options.check_runs(claims, ["other"], ["solo"])
    options.check_runs(claims, None, ["ditto", "solo"])
    refused = r"^--runs: 'ditto' is not a run of the claims chosen \(choose one of solo\)$"
    with pytest.raises(ConfigError, match=refused):
        options.check_runs(claims, ["other"], ["ditto"])


def test_a_partial_claims_notes_name_a_run_they_need_that_did_not_run(fake, tmp_path, monkeypatch):
    claim = tiny_claim(notes=lambda s: [f"ditto scored {s[0]['ditto']['metrics']['pm.l_acc.mean']}"])
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    tiny = section(rep.run_claims(tmp_path, runs=["local"]).read_text(), "tiny")
    assert "\n\nNot computed: needs the run 'ditto', not among `--runs`.\n" in tiny
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(notes=claim.notes, runs={"local": RUNS["local"]})])
    with pytest.raises(KeyError):  # a whole claim's notes that fail are a fault, not a partial table
        rep.run_claims(tmp_path / "whole")


def test_a_claim_not_held_lists_its_measured_causes_and_one_held_does_not(fake, tmp_path, monkeypatch):
    causes = lambda s: [f"{len(s)} seeds measured", "second cause"]  # noqa: E731
    monkeypatch.setattr(
        rep, "all_claims", lambda: [tiny_claim(contrasts=beats("local", ["ditto"], "pm.l_acc"), diagnose=causes)]
    )
    report = rep.run_claims(tmp_path).read_text()
    assert "\n**Verdict: not held**\n\nMeasured causes:\n\n- 2 seeds measured\n- second cause\n" in report
    assert "| tiny | not held | 4 |" in report


def test_notes_are_printed_under_the_table_whatever_the_verdict(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(notes=lambda s: ["a flag", f"seeds {sorted(s)}"])])
    tiny = section(rep.run_claims(tmp_path).read_text(), "tiny")
    table_end = tiny.index("| local | local |")
    assert tiny.index("\n\na flag\nseeds [0, 1]\n\n| contrast |") > table_end


def test_a_contrast_whose_run_failed_everywhere_is_not_decidable(fake, tmp_path, monkeypatch):
    fake.codes = {"tiny/ditto/s0": 1, "tiny/ditto/s1": 1}

    def needs_ditto(s):
        return [Contrast("x", {seed: s[seed]["ditto"]["metrics"]["pm.l_acc.mean"] for seed in s})]

    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(contrasts=needs_ditto)])
    with pytest.raises(ConfigError, match=r"2 of 4 runs failed: tiny/ditto/s0: boom; tiny/ditto/s1: boom \(left out"):
        rep.run_claims(tmp_path)
    tiny = section((tmp_path / "REPORT.md").read_text(), "tiny")
    assert tiny.startswith(
        "\nClaim: ditto beats local.\n\nFailed (left out of the table and the check): tiny/ditto/s0, "
    )
    assert "\nNot decidable: 'ditto' has no result.\n\nNo contrast could be computed.\n\n**Verdict: tie**" in tiny


def test_a_diverged_run_is_a_finding_and_a_crash_fails_the_suite_after_the_report(fake, tmp_path, capsys):
    fake.codes = {"tiny/ditto/s1": EXIT_DIVERGED}
    report = rep.run_claims(tmp_path)  # no error: a divergence is a finding about the method
    assert capsys.readouterr().out.endswith(f"1 run(s) diverged, named in {report}: tiny/ditto/s1\n")
    text = report.read_text()
    assert "Failed (left out of the table and the check): tiny/ditto/s1." in text
    assert "| ditto - local (pm.l_acc) | +0.1000 | - | +0.1000 | 0.0000 | +0.0000 | held (indicative, 1 seed) |" in text
    assert (
        "| tiny | held | 3 + 1 diverged | 8.0 | 10.0 |" in text
    )  # the indicative mark is the contrast's; the diverged try timed
    fake.codes = {"tiny/ditto/s1": EXIT_DIVERGED, "tiny/local/s1": 2}
    with pytest.raises(ConfigError, match="tiny/local/s1: boom"):
        rep.run_claims(tmp_path)
    assert "diverged" not in capsys.readouterr().out  # the failure is what is reported


def test_a_run_that_never_reported_its_end_is_a_failure_of_the_suite(fake, tmp_path, monkeypatch):
    def stops_at_once(jobs, workers, what, on_finish, fresh=False, pool=None):
        raise ConfigError(what, "the workers stopped")

    monkeypatch.setattr(rep, "run_parallel", stops_at_once)
    with pytest.raises(ConfigError, match="the workers stopped"):
        rep.run_claims(tmp_path)
    assert (
        "Failed (left out of the table and the check): tiny/local/s0, tiny/ditto/s0, "
        in (tmp_path / "REPORT.md").read_text()
    )


def test_a_run_that_failed_now_is_not_replaced_by_the_summary_an_earlier_suite_left(fake, tmp_path):
    rep.run_claims(tmp_path)
    old = tmp_path / "tiny" / "ditto" / "s1" / "summary.json"
    os.utime(old, (1.0, 1.0))  # an earlier suite's result
    fake.codes = {"tiny/ditto/s1": EXIT_DIVERGED}
    report = rep.run_claims(tmp_path).read_text()
    assert "Failed (left out of the table and the check): tiny/ditto/s1." in report
    assert "| tiny | held | 3 + 1 diverged | 8.0 | 10.0 |" in report
    assert "(3 + 1 diverged runs, 8.0 CPU-minutes, 10.0 run-minutes)" in report
    fake.codes = {}
    kept = rep.run_claims(tmp_path, reuse=True).read_text()  # reused: an earlier result is this suite's
    # and the folder's diverged try still counts: its time was spent on this folder's runs
    assert "Failed" not in kept and "| tiny | held | 4 + 1 diverged |" in kept and fake.calls[-1][1] == []


def test_finished_runs_are_reused_only_when_asked(fake, tmp_path, capsys):
    rep.run_claims(tmp_path)
    (tmp_path / "tiny" / "local" / "s1" / "summary.json").unlink()
    rep.run_claims(tmp_path, reuse=True)
    assert fake.calls[-1] == ("reproduce", ["tiny/local/s1"], 1)
    assert "reproduce: 1 runs to do, 3 reused, 1 worker(s)" in capsys.readouterr().out
    report = (tmp_path / "REPORT.md").read_text()
    assert "it ran 1 run(s) and reused 3." in report
    rep.run_claims(tmp_path)
    assert len(fake.calls[-1][1]) == 4 and "it ran 4 run(s) and reused 0." in (tmp_path / "REPORT.md").read_text()


def test_the_grid_runs_first_and_the_claims_runs_use_the_lr_it_chose(fake, tmp_path, monkeypatch):
    grid = LrGrid((0.01, 0.3), labels=("ditto",), rounds=5)
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=grid)])
    fake.score = lambda name, argv: (
        (lambda lr: lr if lr <= 0.3 else 0.0)(float(flag(argv, "--client.lr")))  # the best lr is 0.3
        if "_lr" in name
        else SCORES[(name.split("/")[1], int(flag(argv, "--seed")))]
    )
    report = rep.run_claims(tmp_path).read_text()
    assert [c[:2] for c in fake.calls] == [
        ("lr grid", ["tiny/_lr/ditto/lr0.01", "tiny/_lr/ditto/lr0.3"]),
        ("lr grid edge", ["tiny/_lr/ditto/lr9"]),  # 0.3 is the grid's top: one step (x30) past it
        ("reproduce", ["tiny/local/s0", "tiny/ditto/s0", "tiny/local/s1", "tiny/ditto/s1"]),
    ]
    assert flag(fake.argv["tiny/ditto/s1"], "--client.lr") == "0.3" and "--client.lr" not in fake.argv["tiny/local/s0"]
    assert "Claim: ditto beats local.\n\nLearning rate chosen on validation (`pm.val_acc.mean` after 5 rounds" in report
    edge = "9: 0.0000; 9 added: the grid's choice was on its edge"
    assert f"- ditto: **0.3** (0.01: 0.0100, 0.3: 0.3000, {edge})\n" in report
    assert "| run | method | client.lr | n | pm.l_acc |" in report  # the runs' configs tell their settings apart
    assert "| ditto | ditto | 0.3 | 2 | **0.6500 ± 0.0707** |" in report and "| local | local | 0.05 | 2 |" in report
    assert "| tiny | held | 7 (3 lr grid) | 14.0 | 17.5 |" in report
    assert report.rstrip().endswith("(7 (3 lr grid) runs, 14.0 CPU-minutes, 17.5 run-minutes)")
    assert "it ran 7 run(s) and reused 0." in report  # every phase's runs: the grid's, its edge's, the claim's
    again = rep.run_claims(tmp_path, reuse=True).read_text()
    assert fake.calls[-1][1] == [] and "it ran 0 run(s) and reused 7." in again


def test_every_phase_of_a_suite_runs_in_one_pool_of_warm_workers_that_ends_with_it(fake, tmp_path, monkeypatch):
    closed = []

    class Pool(rep.WorkerPool):
        def close(self) -> None:
            closed.append(self)
            super().close()

    monkeypatch.setattr(rep, "WorkerPool", Pool)
    grid = LrGrid((0.01, 0.3), labels=("ditto",), rounds=5)
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=grid)])
    rep.run_claims(tmp_path / "a")
    [pool] = set(fake.pools)  # the lr grid, its edge step and the claim's runs
    assert len(fake.pools) == 3 and isinstance(pool, Pool) and closed == [pool]
    given = rep.WorkerPool()
    rep.run_claims(tmp_path / "b", pool=given)
    assert fake.pools[3:] == [given] * 3 and closed == [pool]  # a pool given is its owner's to close
    fake.codes = {"tiny/local/s1": 1}
    with pytest.raises(ConfigError, match="tiny/local/s1"):
        rep.run_claims(tmp_path / "c")
    assert len(closed) == 2  # closed also when the suite ends in an error


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"only": ["tiny", "tinny"]}, r"--only: 'tinny' is not a claim of the suite \(did you mean tiny\?\)"),
        ({"workers": 0}, r"--workers: 0 is not a number of worker processes \(give 1 or more\)"),
        ({"runs": ["local", "dito"]}, r"--runs: 'dito' is not a run of the claims chosen \(did you mean ditto\?\)"),
        (
            {"accelerator": "gpu"},
            r"--accelerator: 'gpu' is not one the suite runs on \(give auto \(a GPU when there is one\), cpu or cuda\)",
        ),
    ],
)
def test_an_unknown_claim_or_run_accelerator_or_no_worker_is_refused_before_anything_runs(fake, tmp_path, kw, problem):
    with pytest.raises(ConfigError, match=f"^{problem}$"):
        rep.run_claims(tmp_path / "out", **kw)
    assert fake.calls == [] and not (tmp_path / "out").exists()


def test_an_out_folder_under_a_file_is_refused_before_anything_runs(fake, tmp_path):
    (tmp_path / "file").write_text("kept")
    for out in (tmp_path / "file", tmp_path / "file" / "suite"):
        with pytest.raises(ConfigError, match=rf"^--out: {out} cannot be created: .*file is a file.*another --out"):
            rep.run_claims(out)
    assert fake.calls == [] and (tmp_path / "file").read_text() == "kept"


def test_a_chosen_lr_that_diverges_on_a_seed_is_left_out_and_the_labels_seeds_run_at_the_next(
    fake, tmp_path, monkeypatch
):
    grid = LrGrid((0.01, 0.03, 0.3), labels=("ditto",), rounds=5)
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=grid)])
    fake.score = lambda name, argv: (
        (lambda lr: lr if lr <= 0.3 else 0.0)(float(flag(argv, "--client.lr")))  # 0.3 best, then 0.03
        if "_lr" in name
        else SCORES[(name.split("/")[1], int(flag(argv, "--seed")))]
    )
    fake.code = lambda name, argv: EXIT_DIVERGED * (name == "tiny/ditto/s1" and flag(argv, "--client.lr") == "0.3")
    report = rep.run_claims(tmp_path).read_text()
    assert [c[:2] for c in fake.calls[2:]] == [
        ("reproduce", ["tiny/local/s0", "tiny/ditto/s0", "tiny/local/s1", "tiny/ditto/s1"]),
        ("reproduce (the next lr after a divergence)", ["tiny/ditto/s0", "tiny/ditto/s1"]),  # every seed again
    ]
    assert flag(fake.argv["tiny/ditto/s0"], "--client.lr") == "0.03" == flag(fake.argv["tiny/ditto/s1"], "--client.lr")
    assert "- ditto: **0.03** (0.01: 0.0100, 0.03: 0.0300, 0.3: 0.3000, 3: 0.0000; 3 added: the grid's choice was on " \
        "its edge; 0.3 left out: a run of the claim diverged at it)\n" in report  # fmt: skip
    assert "| ditto | ditto | 0.03 | 2 |" in report and "Failed" not in report  # both seeds, at one lr
    assert json.loads((tmp_path / "tiny" / "_lr" / "unstable.json").read_text()) == {"ditto": [0.3]}
    # the diverged try's time counts beside its second try's: 8 runs with a result and 1 try, 120 CPU-s each
    assert json.loads((tmp_path / "diverged_seconds.json").read_text()) == {"tiny/ditto/s1": [150.0, 120.0]}
    assert report.rstrip().endswith("(8 (4 lr grid) + 1 diverged runs, 18.0 CPU-minutes, 22.5 run-minutes)")
    assert "Recorded time of the report's 8 runs and of 1 diverged run(s): 18.0 CPU-minutes" in report
    fake.calls.clear()
    again = rep.run_claims(tmp_path, reuse=True).read_text()  # the choice stands: nothing runs again
    assert [c[:2] for c in fake.calls] == [("lr grid", []), ("lr grid edge", []), ("reproduce", [])]
    assert "- ditto: **0.03** (" in again and "| ditto | ditto | 0.03 | 2 |" in again
    assert again.rstrip().endswith("(8 (4 lr grid) + 1 diverged runs, 18.0 CPU-minutes, 22.5 run-minutes)")


def test_the_diverged_labels_of_every_claim_go_again_together_and_only_they(fake, tmp_path, monkeypatch):
    grid = LrGrid((0.03, 0.3), rounds=5)  # both labels choose 0.3
    base = [*BASE, "--data.val_frac", "0.2"]
    claims = [tiny_claim(key=key, base=base, lr_grid=grid) for key in ("calm", "one", "two")]
    monkeypatch.setattr(rep, "all_claims", lambda: claims)
    fake.score = lambda name, argv: (
        (lambda lr: lr if lr <= 0.3 else 0.0)(float(flag(argv, "--client.lr")))
        if "_lr" in name
        else SCORES[(name.split("/")[1], int(flag(argv, "--seed")))]
    )
    fake.code = lambda name, argv: (
        EXIT_DIVERGED * (name in ("one/ditto/s1", "two/ditto/s0") and flag(argv, "--client.lr") == "0.3")
    )
    rep.run_claims(tmp_path)
    assert fake.calls[-1][:2] == (
        "reproduce (the next lr after a divergence)",
        ["one/ditto/s0", "one/ditto/s1", "two/ditto/s0", "two/ditto/s1"],
    )
    assert all(flag(fake.argv[f"{k}/ditto/s1"], "--client.lr") == "0.03" for k in ("one", "two"))
    for key in ("one", "two"):
        assert json.loads((tmp_path / key / "_lr" / "unstable.json").read_text()) == {"ditto": [0.3]}
    assert not (tmp_path / "calm" / "_lr" / "unstable.json").exists()


def test_a_diverged_choice_without_another_finished_lr_is_kept_and_its_run_named(fake, tmp_path, monkeypatch):
    grid = LrGrid((0.3,), labels=("ditto",), rounds=5)  # one value: nothing else to take
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=grid)])
    fake.score = lambda name, argv: 0.5 if "_lr" in name else SCORES[(name.split("/")[1], int(flag(argv, "--seed")))]
    fake.code = lambda name, argv: EXIT_DIVERGED * (name == "tiny/ditto/s1")
    report = rep.run_claims(tmp_path).read_text()
    assert [c[0] for c in fake.calls] == ["lr grid", "reproduce"]  # no edge step, no second try
    assert "- ditto: **0.3** (0.3: 0.5000)\n" in report and "tiny/ditto/s1" in report
    assert not (tmp_path / "tiny" / "_lr" / "unstable.json").exists()


def test_a_run_of_another_lr_than_the_grids_choice_is_not_done(tmp_path):
    claim = tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=LrGrid((0.01, 0.3), labels=("ditto",)))
    (_, ditto, *_) = rep.claim_jobs(claim, tmp_path, quick=False, lrs={"ditto": 0.3})
    assert ditto.chosen == ("client.lr", 0.3)
    write_run([*ditto.argv, "--client.lr", "0.01"], 0.5)  # a stopped suite's seed at the lr left out
    assert not ditto.done()
    write_run(ditto.argv, 0.5)
    assert ditto.done()
    (ditto.run_dir / "config.yaml").write_text("client: [unclosed")
    assert not ditto.done()  # unreadable: run again
    (tmp_path / "tiny" / "_lr").mkdir(parents=True)
    for bad in ('"0.3"', '[0.3, "x"]'):
        (tmp_path / "tiny" / "_lr" / "unstable.json").write_text(f'{{"ditto": {bad}}}')
        with pytest.raises(ConfigError, match=r"unstable\.json: 'ditto' is not a list of learning rates"):
            rep.unstable_lrs(claim, tmp_path)


def test_a_choice_on_the_grids_edge_extends_it_one_step_that_way_and_chooses_again(fake, tmp_path, monkeypatch):
    grid = LrGrid((0.01, 0.05, 0.1), rounds=5)
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=grid)])
    best = {"local": 0.01, "ditto": 0.2}  # local peaks below the grid, ditto above it

    def score(name: str, argv: list[str]) -> float:
        if "_lr" not in name:
            return SCORES[(name.split("/")[1], int(flag(argv, "--seed")))]
        return 1.0 - abs(math.log(float(flag(argv, "--client.lr")) / best[name.split("/")[2]]))

    fake.score = score
    report = rep.run_claims(tmp_path).read_text()
    assert fake.calls[1][:2] == ("lr grid edge", ["tiny/_lr/local/lr0.002", "tiny/_lr/ditto/lr0.2"])
    assert flag(fake.argv["tiny/ditto/s0"], "--client.lr") == "0.2"  # the extension won
    assert flag(fake.argv["tiny/local/s0"], "--client.lr") == "0.01"  # the edge value beat the step past it
    assert "- local: **0.01** (0.01: 1.0000, 0.05: -0.6094, 0.1: -1.3026, 0.002: -0.6094; 0.002 added" in report
    assert "- ditto: **0.2** (0.01: -1.9957, 0.05: -0.3863, 0.1: 0.3069, 0.2: 1.0000; 0.2 added" in report
    assert "| tiny | held | 12 (8 lr grid) |" in report


def test_a_grid_is_extended_only_past_the_edge_its_choice_is_on():
    assert rep.beyond_edge((0.01, 0.05, 0.1), 0.1) == 0.2
    assert rep.beyond_edge((0.1, 0.05, 0.01), 0.01) == 0.002  # the order of the values does not matter
    assert rep.beyond_edge((0.01, 0.05, 0.1), 0.05) is None
    assert rep.beyond_edge((0.1,), 0.1) is None  # one value: no direction
    assert rep.beyond_edge((0.001, 0.1), 0.1) == 10.0
    claim = tiny_claim(lr_grid=LrGrid((0.01, 0.05, 0.1)))
    assert rep.edge_steps(claim, {"local": 0.05, "ditto": 0.01}) == {"ditto": 0.002}
    assert rep.edge_steps(tiny_claim(), {"ditto": 0.01}) == {}


def test_a_grid_run_that_failed_now_is_not_chosen_on_an_earlier_suites_result(fake, tmp_path, monkeypatch):
    grid = LrGrid((0.01, 0.3), labels=("ditto",), rounds=5)
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(base=[*BASE, "--data.val_frac", "0.2"], lr_grid=grid)])
    fake.score = lambda name, argv: (
        (lambda lr: lr if lr <= 0.3 else 0.0)(float(flag(argv, "--client.lr")))  # the best lr is 0.3
        if "_lr" in name
        else SCORES[(name.split("/")[1], int(flag(argv, "--seed")))]
    )
    rep.run_claims(tmp_path)
    os.utime(tmp_path / "tiny" / "_lr" / "ditto" / "lr0.3" / "summary.json", (1.0, 1.0))  # an earlier suite's
    fake.codes = {"tiny/_lr/ditto/lr0.3": EXIT_DIVERGED}
    report = rep.run_claims(tmp_path).read_text()
    step = "0.000333333: 0.0003; 0.000333333 added: the grid's choice was on its edge"  # 0.01 is now its bottom
    assert f"- ditto: **0.01** (0.01: 0.0100, {step})\n" in report
    assert flag(fake.argv["tiny/ditto/s0"], "--client.lr") == "0.01"
    assert "| tiny | held | 6 (2 lr grid) + 1 diverged |" in report  # the diverged grid run timed too
    fake.codes = {}
    reused = rep.run_claims(tmp_path, reuse=True).read_text()  # reused, the earlier result is this suite's
    assert "- ditto: **0.3** (0.01: 0.0100, 0.3: 0.3000, 9: 0.0000; 9 added" in reused
    assert "| tiny | held | 7 (3 lr grid) + 1 diverged |" in reused


def test_quick_runs_the_first_seed_a_tenth_of_the_rounds_and_no_grid(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(lr_grid=LrGrid((0.1,)), diagnose=lambda s: ["cause"])])
    report = rep.run_claims(tmp_path, quick=True).read_text()
    assert fake.calls == [("reproduce", ["tiny/local/s0", "tiny/ditto/s0"], 1)]
    assert flag(fake.argv["tiny/ditto/s0"], "--trainer.rounds") == "2"
    assert "; QUICK: one seed, 1/10 of the rounds, no lr grid: a smoke test, every verdict indicative.\n" in report
    assert "\nLearning-rate grid: off in QUICK (the configured learning rates).\n" in report
    assert "Mean ± std over 1 seed(s) (0):" in report
    assert "\n**Verdict: held (indicative, 1 seed)**\n" in report and "Measured causes" not in report
    assert "| tiny | held (indicative, 1 seed) | 2 |" in report


def test_the_plots_are_titled_with_the_claim_and_its_verdict_and_name_the_runs_by_label(fake, tmp_path, monkeypatch):
    import pfl.metrics.plots as plots

    drawn = {}
    monkeypatch.setattr(rep, "save_figure", lambda fig, path, dpi=None: drawn.setdefault(path.name, fig))
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi=None: drawn.setdefault(path.name, fig))
    runs = {"mine": RUNS["ditto"], "local": RUNS["local"]}
    fake.score = lambda name, argv: SCORES[(name.split("/")[1].replace("mine", "ditto"), int(flag(argv, "--seed")))]
    contrasts = beats("mine", ["local"], "pm.l_acc")
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(runs=runs, contrasts=contrasts, winner="mine")])
    rep.run_claims(tmp_path)
    assert sorted(drawn) == ["tiny.png", "tiny_clients.png", "tiny_curves.png"]
    (bars, curves, clients) = (drawn[name].axes[0] for name in ("tiny.png", "tiny_curves.png", "tiny_clients.png"))
    assert bars.get_title() == "Paper: tiny (held)"
    assert curves.get_title().startswith("Paper: tiny (held)\n") and clients.get_title().startswith(
        "Paper: tiny (held)\n"
    )
    assert [t.get_text() for t in curves.get_legend().get_texts()] == ["mine (2 seeds)", "local (2 seeds)"]
    assert [t.get_text().split("\n")[0] for t in clients.get_xticklabels()] == ["mine", "local"]


def test_runs_without_a_common_curve_get_a_sentence_instead_of_a_plot(fake, tmp_path, monkeypatch):
    rep.run_claims(tmp_path)
    (tmp_path / "tiny" / "ditto" / "s0" / "metrics.csv").write_text("round,other\n1,0.5\n")
    for name in ("tiny_curves.png", "tiny_clients.png"):
        (tmp_path / name).unlink()
    tiny = section(rep.run_claims(tmp_path, reuse=True).read_text(), "tiny")
    assert "\nNo curves plot: none of " in tiny and "is in every run's metrics.csv (missing in s0; " in tiny
    assert "![tiny curves]" not in tiny and "![tiny clients](tiny_clients.png)" in tiny
    assert not (tmp_path / "tiny_curves.png").exists() and (tmp_path / "tiny_clients.png").exists()
    without_local = tiny_claim(runs={"ditto": RUNS["ditto"]}, contrasts=lambda s: [])  # no gain over local to add
    monkeypatch.setattr(rep, "all_claims", lambda: [without_local])
    (tmp_path / "tiny" / "ditto" / "s0" / "clients.csv").write_text("client,other\n0,0.5\n")
    tiny = section(rep.run_claims(tmp_path, reuse=True).read_text(), "tiny")
    assert "\nNo curves plot: " in tiny and "\n\nNo clients plot: none of " in tiny  # each says why


# --- time records ---------------------------------------------------------------------------------------


def test_each_finished_run_is_recorded_on_disk_at_once_and_failed_runs_only_by_their_code(tmp_path):
    times = rep.RunTimes(tmp_path, workers=2)
    times.record("a", 0, 10.0, 7.5)
    assert json.loads((tmp_path / "seconds.json").read_text()) == {"a": 10.0}
    assert json.loads((tmp_path / "cpu_seconds.json").read_text()) == {"a": 7.5}
    assert (tmp_path / "seconds.json").read_text() == '{\n "a": 10.0\n}\n'
    [line] = json.loads((tmp_path / "invocations.json").read_text())
    assert line["workers"] == 2 and line["runs"] == 1 and line["started"] == times.started
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", times.started)  # when it started, to the minute
    times.record("b", 3, 5.0, 4.0)
    times.record("c", 0, 6.0, None)  # no CPU time on this platform
    assert times.codes == {"a": 0, "b": 3, "c": 0}
    assert json.loads((tmp_path / "seconds.json").read_text()) == {"a": 10.0, "c": 6.0}
    assert json.loads((tmp_path / "cpu_seconds.json").read_text()) == {"a": 7.5}
    assert json.loads((tmp_path / "invocations.json").read_text())[0]["runs"] == 2
    assert times.of([rep.Job("k", "l", 0, [], tmp_path, n) for n in "abc"]) == rep.ClaimTime(3, 16.0, 7.5, 2, 0)
    assert json.loads((tmp_path / "devices.json").read_text()) == {"a": device_label(), "c": device_label()}


def test_a_diverged_try_is_timed_apart_and_its_time_stays_beside_a_second_try_of_the_same_run(tmp_path):
    times = rep.RunTimes(tmp_path)
    times.record("a", EXIT_DIVERGED, 5.0, 4.0)
    times.record("b", EXIT_DIVERGED, 3.0, None)  # no CPU time on this platform
    times.record("c", 1, 2.0, 1.0)  # any other failure: only its code
    assert json.loads((tmp_path / "diverged_seconds.json").read_text()) == {"a": [5.0, 4.0], "b": [3.0, None]}
    assert not (tmp_path / "seconds.json").exists() and times.invocations() == []  # no run finished
    times.record("a", 0, 10.0, 7.5)  # its second try, at the next lr
    times.record("b", EXIT_DIVERGED, 6.0, 5.0)  # diverged again: the last try's time (one suite's cost)
    assert json.loads((tmp_path / "seconds.json").read_text()) == {"a": 10.0}
    assert rep.RunTimes(tmp_path).diverged == {"a": [5.0, 4.0], "b": [6.0, 5.0]}  # read back by a reuse
    jobs = {n: rep.Job("k", "l", 0, [], tmp_path, n) for n in "abc"}
    tried = [jobs["a"], jobs["b"], jobs["c"], jobs["a"]]  # a run listed twice is one try
    assert times.of([jobs["a"]], [], tried) == rep.ClaimTime(1, 21.0, 16.5, 0, 0, 2)
    assert times.of([jobs["a"]]) == rep.ClaimTime(1, 10.0, 7.5, 0)  # another claim's tries are not its own
    times.record("b", EXIT_DIVERGED, 2.0, None)
    assert times.of([], [], [jobs["b"]]) == rep.ClaimTime(0, 2.0, 0.0, 0, 0, 1)


@pytest.mark.parametrize(
    "text", ['{"a": "x"}', '{"a": [1.0]}', '{"a": [-1.0, 2.0]}', '{"a": [1.0, "x"]}', '{"a": [true, 1.0]}', "[]"]
)
def test_a_broken_record_of_diverged_tries_is_refused_by_name_and_left_as_it_was(tmp_path, text):
    path = tmp_path / "diverged_seconds.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{re.escape(str(path))}: .*remove or restore it"):
        rep.RunTimes(tmp_path)
    assert path.read_text() == text
    path.write_text('{"a": [1, null], "b": [0.5, 0]}')
    assert rep.RunTimes(tmp_path).diverged == {"a": [1, None], "b": [0.5, 0]}


def test_a_runs_split_is_recorded_beside_its_wall_time_and_replaced_with_it(tmp_path):
    times = rep.RunTimes(tmp_path)
    split = {"rounds": 2, "rounds_s": 1.5, "evaluations": 1, "evaluations_s": 0.5}
    times.record("a", 0, 3.0, 2.0, split)
    times.record("b", 3, 3.0, 2.0, split)  # a failed run: only its code
    assert json.loads((tmp_path / "timing.json").read_text()) == {"a": split}
    times.record("a", 0, 4.0, 3.0)  # again, by a pfl without the split: the old one would not fit the new wall time
    assert json.loads((tmp_path / "timing.json").read_text()) == {"a": None}
    assert rep.RunTimes(tmp_path).timing == {"a": None}


@pytest.mark.parametrize(
    "record",
    [
        None,  # recorded by an older pfl
        {"rounds": 2, "rounds_s": 1.0, "evaluations": 1},
        {"rounds": 2, "rounds_s": "soon", "evaluations": 1, "evaluations_s": 0.5},
        {"rounds": 0, "rounds_s": 0.0, "evaluations": 1, "evaluations_s": 0.5},
        {"rounds": 2, "rounds_s": 1.0, "evaluations": 0, "evaluations_s": 0.0},
    ],
)
def test_a_record_that_is_no_split_of_rounds_and_evaluations_is_not_one(record):
    assert split_of(record) is None


def test_a_split_is_read_from_its_record_and_a_run_evaluates_every_eval_every_rounds_and_after_the_last():
    record = {"rounds": 1, "rounds_s": 2, "evaluations": 1, "evaluations_s": 0.5}
    assert split_of(record) == Split(1, 2.0, 1, 0.5)
    assert [evaluations(r, 5) for r in (1, 4, 5, 6, 20, 22)] == [1, 1, 1, 2, 4, 5]
    assert evaluations(2, 2) == evaluations(2, 1) - 1 == 1


def test_a_full_run_costs_its_quick_runs_seconds_per_round_and_per_evaluation_and_its_fixed_part_once():
    # 10 s: 4 s in 2 rounds, 2 s in 2 evaluations, 4 s fixed; 20 rounds and 4 evaluations: 4 + 40 + 4
    assert split_seconds(10.0, Split(2, 4.0, 2, 2.0), 20, 4) == 48.0


@pytest.mark.parametrize(
    ("first", "read"),
    [
        (3.0, 3.0),
        (0, 0.0),
        (4.0, 4.0),
        ("3", 3.0),
        (None, None),
        ("soon", None),
        (-1.0, None),
        (4.5, None),
        ([3], None),
    ],
)
def test_the_first_rounds_seconds_are_read_only_as_a_part_of_the_rounds_seconds(first, read):
    record = {"rounds": 3, "rounds_s": 4.0, "evaluations": 1, "evaluations_s": 0.5, "first_round_s": first}
    assert split_of(record) == Split(3, 4.0, 1, 0.5, read)
    del record["first_round_s"]  # recorded before the first round was kept apart
    assert split_of(record) == Split(3, 4.0, 1, 0.5)


def test_a_full_run_pays_its_quick_runs_first_round_once_and_scales_its_later_rounds():
    # 20 s: 3 rounds in 14 s of which the first (a compile) 10 s, so 2 s per later round; 1 evaluation 2 s; 4 s fixed.
    # 30 rounds and 3 evaluations: 4 + 10 + 29 x 2 + 3 x 2
    assert split_seconds(20.0, Split(3, 14.0, 1, 2.0, 10.0), 30, 3) == 78.0
    # the first round's seconds unknown, or a QUICK run of one round: its rounds scaled whole
    assert split_seconds(20.0, Split(3, 14.0, 1, 2.0), 30, 3) == 4 + 140.0 + 6
    assert split_seconds(20.0, Split(1, 14.0, 1, 2.0, 14.0), 30, 3) == 4 + 420.0 + 6


def test_each_runs_device_is_kept_across_invocations(tmp_path):
    (tmp_path / "devices.json").write_text('{"old": "NVIDIA H100 80GB HBM3 x1"}')
    times = rep.RunTimes(tmp_path, device="NVIDIA H200 x1")
    times.record("new", 0, 3.0, 1.0)
    assert json.loads((tmp_path / "devices.json").read_text()) == {
        "old": "NVIDIA H100 80GB HBM3 x1", "new": "NVIDIA H200 x1"}  # fmt: skip
    (tmp_path / "devices.json").write_text("[]")
    with pytest.raises(ConfigError, match="devices.json: holds a list, not a dict"):
        rep.RunTimes(tmp_path)


ESTIMATED = re.compile(r"\*\*Estimate\*\*.*")


def quick_suite(fake, out: Path, monkeypatch, walls: dict[str, float], timing: dict[str, dict], **kw) -> str:
    """The tiny claim (20 rounds, evaluated every 5; an lr grid of 2 values at 5 rounds for ditto) run QUICK
    (2 rounds, evaluated once) with the runs' wall seconds ``walls`` (1 s for the others) and, in their
    summary.json, the ``timing`` a run of this pfl writes (a run not in it: as an older pfl wrote it)."""
    grid = LrGrid((0.01, 0.3), labels=("ditto",), rounds=5)
    base = [*BASE, "--data.val_frac", "0.2", "--trainer.eval_every", "5"]
    monkeypatch.setattr(rep, "all_claims", lambda: [tiny_claim(base=base, lr_grid=grid)])
    original = FakeRunner.__call__

    def timed(jobs, workers, what="sweep", on_finish=None, fresh=False, pool=None):
        def record(name, code, _, cpu):
            if name in timing:  # the runner has written the run's folder by now
                path = out / name / "summary.json"
                path.write_text(json.dumps({**json.loads(path.read_text()), "timing": timing[name]}))
            on_finish(name, code, walls.get(name, 1.0), cpu)

        return original(fake, jobs, workers, what, record)

    monkeypatch.setattr(rep, "run_parallel", timed)
    return ESTIMATED.search(rep.run_claims(out, quick=True, **kw).read_text()).group()


def test_quick_estimates_each_runs_rounds_and_evaluations_by_their_counts_and_the_rest_once(
    fake, tmp_path, monkeypatch
):
    walls = {"tiny/local/s0": 10.0, "tiny/ditto/s0": 28.0}
    timing = {  # local's first round 3 s (a compile), its second 1 s; 5 s fixed
        "tiny/local/s0": {"rounds": 2, "rounds_s": 4.0, "first_round_s": 3.0, "evaluations": 1, "evaluations_s": 1.0},
        "tiny/ditto/s0": {"rounds": 2, "rounds_s": 18.0, "evaluations": 1, "evaluations_s": 2.0},  # 8 s fixed
    }
    line = quick_suite(fake, tmp_path / "a", monkeypatch, walls, timing, workers=2)
    assert json.loads((tmp_path / "a" / "timing.json").read_text()) == timing
    # a full run: 20 rounds, 4 evaluations. local 5 + 3 + 19 x 1 + 4 x 1 = 31 s; ditto (its first round not
    # recorded apart) 8 + 18 x 10 + 2 x 4 = 196 s; 2 seeds. The grid: ditto at 2 lrs, 5 rounds, 1 evaluation:
    # 2 x (8 + 18 x 5/2 + 2) = 110 s. 564 s in all.
    assert line == (
        f"**Estimate**, not a measurement, of the full suite on {device_label()}: 6 runs, 9.4 run-minutes, "
        "about 4.7 min with 2 worker(s) (each QUICK run's first round kept once, its later rounds scaled by the "
        "full run's, its evaluations by its evaluations, the rest of its wall time (start-up, data, model, "
        "outputs) kept once per run; the lr grids included, their edge steps not)."
    )
    # ditto recorded as an older pfl did: its whole wall time scaled by rounds past the 10 s start-up (the
    # shortest QUICK run), 2 x (10 + 18 x 10) + 2 x (10 + 18 x 5/2) = 490 s; local as above, 2 x 31 s
    line = quick_suite(fake, tmp_path / "b", monkeypatch, walls, {"tiny/local/s0": timing["tiny/local/s0"]}, workers=2)
    assert "6 runs, 9.2 run-minutes" in line  # 552 s
    assert "(each QUICK run's first round kept once" in line
    assert "per run; 1 QUICK run(s) recorded without the time of their rounds (an older pfl): wall time " in line


def test_quick_runs_recorded_without_their_rounds_time_are_scaled_whole_by_rounds(fake, tmp_path, monkeypatch):
    line = quick_suite(fake, tmp_path, monkeypatch, {"tiny/local/s0": 10.0, "tiny/ditto/s0": 28.0}, {}, workers=2)
    # start-up 10 s (the shortest QUICK run); per seed local 10 s, ditto 10 + 18 x 20/2 = 190 s; 2 seeds;
    # the grid: ditto at 2 lrs x 5 rounds: 2 x (10 + 18 x 5/2) = 110 s. 6 runs, 510 s = 8.5 run-minutes.
    assert line == (
        f"**Estimate**, not a measurement, of the full suite on {device_label()}: 6 runs, 8.5 run-minutes, "
        "about 4.2 min with 2 worker(s) (2 QUICK run(s) recorded without the time of their rounds (an older "
        "pfl): wall time scaled by rounds, 10 s of start-up per run kept as is; the lr grids included, their "
        "edge steps not)."
    )
    assert json.loads((tmp_path / "timing.json").read_text()) == {"tiny/local/s0": None, "tiny/ditto/s0": None}
    assert "**Estimate**" not in rep.run_claims(tmp_path / "full", workers=2).read_text()  # only QUICK estimates
    one = rep.run_claims(tmp_path / "one", quick=True, workers=1).read_text()
    assert "8.5 run-minutes, about 8.5 min with 1 worker(s)" in one  # 510 s / 60 s / 1 worker


def test_the_suite_runs_in_warm_workers_unless_fresh_processes_are_asked_for(fake, tmp_path):
    rep.run_claims(tmp_path / "warm", quick=True, workers=2)
    assert fake.fresh and not any(fake.fresh)
    fake.fresh.clear()
    rep.run_claims(tmp_path / "fresh", quick=True, workers=2, fresh=True)
    assert fake.fresh and all(fake.fresh)


def test_the_suite_runs_one_worker_per_core_by_default(monkeypatch):
    monkeypatch.setattr(options.os, "cpu_count", lambda: 16)
    assert options.default_workers() == 16
    monkeypatch.setattr(options.os, "cpu_count", lambda: None)
    assert options.default_workers() == 1


def test_a_later_invocation_keeps_the_earlier_records_and_adds_its_own_line(tmp_path):
    (tmp_path / "seconds.json").write_text('{"old": 60.0}')
    (tmp_path / "cpu_seconds.json").write_text('{"old": 30.0}')
    earlier = {"started": "2026-01-01 10:00", "workers": 1, "runs": 4, "wall_s": 90.0}
    (tmp_path / "invocations.json").write_text(json.dumps([earlier]))
    times = rep.RunTimes(tmp_path)
    assert times.invocations() == [earlier]  # none finished yet: no line of its own
    times.t0 -= 12.31  # this invocation has run for 12.31 s when its first run ends
    times.record("new", 0, 2.0, 1.0)
    assert json.loads((tmp_path / "seconds.json").read_text()) == {"new": 2.0, "old": 60.0}
    ledger = json.loads((tmp_path / "invocations.json").read_text())
    assert ledger[0] == earlier and ledger[1]["runs"] == 1 and ledger[1]["workers"] == 1
    assert ledger[1]["wall_s"] == 12.3  # up to its last finished run, to a tenth of a second
    grid = [rep.Job("k", "l", 0, [], tmp_path, "old")]
    assert times.of([rep.Job("k", "l", 0, [], tmp_path, "new")], grid) == rep.ClaimTime(2, 62.0, 31.0, 0, 1)


LINE = '{"started": "2026-11-29 10:00", "workers": 1, "runs": 3, "wall_s": 9.5}'  # an invocation's line


def _lines(**changes) -> str:
    """invocations.json holding ``LINE`` with ``changes``."""
    return json.dumps([{**json.loads(LINE), **changes}])


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("seconds.json", "{", "not a time record of the suite"),
        ("cpu_seconds.json", "[]", "holds a list, not a dict"),
        ("invocations.json", "{}", "holds a dict, not a list"),
        ("timing.json", "[]", "holds a list, not a dict"),
        ("seconds.json", b"\xff", "not a time record of the suite"),
        # each value read as the report reads it: a run's seconds, a device's name, an invocation's line
        ("seconds.json", '{"k/a/s0": 1.5, "k/b/s0": "x"}', "k/b/s0: 'x' is not seconds"),
        ("seconds.json", '{"a": true}', "a: True is not seconds"),
        ("cpu_seconds.json", '{"a": -1}', "a: -1 is not seconds"),
        ("cpu_seconds.json", '{"a": NaN}', "a: nan is not seconds"),
        ("devices.json", '{"a": "cpu", "b": ["cpu"]}', r"b: \['cpu'\] is not a device's name"),
        ("invocations.json", '["x"]', "entry 0: 'x' is not {started, workers, runs, wall_s}"),
        ("invocations.json", f"[{LINE}, {{}}]", "entry 1: {} is not"),
        ("invocations.json", _lines(workers=0), "entry 0: .*'workers': 0"),
        ("invocations.json", _lines(runs=True), "entry 0: .*'runs': True"),
        ("invocations.json", _lines(runs=0), "entry 0: .*'runs': 0"),  # a line is written after a run
        ("invocations.json", _lines(wall_s="9"), "entry 0: .*'wall_s': '9'"),
        ("invocations.json", _lines(started=None), "entry 0: .*'started': None"),
    ],
)
def test_a_broken_time_record_is_refused_by_name_and_left_as_it_was(tmp_path, name, text, problem):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=f"{re.escape(str(path))}: {problem}.*remove or restore it"):
        rep.RunTimes(tmp_path)
    assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())


def test_time_records_as_the_suite_writes_them_are_read_back(tmp_path):
    for name, text in [("seconds.json", '{"a": 0, "b": 2.5}'), ("cpu_seconds.json", '{"a": 1}'),
                       ("devices.json", '{"a": "cpu"}'), ("invocations.json", f"[{LINE}]")]:  # fmt: skip
        (tmp_path / name).write_text(text)
    times = rep.RunTimes(tmp_path)
    assert times.wall == {"a": 0, "b": 2.5} and times.cpu == {"a": 1} and times.devices == {"a": "cpu"}
    assert times.earlier == [json.loads(LINE)]


@pytest.mark.parametrize(
    ("name", "text"), [("seconds.json", "{"), ("invocations.json", "{}"), ("devices.json", '{"a": 1}')]
)
def test_a_broken_time_record_is_refused_before_any_run(fake, tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=f"{name}: .*remove or restore it"):
        rep.run_claims(tmp_path)
    assert fake.calls == [] and not (tmp_path / "tiny").exists() and (tmp_path / name).read_text() == text


@pytest.mark.parametrize(
    ("file", "text", "problem"),
    [
        ("ditto/s0/summary.json", "{", r"not a run's summary \(Expecting"),
        ("ditto/s0/summary.json", b"\xff", r"not a run's summary \('utf-8'"),
        ("ditto/s0/summary.json", "[]", r"not a run's summary \(a JSON object with its metrics\)"),
        ("local/s1/summary.json", '{"metrics": 0.5}', "not a run's summary"),
        (f"{rep.LR_DIR}/ditto/lr0.1/summary.json", '{"rounds": 3}', "not a run's summary"),  # a grid run's
        ("ditto/s0/config.yaml", "method: [fedavg", r"not a run's configuration \(while parsing"),
        ("ditto/s0/config.yaml", "- fedavg", r"not a run's configuration \(a mapping of its settings\)"),
        ("local/s1/clients.csv", None, "missing: every run writes its table of clients"),  # gain over local reads it
        ("ditto/s0/clients.csv", "pm.l_acc\n0.5\n", r"not a run's table of clients \(a client column of client"),
        (f"{rep.LR_DIR}/ditto/lr0.1/clients.csv", b"\xff", r"not a run's table of clients \('utf-8'"),
    ],
)
def test_a_reused_run_folder_that_a_run_did_not_write_is_refused_before_any_run(fake, tmp_path, file, text, problem):
    for folder in ("ditto/s0", "local/s1", f"{rep.LR_DIR}/ditto/lr0.1"):  # results the report would read
        (tmp_path / "tiny" / folder).mkdir(parents=True)
        (tmp_path / "tiny" / folder / "summary.json").write_text('{"metrics": {"pm.l_acc.mean": 0.5}}')
        (tmp_path / "tiny" / folder / "config.yaml").write_text("method:\n  name: fedavg\n")
        (tmp_path / "tiny" / folder / "clients.csv").write_text("client,pm.l_acc\n0,0.5\n")
    path = tmp_path / "tiny" / file
    data = None if text is None else text if isinstance(text, bytes) else text.encode()
    if data is None:
        path.unlink()
    else:
        path.write_bytes(data)
    with pytest.raises(ConfigError, match=f"{re.escape(str(path))}: {problem}.*remove the run's folder") as err:
        rep.run_claims(tmp_path, reuse=True)
    assert "\n" not in str(err.value)  # one line, a YAML error's too
    assert fake.calls == [] and (path.read_bytes() == data if data is not None else not path.exists())


def test_a_claims_time_says_its_runs_grid_runs_and_unrecorded_ones():
    assert rep.ClaimTime(4, 600.0, 450.0, 0) == rep.ClaimTime(4, 600.0, 450.0, 0, grid=0)  # no grid runs
    assert rep.ClaimTime(4, 600.0, 450.0, 0).count() == "4"
    assert rep.ClaimTime(6, 600.0, 450.0, 0, grid=2).count() == "6 (2 lr grid)"
    assert rep.ClaimTime(4, 600.0, 450.0, 0).text() == "4 runs, 7.5 CPU-minutes, 10.0 run-minutes"
    assert rep.ClaimTime(4, 600.0, 450.0, 3).text() == (
        "4 runs, 7.5 CPU-minutes, 10.0 run-minutes; 3 without a recorded CPU time"
    )
    assert rep.ClaimTime(6, 600.0, 450.0, 0, grid=2, diverged=3).count() == "6 (2 lr grid) + 3 diverged"
    assert (
        rep.ClaimTime(4, 600.0, 450.0, 0, diverged=1).text() == "4 + 1 diverged runs, 7.5 CPU-minutes, 10.0 run-minutes"
    )


def test_the_suites_time_lines_add_up_the_claims_and_the_invocations():
    claims = {"a": rep.ClaimTime(3, 600.0, 240.0, 1), "b": rep.ClaimTime(2, 300.0, 120.0, 1)}
    one = [{"started": "2026-01-01 10:00", "workers": 2, "runs": 5, "wall_s": 300.0}]
    timing = rep.SuiteTime(600.0, 2, 4, 1, claims, one)
    assert timing.lines() == [
        "Measured wall time of this invocation: 10.0 min with 2 worker(s); it ran 4 run(s) and reused 1.",
        "Recorded time of the report's 5 runs: 6.0 CPU-minutes, about 3.0 min of wall time with 2 worker(s) on an "
        "otherwise idle machine (15.0 run-minutes of wall time as measured, which grows with other load on the "
        "machine); 2 reused run(s) have no recorded CPU time and are not in those sums.",
    ]
    two = [*one, {"started": "2026-01-02 09:30", "workers": 1, "runs": 2, "wall_s": 66.0}]
    assert rep.SuiteTime(600.0, 2, 4, 1, claims, two).invocation_lines() == [
        "The runs were made by 2 invocations (2026-01-01 10:00, 5.0 min, 5 run(s), 2 worker(s); 2026-01-02 09:30, "
        "1.1 min, 2 run(s), 1 worker(s); each up to its last finished run): 6.1 min of measured wall time in all."
    ]
    assert rep.SuiteTime(600.0, 2, 4, 1, claims, two).lines()[-1].startswith("The runs were made by 2 invocations")


def test_the_header_lists_every_claim_with_its_verdict_and_recorded_time():
    claims = [tiny_claim(key="a"), tiny_claim(key="b"), tiny_claim(key="c")]
    times = {"a": rep.ClaimTime(4, 600.0, 450.0, 1), "b": rep.ClaimTime(6, 60.0, 30.0, 0, grid=2)}
    header = rep._header(claims, {"a": "tie", "b": "held"}, False, rep.SuiteTime(60.0, 1, 10, 0, times))
    assert header[:3] == ["# Reproduction report", "", header[2]]
    assert header[2].endswith(f" on {device_label()}, embedded data; full: every claim over its seeds.")
    assert header[-5:] == [
        "|---|---|---|---|---|",
        "| a | tie | 4 | 7.5 (1 runs unrecorded) | 10.0 |",
        "| b | held | 6 (2 lr grid) | 0.5 | 1.0 |",
        "| c | not run | 0 | 0.0 | 0.0 |",
        "",
    ]
    assert any(line.startswith("Verdicts (docs/reproduce.md): per seed, the paired difference") for line in header)


# --- the report's pieces --------------------------------------------------------------------------------


def test_the_contrast_table_has_a_column_per_seed_and_a_dash_where_a_seed_has_no_difference():
    contrasts = [Contrast("a - b (m)", {0: 0.1, 2: 0.3}, margin=0.05, note="paper: +0.2"), Contrast("c", {1: -0.2})]
    assert rep.contrast_table(contrasts, [0, 1, 2]) == [
        "| contrast | s0 | s1 | s2 | mean | std | margin | verdict |",
        "|---|---|---|---|---|---|---|---|",
        "| a - b (m) (paper: +0.2) | +0.1000 | - | +0.3000 | +0.2000 | 0.1414 | +0.0500 | held |",
        "| c | - | -0.2000 | - | -0.2000 | 0.0000 | +0.0000 | not held (indicative, 1 seed) |",
    ]
    assert (
        rep.contrast_table([Contrast("d", {})], [0])[-1]
        == "| d | - | +nan | 0.0000 | +0.0000 | tie (indicative, 1 seed) |"
    )
    assert rep.contrast_table([], [0, 1]) == ["No contrast could be computed."]


def test_the_report_names_the_platform_of_its_runs_and_each_with_its_count_where_they_differ(tmp_path):
    amd = {"torch": "2.14.1", "cpu": "AMD EPYC", "cpu_kernels": "AVX2", "threads": 1}
    intel = {**amd, "cpu": "Intel Xeon", "cpu_kernels": "AVX512"}
    folders = []
    for i, platform in enumerate([amd, intel, amd, None]):
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        summary = {"metrics": {}} if platform is None else {"metrics": {}, "platform": platform}
        (folder / "summary.json").write_text(json.dumps(summary))
        folders.append(folder)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("[1, 2]")  # not a summary: read as unrecorded
    assert rep.platform_lines(folders[:1] + folders[2:3]) == [
        "Numbers computed on torch 2.14.1, AMD EPYC (AVX2 kernels, 1 thread)."
    ]
    (line,) = rep.platform_lines([*folders, tmp_path / "broken"])
    assert line.startswith(
        "Numbers computed on 3 platforms (torch 2.14.1, AMD EPYC (AVX2 kernels, 1 thread): 2 run(s); "
        "a platform not recorded (runs of an older pfl): 2 run(s); "
        "torch 2.14.1, Intel Xeon (AVX512 kernels, 1 thread): 1 run(s)). The same run can give other numbers"
    )
    assert rep.platform_lines([]) == []


def test_a_result_counts_when_reused_or_written_since_the_suite_started(tmp_path):
    job = rep.Job("c", "l", 0, [], tmp_path, "c/l/s0")
    assert rep._finished_jobs([job], 0.0, set()) == []
    (tmp_path / "summary.json").write_text("{}")
    os.utime(tmp_path / "summary.json", (100.0, 100.0))
    assert rep._finished_jobs([job], 200.0, set()) == [job]  # reused
    assert rep._finished_jobs([job], 200.0, {"c/l/s0"}) == []  # run now, and an earlier suite's result
    assert rep._finished_jobs([job], 100.0, {"c/l/s0"}) == [job] and rep._finished_jobs([job], 50.0, {"c/l/s0"}) == [
        job
    ]


def test_gain_over_local_is_computed_client_by_client(tmp_path, monkeypatch):
    runs = {}
    for label, accs in {"local": [0.5, 0.8, 1.0], "m": [0.75, 0.8, 0.9]}.items():
        (tmp_path / label).mkdir()
        rows = "\n".join(f"{i},{a}" for i, a in enumerate(accs))
        (tmp_path / label / "clients.csv").write_text("client,pm.l_acc\n" + rows + "\n")
        runs[label] = {"metrics": {"kept": 1}, "run_dir": str(tmp_path / label)}
    rep.add_gain_over_local(runs)
    m = runs["m"]["metrics"]
    assert set(m) == {"kept", "gain.mean", "gain.std", "r_acc.mean", "ptr"}
    assert abs(m["gain.mean"] - (0.25 + 0.0 - 0.1) / 3) < 1e-12
    assert abs(m["gain.std"] - math.sqrt(((0.25 - 0.05) ** 2 + 0.05**2 + 0.15**2) / 3)) < 1e-12
    assert abs(m["ptr"] - 2 / 3) < 1e-12  # the tie at 0.8 passes
    assert abs(m["r_acc.mean"] - (0.5 + 0.0 - 0.1) / 3) < 1e-12
    assert runs["local"]["metrics"]["gain.mean"] == 0 and runs["local"]["metrics"]["ptr"] == 1


@pytest.fixture
def figures(monkeypatch) -> list:
    import pfl.metrics.plots as plots

    drawn: list = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi=None: drawn.append((fig, path, dpi)))
    return drawn


def test_seed_plot_shows_the_spread_over_seeds_and_every_seed(tmp_path, figures):
    s = {
        0: {"a": {"metrics": {"m": 0.95}}, "b": {"metrics": {"m": 0.6}}, "c": {"metrics": {}}},
        1: {"a": {"metrics": {"m": 1.0}}, "b": {"metrics": {"m": 0.5}}},
    }
    assert rep.seed_plot(s, "m", tmp_path / "c.png", "b", "Paper: c (held)") == tmp_path / "c.png"
    [(fig, path, dpi)] = figures
    assert path == tmp_path / "c.png" and dpi == 120
    (ax,) = fig.axes
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert [b.get_height() for b in bars] == pytest.approx([0.975, 0.55])  # "c" measured nothing: no bar
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    (low, high) = ax.get_ylim()
    assert high == pytest.approx(0.975 + 0.0353553 + 0.02) and low == pytest.approx(0.55 - 0.0707107 - 0.05)
    dots = [line for line in ax.lines if line.get_marker() == "."]
    assert sorted(y for d in dots for y in d.get_ydata()) == [0.5, 0.6, 0.95, 1.0]
    assert ax.get_title() == "Paper: c (held)" and ax.get_xlabel() == "run"
    assert ax.get_ylabel() == "m (± std over seeds; dots: seeds)"
    from matplotlib.colors import to_rgba

    assert [b.get_facecolor() for b in bars] == [to_rgba("tab:blue", 0.8), to_rgba("tab:orange", 0.8)]


def test_seed_plot_of_one_seed_has_no_spread_and_its_axis_starts_at_zero_at_the_lowest(tmp_path, figures):
    rep.seed_plot({3: {"a": {"metrics": {"m": 0.01}}, "b": {"metrics": {"m": 0.5}}}}, "m", tmp_path / "p.png")
    (ax,) = figures[0][0].axes
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert [b.get_height() for b in bars] == pytest.approx([0.01, 0.5])
    assert ax.get_ylim() == pytest.approx((0.0, 0.52)) and ax.get_title() == ""
    assert len({tuple(b.get_facecolor()) for b in bars}) == 1  # no winner named: no bar stands out


def test_seed_plot_widens_with_its_runs_so_their_names_fit(tmp_path, figures):
    many = {0: {f"run{i}": {"metrics": {"m": 0.5}} for i in range(10)}}
    rep.seed_plot(many, "m", tmp_path / "many.png")
    rep.seed_plot({0: {"a": {"metrics": {"m": 0.5}}, "b": {"metrics": {"m": 0.6}}}}, "m", tmp_path / "two.png")
    assert [tuple(fig.get_size_inches())[0] for fig, _, _ in figures] == pytest.approx([6.0, 5.0])


def test_seed_plot_of_a_metric_no_run_measured_is_an_empty_axis_from_0_to_1(tmp_path, figures):
    rep.seed_plot({0: {"a": {"metrics": {"other": 0.5}}}}, "m", tmp_path / "e.png")
    (ax,) = figures[0][0].axes
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert len(bars) == 0 and ax.get_ylim() == pytest.approx((0.0, 1.02))


# --- the command ----------------------------------------------------------------------------------------


def test_the_command_passes_its_options_to_the_suite_and_prints_the_reports_path(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(rep, "run_claims", lambda *a, runs: calls.append((*a, runs)) or Path("out/REPORT.md"))
    monkeypatch.setattr(options, "all_claims", lambda: [tiny_claim(key="a"), tiny_claim(key="b")])
    monkeypatch.setattr(options.os, "cpu_count", lambda: 2)
    rep.main([])
    assert calls[-1] == (Path("reproduce"), None, False, 2, False, "auto", False, False, None)
    rep.main(["--out", "x", "--only", "a", "b", "--quick", "--workers", "3", "--reuse", "--accelerator", "cpu"])
    assert calls[-1] == (Path("x"), ["a", "b"], True, 3, True, "cpu", False, False, None)
    assert capsys.readouterr().out == "out/REPORT.md\nout/REPORT.md\n"
    rep.main(["--fresh-processes"])
    assert calls[-1][-3:] == (True, False, None)
    rep.main(["--keep-checkpoints", "--runs", "ditto", "local"])
    assert calls[-1][-3:] == (False, True, ["ditto", "local"])
    with pytest.raises(ConfigError, match=r"^reproduce: argument --accelerator: invalid choice: 'tpu'.*\(usage: "):
        rep.main(["--accelerator", "tpu"])  # one line, as every bad input of the command line
    for argv, field in (
        (["--only", "a", "c"], "--only"),
        (["--workers", "0"], "--workers"),
        (["--runs", "x"], "--runs"),
    ):
        with pytest.raises(ConfigError) as err:
            rep.main(argv)  # refused by the parse, before the suite is asked for anything
        assert err.value.field == field
    assert len(calls) == 4


def test_the_commands_help_names_every_claim(monkeypatch, capsys):
    monkeypatch.setattr(options, "all_claims", lambda: [tiny_claim(key="one"), tiny_claim(key="two")])
    with pytest.raises(SystemExit):
        rep.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "python -m pfl reproduce" in text and "claims to run: one, two" in text
    assert "first seed, 1/10 of the rounds, no lr grid (a smoke test)" in text


def test_a_time_record_is_written_whole_with_sorted_keys(tmp_path):
    rep._write_json(tmp_path / "t.json", {"b": 1, "a": [2]})
    assert (tmp_path / "t.json").read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}\n'
    assert rep._read_json(tmp_path / "t.json", {}) == {"a": [2], "b": 1}
    assert rep._read_json(tmp_path / "absent.json", []) == []


def test_every_run_trains_on_the_accelerator_asked_for_and_records_it(fake, tmp_path, monkeypatch):
    monkeypatch.setattr("pfl.runner.suite_estimate.torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("pfl.runner.suite_estimate.torch.cuda.get_device_name", lambda i: {0: "Card"}[i])
    monkeypatch.setattr("pfl.runner.suite_estimate.torch.cuda.device_count", lambda: 1)
    report = rep.run_claims(tmp_path / "cpu", accelerator="cpu").read_text()
    assert all(flag(argv, "--trainer.accelerator") == "cpu" for argv in fake.argv.values()) and len(fake.argv) == 4
    assert f"on CPU, {os.cpu_count()} cores, embedded data" in report
    devices = json.loads((tmp_path / "cpu" / "devices.json").read_text())
    assert set(devices.values()) == {f"CPU, {os.cpu_count()} cores"}
    report = rep.run_claims(tmp_path / "auto").read_text()
    assert all(flag(argv, "--trainer.accelerator") == "auto" for argv in fake.argv.values())
    assert "on Card x1, embedded data" in report


def test_the_report_replaces_its_file_whole_and_never_writes_through_it(fake, tmp_path):
    elsewhere = tmp_path / "kept.md"
    elsewhere.write_text("someone else's file\n")
    (tmp_path / "out").mkdir()
    os.link(elsewhere, tmp_path / "out" / "REPORT.md")  # a second name of that file
    report = rep.run_claims(tmp_path / "out")
    assert report.read_text().startswith("# Reproduction report")
    assert elsewhere.read_text() == "someone else's file\n"
