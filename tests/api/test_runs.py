"""pfl.load reads a run folder (or names the file it cannot read); pfl.compare is the report's table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pfl
from pfl.errors import ConfigError


def write_run(path: Path, seed: int, method: str, acc: float, lr: float = 0.1) -> Path:
    path.mkdir(parents=True)
    metrics = {"pm.l_acc.mean": acc, "pm.l_acc.std": 0.1, "gm.acc": acc / 2}
    summary = {"method": method, "dataset": "digits", "seed": seed, "rounds": 4, "metrics": metrics}
    (path / "summary.json").write_text(json.dumps(summary))
    config = f"seed: {seed}\nmethod:\n  name: {method}\nclient:\n  lr: {lr}\ntracking:\n  name: {path.name}\n"
    (path / "config.yaml").write_text(config)
    (path / "metrics.csv").write_text("round,pm.l_acc.mean\n2,0.5\n4,0.6\n")
    (path / "clients.csv").write_text("client,acc\n0,0.5\n1,0.7\n2,0.6\n")
    return path


def test_load_reads_every_file(tmp_path):
    run = pfl.load(write_run(tmp_path / "r", 0, "ditto", 0.6))
    assert run.path == tmp_path / "r" and run.summary["method"] == "ditto"
    assert list(run.metrics["round"]) == [2, 4] and isinstance(run.metrics, pd.DataFrame)
    assert len(run.clients) == 3 and list(run.clients.columns) == ["client", "acc"]
    assert run.config["method"] == {"name": "ditto"} and run.config["client"] == {"lr": 0.1}
    assert "ditto on digits" in repr(run)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.path = tmp_path  # a Run is what its folder held when it was loaded


@pytest.mark.parametrize(
    ("broken", "text", "problem"),
    [
        ("summary.json", None, "summary.json: not found"),
        ("summary.json", "{not json", "summary.json: cannot be read: Expecting property name"),
        ("summary.json", "[1, 2]", "summary.json: does not hold a JSON object"),
        ("metrics.csv", "", "metrics.csv: cannot be read"),
        ("clients.csv", None, "clients.csv: not found"),
        ("config.yaml", "a: [", "config.yaml: cannot be read"),
        ("config.yaml", "- 1\n", "config.yaml: does not hold a mapping"),
    ],
)
def test_a_bad_run_folder_is_a_config_error_naming_the_file(tmp_path, broken, text, problem):
    path = write_run(tmp_path / "r", 0, "ditto", 0.6)
    if text is None:
        (path / broken).unlink()
    else:
        (path / broken).write_text(text)
    with pytest.raises(ConfigError) as err:
        pfl.load(path)
    assert problem in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).endswith("(pass a folder written by pfl.fit or `python -m pfl fit`)")


def test_load_without_config_and_a_missing_folder(tmp_path):
    path = write_run(tmp_path / "r", 0, "ditto", 0.6)
    (path / "config.yaml").unlink()
    assert pfl.load(path).config == {}
    with pytest.raises(ConfigError, match="run_dir: .*nowhere is not a directory"):
        pfl.load(tmp_path / "nowhere")


def test_compare_is_the_reports_table(tmp_path):
    runs = [
        pfl.load(write_run(tmp_path / "d0", 0, "ditto", 0.6)),
        write_run(tmp_path / "d1", 1, "ditto", 0.8),  # a path works as well as a Run
        pfl.load(write_run(tmp_path / "f0", 0, "fedavg", 0.5)),
    ]
    table = pfl.compare(runs)
    assert list(table["method"]) == ["ditto", "fedavg"] and list(table["n"]) == [2, 1]
    assert list(table["run"]) == ["d0, d1", "f0"]  # every run of a row by its folder's name
    # A per-client metric is named as in summary.json and metrics.csv, its columns too.
    assert table["pm.l_acc.mean"].tolist() == pytest.approx([0.7, 0.5]) and "pm.l_acc" not in table
    assert table["pm.l_acc.mean_std"][0] == pytest.approx(np.std([0.6, 0.8], ddof=1))
    assert table["pm.l_acc.mean_best"].tolist() == [1, 0] and table["gm.acc"].tolist() == pytest.approx([0.35, 0.25])
    assert "pm.l_acc.mean_client_std" in table and "gm.acc_client_std" not in table
    per_run = pfl.compare(runs, metrics=["gm.acc", "pm.l_acc.mean"], per_run=True)
    assert len(per_run) == 3 and per_run["seed"].tolist() == [0, 1, 0] and "pm.l_acc" not in per_run
    assert list(per_run["run"]) == ["d0", "d1", "f0"]
    repeat = pfl.load(write_run(tmp_path / "d0b", 0, "ditto", 0.7))  # seed 0 again: still a row of its own
    assert list(pfl.compare([runs[0], repeat], per_run=True)["run"]) == ["d0", "d0b"]
    assert per_run["pm.l_acc.mean"].tolist() == pytest.approx([0.6, 0.8, 0.5])
    assert per_run["pm.l_acc.mean_client_std"].notna().all()  # asked as .mean: still the report's metric
    assert [c for c in per_run.columns if c in ("gm.acc", "pm.l_acc.mean")] == ["gm.acc", "pm.l_acc.mean"]  # as asked
    assert "pm.l_acc.mean" not in pfl.compare(runs, metrics=["gm.acc"])
    best = write_run(tmp_path / "b0", 0, "local", 0.4)
    summary = json.loads((best / "summary.json").read_text())
    (best / "summary.json").write_text(json.dumps({**summary, "select": "best_test"}))
    assert list(pfl.compare([best, runs[2]])["run"]) == ["b0 [best_test]", "f0"]  # the report's mark kept
    with pytest.raises(ConfigError, match="runs: is empty"):
        pfl.compare([])
    lr = pfl.compare([runs[0], write_run(tmp_path / "d2", 2, "ditto", 0.9, lr=0.01)])
    assert lr["client.lr"].tolist() == [0.1, 0.01]  # told apart by their config.yaml, not only their summary
