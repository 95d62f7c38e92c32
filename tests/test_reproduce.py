"""The reproduction suite writes a report with a table, a plot and a verdict per claim."""

from __future__ import annotations

from pathlib import Path

import pfl.reproduce as rep

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--data.num_clients", "4", "--trainer.rounds", "3", "--model.hidden", "[16]", "--tracking.wandb", "false"]


def test_report_has_table_plot_and_verdict(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    claim = rep.Claim(
        key="tiny",
        paper="test",
        statement="ditto personalizes better than local after 3 rounds",
        base=TINY,
        runs={"local": ["--method.name", "local"], "ditto": ["--method.name", "ditto", "--method.lam", "0.1"]},
        check=rep._best_by("pm.l_acc.mean", "ditto"),
    )
    absent = rep.Claim(
        "absent", "test", "needs a method that does not exist", TINY, {"x": ["--method.name", "nope"]}, claim.check
    )
    monkeypatch.setattr(rep, "CLAIMS", [claim, absent])
    report = rep.run_claims(tmp_path).read_text()
    assert "| local |" in report and "| ditto |" in report
    assert "**Held: yes**" in report or "**Held: no**" in report
    assert (tmp_path / "tiny.png").exists() and (tmp_path / "tiny" / "ditto" / "summary.json").exists()
    assert "Not run: methods not available yet: nope" in report


def test_best_by_names_the_winner():
    summaries = {"a": {"metrics": {"m": 0.5}}, "b": {"metrics": {"m": 0.7}}}
    assert rep._best_by("m", "b")(summaries)[0] is True
    assert rep._best_by("m", "a")(summaries)[0] is False
