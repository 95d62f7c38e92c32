"""A mistyped option, method, model, data source or choice is answered in one short line with the
closest known name ("did you mean ...?"); the full list of options only where it fits on one line."""

from __future__ import annotations

import pytest

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.methods.ditto import Ditto
from pfl.suggest import choice_fix, close_matches, did_you_mean
from tests.helpers.cli_runs import TINY


def test_close_matches_ignore_case_and_keep_the_options_spelling():
    assert close_matches("FEDAVG", ["fedprox", "fedavg"]) == ["fedavg"]
    assert close_matches("dito", ["ditto", "fedavg", "apfl"]) == ["ditto"]
    assert close_matches("zzz", ["ditto", "fedavg"]) == []
    assert close_matches("dittoo", ["ditto", "dittos", "fedavg"], n=2) == ["ditto", "dittos"]


def test_did_you_mean_names_the_closest_or_nothing():
    assert did_you_mean("roudns", ["rounds", "threads"]) == "did you mean rounds?"
    assert did_you_mean("zzz", ["rounds", "threads"]) == ""


def test_choice_fix_names_the_close_option_else_lists_them():
    assert choice_fix("cpuu", ["cpu", "cuda"]) == "did you mean cpu?"
    assert choice_fix("zzz", ["cpu", "cuda"]) == "choose one of cpu, cuda"
    assert choice_fix("zzz", (1, 2)) == "choose one of 1, 2"


def fit_error(tmp_path, capsys, *args: str) -> str:
    """The one line ``pfl fit`` prints for ``args`` (exit 2, before anything is written)."""
    assert main(["fit", *TINY, "--tracking.root", str(tmp_path), "--tracking.name", "r", *args]) == 2
    err = capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--trainer.roudns", "10"], "trainer.roudns: unrecognized option (did you mean trainer.rounds?)"),
        (["--trainer.roudns=10"], "trainer.roudns: unrecognized option (did you mean trainer.rounds?)"),
        (["trainer.roudns=10"], "trainer.roudns: unrecognized option (did you mean trainer.rounds?)"),
        (["--trainr.rounds", "10"], "trainr.rounds: unrecognized option (did you mean trainer.rounds?)"),
        (["--trainer.lr", "0.1"], "trainer.lr: unrecognized option (did you mean server.lr or client.lr?)"),
        (["--sed", "1"], "sed: unrecognized option (did you mean seed?)"),
        (["--method", "ditto", "--method.lamm", "1"], "method.lamm: unrecognized option (did you mean method.lam?)"),
        (["--trainer.xyzzy", "1"], "trainer.xyzzy: unrecognized option (python -m pfl fit --help lists every option)"),
        (
            ["--trainer.roudns", "10", "--client.lrr", "1"],
            "arguments: unrecognized options trainer.roudns (did you mean trainer.rounds?), "
            "client.lrr (did you mean client.lr?)",
        ),
    ],
)
def test_an_unknown_option_names_the_closest_one(tmp_path, capsys, args, line):
    assert fit_error(tmp_path, capsys, *args) == f"error: {line}"


def test_an_unknown_key_in_a_config_file_names_the_closest_one(tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text("trainer:\n  roudns: 3\n")
    line = fit_error(tmp_path, capsys, "--config", str(tmp_path / "typo.yaml"))
    assert line == "error: trainer.roudns: unrecognized option (did you mean trainer.rounds?)"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--method", "dito"], "method.name: unknown method 'dito' (did you mean ditto?)"),
        (["--method", "FedAvgg"], "method.name: unknown method 'FedAvgg' (did you mean fedavg?)"),
        (["--model.name", "mpl"], "model.name: unknown model 'mpl' (did you mean mlp?)"),
        (["--data.source", "digts"], "data.source: unknown data source 'digts' (did you mean digits?)"),
        (["--data.partition", "dirichlt"], "data.partition: unknown value 'dirichlt' (did you mean dirichlet?)"),
        (["--trainer.accelerator", "cpuu"], "trainer.accelerator: unknown accelerator 'cpuu' (did you mean cpu?)"),
        (["--eval.select", "finale"], "eval.select: unknown value 'finale' (did you mean final?)"),
        (["--method", "ditto", "--method.prox", "exat"], "method.prox: unknown value 'exat' (did you mean exact?)"),
    ],
)
def test_an_unknown_name_or_choice_names_the_closest_one(tmp_path, capsys, args, line):
    assert fit_error(tmp_path, capsys, *args) == f"error: {line}"


def test_an_unknown_method_far_from_all_points_to_the_listing_instead_of_printing_it(tmp_path, capsys):
    line = fit_error(tmp_path, capsys, "--method", "qqqq")
    assert "python -m pfl methods lists them" in line and "fedavg" not in line and len(line) < 160


def test_a_method_built_in_python_gets_the_same_suggestion():
    with pytest.raises(ConfigError) as err:
        Ditto(prox="exat")  # type: ignore[arg-type]
    assert str(err.value) == "method.prox: unknown value 'exat' (did you mean exact?)"


def test_an_unknown_command_names_the_closest_one(capsys):
    assert main(["mthods"]) == 2
    assert capsys.readouterr().err == "error: command: unknown command 'mthods' (did you mean methods?)\n"
