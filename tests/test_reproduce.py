"""The reproduction suite writes a report with a table, a plot and a verdict per claim."""

from __future__ import annotations

from pathlib import Path

import pytest

import pfl.runner.reproduce as rep
from pfl.errors import ConfigError
from pfl.runner.claims import Claim, Contrast, above, beats, claim_verdict, paired, verdict, verdict_text

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--data.num_clients", "4", "--trainer.rounds", "3", "--model.hidden", "[16]", "--tracking.wandb", "false"]


def test_report_has_table_plot_and_verdict(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    claim = Claim(
        key="tiny",
        paper="test",
        statement="ditto personalizes better than local after 3 rounds",
        base=TINY,
        runs={"local": ["--method.name", "local"], "ditto": ["--method.name", "ditto", "--method.lam", "0.1"]},
        check=best_by("pm.l_acc.mean", "ditto"),
    )
    absent = Claim(
        "absent", "test", "needs a method that does not exist", TINY, {"x": ["--method.name", "nope"]}, claim.check
    )
    monkeypatch.setattr(rep, "all_claims", lambda: [claim, absent])
    report = rep.run_claims(tmp_path).read_text()
    assert "| local |" in report and "| ditto |" in report
    assert "**Held: yes**" in report or "**Held: no**" in report
    assert (tmp_path / "tiny.png").exists() and (tmp_path / "tiny" / "ditto" / "summary.json").exists()
    assert "Not run: methods not available yet: nope" in report
    assert "against the suite's own `local` run" in report
    ditto_mtime = (tmp_path / "tiny" / "ditto" / "summary.json").stat().st_mtime
    rep.run_claims(tmp_path, reuse=True)  # finished runs are kept, not re-run
    assert (tmp_path / "tiny" / "ditto" / "summary.json").stat().st_mtime == ditto_mtime


def test_a_failed_run_is_named_and_the_rest_of_the_claim_still_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    runs = {"local": ["--method.name", "local"], "blowup": ["--method.name", "fedavg", "--client.lr", "1e30"]}
    claim = Claim("tiny", "test", "local beats a diverging run", TINY, runs, best_by("pm.l_acc.mean", "local"))
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    with pytest.raises(ConfigError, match="blowup: .*training diverged"):
        rep.run_claims(tmp_path)
    report = (tmp_path / "REPORT.md").read_text()
    assert "Failed (left out of the table and the check): blowup." in report
    assert "| local |" in report and "| blowup |" not in report and "**Held: yes**" in report


def test_best_by_names_the_winner():
    summaries = {"a": {"metrics": {"m": 0.5}}, "b": {"metrics": {"m": 0.7}}}
    assert best_by("m", "b")(summaries)[0] is True
    assert best_by("m", "a")(summaries)[0] is False


def test_gain_over_local_is_computed_client_by_client(tmp_path):
    for label, accs in {"local": [0.5, 0.8, 1.0], "m": [0.75, 0.8, 0.9]}.items():
        (tmp_path / label).mkdir()
        rows = "\n".join(f"{i},{a}" for i, a in enumerate(accs))
        (tmp_path / label / "clients.csv").write_text("client,pm.l_acc\n" + rows + "\n")
    summaries = {"local": {"metrics": {}}, "m": {"metrics": {}}}
    rep.add_gain_over_local(summaries, tmp_path)
    m = summaries["m"]["metrics"]
    assert abs(m["gain.mean"] - (0.25 + 0.0 - 0.1) / 3) < 1e-12
    assert abs(m["ptr"] - 2 / 3) < 1e-12  # the tie at 0.8 passes
    assert abs(m["r_acc.mean"] - (0.5 + 0.0 - 0.1) / 3) < 1e-12
    assert summaries["local"]["metrics"]["gain.mean"] == 0 and summaries["local"]["metrics"]["ptr"] == 1


def test_every_claim_names_only_configurations_that_parse(monkeypatch):
    monkeypatch.chdir(ROOT)
    from pfl.runner.args import parse_fit_args
    from pfl.runner.claims import all_claims

    for claim in all_claims():
        for args in claim.runs.values():
            parse_fit_args([*claim.base, *args])


def test_claim_bar_chart_shows_every_error_bar_and_names_the_verdict(tmp_path, monkeypatch):
    import pfl.metrics.plots as plots
    from pfl.runner import reproduce

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi=None: figures.append(fig))
    summaries = {
        "a": {"metrics": {"pm.l_acc.mean": 0.95, "pm.l_acc.std": 0.1}},  # mean + std passes 1.0
        "b": {"metrics": {"pm.l_acc.mean": 0.6, "pm.l_acc.std": 0.05}},
    }
    reproduce._bar_plot(summaries, "pm.l_acc.mean", tmp_path / "c.png", "a", "Paper: c (held: yes)")
    (ax,) = figures[0].axes
    assert ax.get_ylim()[1] >= 1.05 and ax.get_ylim()[0] <= 0.55
    assert ax.get_title() == "Paper: c (held: yes)" and ax.get_xlabel() == "run"


def test_runs_that_differ_only_outside_the_summary_get_a_row_each(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    runs = {"plain": ["--method.name", "fedavg"], "decay": ["--method.name", "fedavg", "--client.weight_decay", "0.01"]}
    claim = Claim("tiny", "test", "two fedavg runs", TINY, runs, best_by("pm.l_acc.mean", "plain"))
    monkeypatch.setattr(rep, "all_claims", lambda: [claim])
    report = rep.run_claims(tmp_path).read_text()
    assert "| plain |" in report and "| decay |" in report and "+1" not in report


# -- verdicts -------------------------------------------------------------------------------------
def test_verdict_held_when_every_seed_favours_the_claim_beyond_the_spread():
    assert verdict(Contrast("a - b", {0: 0.05, 1: 0.04, 2: 0.06})) == "held"


def test_verdict_tie_when_the_mean_is_within_the_seed_spread():
    assert verdict(Contrast("a - b", {0: 0.05, 1: -0.04, 2: 0.02})) == "tie"
    # positive mean beyond the spread but one seed against the claim: not held, not a win either
    assert verdict(Contrast("a - b", {0: 0.30, 1: 0.30, 2: 0.30, 3: -0.01})) == "tie"


def test_verdict_not_held_when_the_mean_is_against_the_claim_beyond_the_spread():
    assert verdict(Contrast("a - b", {0: -0.05, 1: -0.04, 2: -0.06})) == "not held"
    assert verdict(Contrast("a - b", {0: -0.30, 1: -0.30, 2: 0.01})) == "not held"


def test_verdict_measures_the_difference_beyond_the_margin():
    diffs = {0: 0.05, 1: 0.04, 2: 0.06}
    assert verdict(Contrast("a - b", diffs, margin=0.0)) == "held"
    assert verdict(Contrast("a - b", diffs, margin=0.05)) == "tie"
    assert verdict(Contrast("a - b", diffs, margin=0.2)) == "not held"
    assert verdict(Contrast("a - b", {0: -0.01, 1: -0.015, 2: -0.012}, margin=-0.02)) == "held"  # may drop 2 points


def test_one_seed_decides_by_sign_and_is_marked_indicative():
    assert verdict(Contrast("a - b", {0: 0.01})) == "held"
    assert verdict(Contrast("a - b", {0: -0.01})) == "not held"
    assert verdict(Contrast("a - b", {0: 0.0})) == "tie"
    assert verdict_text(Contrast("a - b", {0: 0.01})) == "held (indicative, 1 seed)"
    assert verdict_text(Contrast("a - b", {0: 0.01, 1: 0.02})) == "held"


def test_verdict_of_no_or_non_finite_differences_is_a_tie():
    assert verdict(Contrast("a - b", {})) == "tie"
    assert verdict(Contrast("a - b", {0: float("nan"), 1: 0.3, 2: 0.3})) == "tie"


def test_claim_verdict_needs_every_contrast_held_and_any_not_held_fails_it():
    held = Contrast("h", {0: 0.1, 1: 0.1})
    tie = Contrast("t", {0: 0.1, 1: -0.1})
    lost = Contrast("n", {0: -0.1, 1: -0.1})
    assert claim_verdict([held, held]) == "held"
    assert claim_verdict([held, tie]) == "tie"
    assert claim_verdict([held, tie, lost]) == "not held"
    assert claim_verdict([]) == "tie"


def test_paired_and_above_give_per_seed_differences_of_the_runs_present():
    s = {
        0: {"a": {"metrics": {"m.mean": 0.8}}, "b": {"metrics": {"m.mean": 0.5}}},
        1: {"a": {"metrics": {"m.mean": 0.6}}},  # b failed on seed 1: no pair
    }
    assert paired(s, "a", "b", "m") == {0: pytest.approx(0.3)}
    assert above(s, "a", "m", 0.5) == {0: pytest.approx(0.3), 1: pytest.approx(0.1)}
    (c,) = beats("a", ["b"], "m", margin=0.1)(s)
    assert c.diffs == {0: pytest.approx(0.3)} and c.margin == 0.1 and "a - b" in c.name
