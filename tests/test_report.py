"""`python -m pfl report`: one row per run, mean (std) cells, the best of each column marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.metrics.report import report

TINY = [
    "--data.num_clients", "4", "--trainer.rounds", "1", "--model.hidden", "[8]",
    "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def write_run(root: Path, name: str, method: str, metrics: dict, select: str = "final") -> Path:
    run = root / name
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"method": method, "select": select, "metrics": metrics}))
    return run


def test_report_on_two_real_runs_prints_both_rows(tmp_path, capsys):
    for name, method in (("a", "fedavg"), ("b", "local")):
        args = ["--tracking.root", str(tmp_path), "--tracking.name", name, "--method", method]
        assert main(["fit", *TINY, *args]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4  # header, rule, two rows
    assert lines[2].startswith("| a | fedavg |") and lines[3].startswith("| b | local |")
    assert "pm.l_acc" in lines[0] and "gm.acc" in lines[0]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())["metrics"]
    assert f"{summary['pm.l_acc.mean']:.4f} ({summary['pm.l_acc.std']:.4f})" in lines[2]


def test_best_per_column_is_marked_in_markdown_and_csv(tmp_path):
    a = write_run(tmp_path, "a", "fedavg", {"pm.l_acc.mean": 0.8, "pm.l_acc.std": 0.1, "comm.up_bytes.total": 200.0})
    b = write_run(tmp_path, "b", "ditto", {"pm.l_acc.mean": 0.7, "pm.l_acc.std": 0.05, "comm.up_bytes.total": 100.0})
    md = report([a, b], ["pm.l_acc", "comm.up_bytes.total", "ptr"]).splitlines()
    assert md[0] == "| run | method | pm.l_acc | comm.up_bytes.total | ptr |"
    assert md[2] == "| a | fedavg | **0.8000 (0.1000)** | 200.0000 | - |"
    assert md[3] == "| b | ditto | 0.7000 (0.0500) | **100.0000** | - |"  # fewer bytes is better
    csv = report([a, b], ["pm.l_acc", "comm.up_bytes.total"], "csv").splitlines()
    assert csv == [
        "run,method,pm.l_acc,comm.up_bytes.total",
        "a,fedavg,0.8000 (0.1000)*,200.0000",
        "b,ditto,0.7000 (0.0500),100.0000*",
    ]


def test_ties_are_all_marked_and_best_test_runs_are_labelled(tmp_path):
    a = write_run(tmp_path, "a", "fedavg", {"ptr": 0.5, "ptr_mae": 0.2})
    b = write_run(tmp_path, "b", "fedavg", {"best_test.ptr": 0.5, "best_test.ptr_mae": 0.4}, select="best_test")
    lines = report([a, b], ["ptr", "ptr_mae"], "csv").splitlines()
    assert lines[1] == "a,fedavg,0.5000*,0.2000"
    assert lines[2] == "b [best_test],fedavg,0.5000*,0.4000*"  # a pass rate on MAE is still best when high


def test_default_columns_are_only_those_measured(tmp_path):
    a = write_run(tmp_path, "a", "local", {"pm.l_acc.mean": 0.5, "pm.l_acc.std": 0.0})
    header = report([a]).splitlines()[0]
    assert header == "| run | method | pm.l_acc |"


def test_report_bad_input(tmp_path, capsys):
    with pytest.raises(ConfigError, match="RUN_DIR"):
        report([tmp_path])
    a = write_run(tmp_path, "a", "local", {})
    with pytest.raises(ConfigError, match="--format"):
        report([a], None, "html")
    assert main(["report"]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "summary.json" in capsys.readouterr().err


def test_rounds_to_target_cells_are_counts_fewest_is_best_and_null_reads_never(tmp_path):
    a = write_run(tmp_path, "a", "fedavg", {"rounds_to_target": 30})
    b = write_run(tmp_path, "b", "ditto", {"rounds_to_target": 20})
    c = write_run(tmp_path, "c", "local", {"rounds_to_target": None})
    lines = report([a, b, c], fmt="csv").splitlines()
    assert lines == ["run,method,rounds_to_target", "a,fedavg,30", "b,ditto,20*", "c,local,never"]
