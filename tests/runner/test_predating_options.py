"""An option added after runs were recorded, whose default is another rule than theirs
(``Method.predating_options``: pFedMe's and Per-FedAvg's ``weighting``): a resumed older run keeps its
rule, and the report counts it at that rule, not at today's default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.methods.perfedavg import PerFedAvg
from pfl.methods.pfedme import PFedMe
from pfl.runner.args import RecordedConfig, default_config, parse_fit_args, predating_args, recorded_defaults
from pfl.runner.fit_help import method_defaults
from tests.helpers.reports import write_run


def _config(method: str, drop: str | None = None, **options) -> dict:
    """The config.yaml a run of ``method`` records, without option ``drop`` (a run from before it)."""
    config = default_config(method)
    if drop:
        del config["method"][drop]
    config["method"].update(options)
    return config


def _recorded(tmp_path: Path, name: str, method: str, drop: str | None = None, **options) -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(_config(method, drop, **options)))
    return run


@pytest.mark.parametrize("method", ["pfedme", "perfedavg"])
def test_a_resumed_run_from_before_the_option_keeps_the_rule_it_trained_with(tmp_path, method):
    assert default_config(method)["method"]["weighting"] == "uniform"  # today's default: the paper's mean
    old = _recorded(tmp_path, "old", method, drop="weighting")
    new = _recorded(tmp_path, "new", method)
    assert predating_args(RecordedConfig.read(old), method) == ["--method.weighting=samples"]
    assert predating_args(RecordedConfig.read(new), method) == []
    assert parse_fit_args(["--resume", str(old), "--trainer.rounds", "60"])[0].method.weighting == "samples"
    assert parse_fit_args(["--resume", str(new), "--trainer.rounds", "60"])[0].method.weighting == "uniform"
    with pytest.raises(ConfigError, match=r"may not change method\.weighting \('samples' -> 'uniform'\)"):
        parse_fit_args(["--resume", str(old), "--method.weighting", "uniform"])
    assert predating_args(RecordedConfig.read(old), "fedavg") == []  # a method without such options reads nothing


def test_the_report_counts_an_older_run_at_its_own_rule(tmp_path, capsys):
    assert PFedMe.predating_options == PerFedAvg.predating_options == {"weighting": "samples"}
    assert recorded_defaults("pfedme")["method"]["weighting"] == "samples"
    assert default_config("pfedme")["method"]["weighting"] == "uniform"  # recorded_defaults left it alone
    assert method_defaults("pfedme") == recorded_defaults("pfedme")  # the index holds the same
    assert method_defaults("fedavg") == default_config("fedavg")
    runs = [
        write_run(tmp_path, "old", "pfedme", {"gm.acc": 0.5}, config=_config("pfedme", drop="weighting")),
        write_run(tmp_path, "samples", "pfedme", {"gm.acc": 0.7}, config=_config("pfedme", weighting="samples")),
        write_run(tmp_path, "uniform", "pfedme", {"gm.acc": 0.1}, config=_config("pfedme")),
    ]
    assert main(["report", *map(str, runs), "--metrics", "gm.acc"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split(" | ")[:3] for r in rows] == [["| old +1", "pfedme", "samples"], ["| uniform", "pfedme", "uniform"]]


def test_a_resume_reads_a_recorded_config_in_class_path_form_as_the_fit_does(tmp_path):
    """A config.yaml edited into Lightning's class_path form: the resume's check of changed settings and
    its predating options read it rewritten, as the fit's parse does (not as unknown keys, nor as lacking
    the options it holds in init_args)."""
    config = _config("pfedme", weighting="uniform")
    method = config.pop("method")
    del method["name"]
    config["method"] = {"class_path": "pfl.methods.pfedme.PFedMe", "init_args": method}
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert predating_args(RecordedConfig.read(run), "pfedme") == []  # weighting is recorded, in init_args
    cfg = parse_fit_args(["--resume", str(run), "--trainer.rounds", "60"])[0]
    assert (cfg.method.weighting, cfg.trainer.rounds) == ("uniform", 60)
    refused = re.escape(f"{run} was recorded with other settings; a resume may not change method.weighting")
    refused += r" \('uniform' -> 'samples'\)"
    with pytest.raises(ConfigError, match=refused):
        parse_fit_args(["--resume", str(run), "--method.weighting", "samples"])
