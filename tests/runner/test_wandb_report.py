"""`pfl report --wandb`: the figures logged to a new W&B run of job type report, beside the compared runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pfl.cli import main


def _logged(run_dir: Path, project: str = "proj", group: str = "g") -> str:
    from pfl.runner.wandb_identity import WandbIdentity

    identity = WandbIdentity(f"{run_dir.name}-id", run_dir.name, project, group, ["fedavg"])
    identity.save(run_dir)
    return identity.id


def test_wandb_logs_the_figures_to_a_new_report_run_beside_the_runs(runs, tmp_path, monkeypatch, capfd):
    from tests.runner.test_wandb import finished_records, history, offline_logs, run_record

    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    ids = [_logged(runs[0]), _logged(runs[1])]  # the third run never logged to W&B
    out = tmp_path / "figs"
    args = ["report", *map(str, runs), "--plot", str(out / "c.png"), "--plot-clients", str(out / "k.png"), "--wandb"]
    assert main(args) == 0
    printed = capfd.readouterr()
    assert "W&B report run report-" in printed.err
    assert "wandb:" not in printed.out + printed.err  # W&B started silently
    (log,) = offline_logs(out)
    recs = finished_records(log)
    run = run_record(recs)
    assert (run.project, run.run_group, run.job_type) == ("proj", "g", "report")
    config = {item.key: item.value_json for item in run.config.update}
    assert json.loads(config["runs"]) == ids
    (row,) = history(recs)
    assert row["_step"] == 0
    for key, name in (("curves", "c.png"), ("clients", "k.png")):  # each figure, the file pfl wrote
        assert row[f"plots/{key}/_type"] == "image-file"
        assert row[f"plots/{key}/sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    for path in runs:  # the compared runs are not touched
        assert not (path / "wandb").exists()


def test_the_report_run_starts_in_pfls_mode_and_silently(tmp_path, monkeypatch, wandb_init_kwargs):
    """The mode is pfl's choice (offline unless logged in), passed to W&B rather than left to its own default."""
    from pfl.runner.wandb_identity import WandbIdentity
    from pfl.runner.wandb_report import log_report

    seen = wandb_init_kwargs
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(RuntimeError, match="stop here"):
        log_report(WandbIdentity("r-1", "r", "p", "g", ["report"], "report"), ["a"], {}, tmp_path)
    assert seen["mode"] == "disabled" and seen["settings"].silent
    assert (seen["id"], seen["job_type"], seen["config"]) == ("r-1", "report", {"runs": ["a"]})


def test_runs_of_several_groups_are_reported_in_the_report_group(runs):
    from pfl.runner.wandb_report import report_identity

    ids = [_logged(runs[0], group="a"), _logged(runs[1], group="b")]
    identity, found = report_identity(runs)
    assert identity.group == "report" and identity.job_type == "report" and found == ids


@pytest.mark.parametrize(
    ("setup", "extra", "message"),
    [
        ("none", ["--plot", "c.png"], "--wandb: none of the runs logged to W&B (no wandb_run.json in"),
        ("two_projects", ["--plot", "c.png"], "--wandb: the runs are in several W&B projects: p1, p2"),
        ("one", [], "--wandb: logs the figures"),
    ],
)
def test_wandb_without_logged_runs_or_figures_is_refused_before_anything_is_written(
    runs, tmp_path, capsys, setup, extra, message
):
    if setup == "two_projects":
        _logged(runs[0], project="p1"), _logged(runs[1], project="p2")
    elif setup == "one":
        _logged(runs[0])
    extra = [str(tmp_path / e) if e.endswith(".png") else e for e in extra]
    assert main(["report", *map(str, runs), *extra, "--wandb"]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("*.png")) and not (tmp_path / "wandb").exists()
