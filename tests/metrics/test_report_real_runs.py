"""`python -m pfl report` on runs `fit` made: one row each, the numbers of their summaries."""

from __future__ import annotations

import json

from pfl.cli import main

TINY = [
    "--data.num_clients", "4", "--trainer.rounds", "1", "--model.hidden", "[8]",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def test_report_on_two_real_runs_prints_both_rows(tmp_path, capsys):
    for name, method in (("a", "fedavg"), ("b", "local")):
        args = ["--tracking.root", str(tmp_path), "--tracking.name", name, "--method", method]
        assert main(["fit", *TINY, *args]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4  # header, rule, two rows: nothing but the method differs
    assert lines[2].startswith("| a | fedavg | 1 |") and lines[3].startswith("| b | local | 1 |")
    assert "pm.l_acc" in lines[0] and "gm.acc" in lines[0]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())["metrics"]
    assert f"{summary['pm.l_acc.mean']:.4f} ({summary['pm.l_acc.std']:.4f})" in lines[2]
    assert main(["report", str(tmp_path / "a"), "--format", "latex", "--digits", "2"]) == 0
    assert f"{summary['pm.l_acc.mean']:.2f} ({summary['pm.l_acc.std']:.2f})" in capsys.readouterr().out
