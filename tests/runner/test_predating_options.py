"""An option added after runs were recorded, whose default is another rule than theirs
(``Method.predating_options``: pFedMe's and Per-FedAvg's ``weighting``): a resumed older run keeps its
rule, and the report counts it at that rule, not at today's default."""

from __future__ import annotations

import pytest
import yaml

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.methods.pfedme import PFedMe
from pfl.methods.perfedavg import PerFedAvg
from pfl.runner.args import default_config, parse_fit_args, predating_args, recorded_defaults
from pfl.runner.fit_help import method_defaults
from tests.helpers.reports import write_run


def _recorded(tmp_path, name: str, method: str, drop: str | None = None, **options) -> object:
    config = default_config(method)
    if drop:
        del config["method"][drop]
    config["method"].update(options)
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


@pytest.mark.parametrize("method", ["pfedme", "perfedavg"])
def test_a_resumed_run_from_before_the_option_keeps_the_rule_it_trained_with(tmp_path, method):
    assert default_config(method)["method"]["weighting"] == "uniform"  # today's default: the paper's mean
    old = _recorded(tmp_path, "old", method, drop="weighting")
    new = _recorded(tmp_path, "new", method)
    assert predating_args(old / "config.yaml", method) == ["--method.weighting=samples"]
    assert predating_args(new / "config.yaml", method) == []
    assert parse_fit_args(["--resume", str(old), "--trainer.rounds", "60"])[0].method.weighting == "samples"
    assert parse_fit_args(["--resume", str(new), "--trainer.rounds", "60"])[0].method.weighting == "uniform"
    with pytest.raises(ConfigError, match=r"may not change method\.weighting \('samples' -> 'uniform'\)"):
        parse_fit_args(["--resume", str(old), "--method.weighting", "uniform"])
    assert predating_args(old / "config.yaml", "fedavg") == []  # a method without such options reads nothing


def test_the_report_counts_an_older_run_at_its_own_rule(tmp_path, capsys):
    assert PFedMe.predating_options == PerFedAvg.predating_options == {"weighting": "samples"}
    assert recorded_defaults("pfedme")["method"]["weighting"] == "samples"
    assert default_config("pfedme")["method"]["weighting"] == "uniform"  # recorded_defaults left it alone
    assert method_defaults("pfedme") == recorded_defaults("pfedme")  # the index holds the same
    assert method_defaults("fedavg") == default_config("fedavg")
    runs = []
    for name, drop, options, acc in (("old", "weighting", {}, 0.5), ("samples", None, {"weighting": "samples"}, 0.7),
                                     ("uniform", None, {}, 0.1)):  # fmt: skip
        config = default_config("pfedme")
        if drop:
            del config["method"][drop]
        config["method"].update(options)
        runs.append(write_run(tmp_path, name, "pfedme", {"gm.acc": acc}, config=config))
    assert main(["report", *map(str, runs), "--metrics", "gm.acc"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split(" | ")[:3] for r in rows] == [["| old +1", "pfedme", "samples"], ["| uniform", "pfedme", "uniform"]]
