"""The command line: end-to-end run outputs and the errors bad input must give before training."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pfl.cli import COMMANDS, main

TINY = [
    "--data.num_clients", "5", "--trainer.rounds", "2", "--trainer.eval_every", "1",
    "--model.hidden", "[16]", "--tracking.wandb", "false", "--trainer.progress", "false",
]  # fmt: skip


def run_cli(tmp_path: Path, *args: str) -> int:
    return main(["fit", *TINY, "--tracking.root", str(tmp_path), "--tracking.name", "r", *args])


def test_fit_writes_every_output(tmp_path):
    assert run_cli(tmp_path, "--config", "conf/method/ditto.yaml", "--method.lam", "0.5") == 0
    run = tmp_path / "r"
    for name in ("config.yaml", "metrics.csv", "clients.csv", "summary.json", "checkpoint.pt"):
        assert (run / name).exists(), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == "ditto" and summary["hparams"]["lam"] == 0.5
    assert {"method", "dataset", "num_clients", "rounds", "seed", "metrics"} <= set(summary)
    for key in ("pm.l_acc.mean", "pm.l_acc.std", "gm.acc", "throughput.samples_per_s"):
        assert key in summary["metrics"], key
    assert len((run / "clients.csv").read_text().splitlines()) == 1 + 5
    assert len((run / "metrics.csv").read_text().splitlines()) == 1 + 2
    assert "lam: 0.5" in (run / "config.yaml").read_text()


def test_method_shorthand_and_interpolation(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("method:\n  name: fedprox\n  mu: 0.2\ntrainer:\n  rounds: 2\n  eval_every: ${trainer.rounds}\n")
    assert run_cli(tmp_path, "--config", str(cfg)) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["method"] == "fedprox" and summary["hparams"]["mu"] == 0.2


def test_methods_lists_every_method(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("local", "fedavg", "fedprox", "ditto"):
        assert name in out


def test_help_shows_the_chosen_methods_options(capsys):
    assert main(["fit", "--method", "ditto", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--method.lam" in out and "--method.personal_epochs" in out


# Every command, and the commands of `data`: each --help must print its own usage.
SUBCOMMANDS = [(), *((c,) for c in COMMANDS), ("data", "export"), ("data", "stats")]


def test_every_command_is_among_those_whose_help_is_checked():
    assert {s[0] for s in SUBCOMMANDS if s} == set(COMMANDS)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", SUBCOMMANDS, ids=lambda c: " ".join(c) or "pfl")
def test_each_commands_help_shows_its_own_usage(command, flag, capsys):
    try:
        code = main([*command, flag])
    except SystemExit as stop:  # argparse's help exits by itself
        code = stop.code
    out = capsys.readouterr().out
    first = out.lstrip().splitlines()[0]
    named = " ".join(command) if command else "<command>"
    assert code == 0 and first.startswith(f"usage: python -m pfl {named}"), first


@pytest.mark.parametrize(
    "argv",
    [
        ["methods", "extra"],
        ["sweep"],
        ["sweep", "sweeps/fedprox_mu.yaml", "--workers", "x"],
        ["reproduce", "--workers", "x"],
        ["reproduce", "--accelerator", "tpu"],
        ["report", "--format", "xml", "runs/x"],
        ["data", "--nope"],
    ],
    ids=" ".join,
)
def test_a_commands_bad_argument_is_one_line_naming_the_command_and_its_usage(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {argv[0]}"), err
    if argv[0] != "data":  # argparse's refusals carry the usage line as their fix
        assert f"(usage: python -m pfl {argv[0]} " in err, err


@pytest.mark.parametrize(
    ("args", "field", "hint"),
    [
        (["--method", "fedfoo"], "method.name", "did you mean fedfomo?"),
        (["--trainer.fraction", "1.5"], "trainer.fraction", "(0, 1]"),
        (["--trainer.fraction", "0"], "trainer.fraction", "(0, 1]"),
        (["--client.lr", "-0.1"], "client.lr", "> 0"),
        (["--config", "conf/nope.yaml"], "--config", "conf/nope.yaml"),
        (["--method.foo", "1"], "method.foo: unrecognized option", "--help lists every option"),
        (["--method", "fedprox", "--method.mu", "-1"], "method.mu", ">= 0"),
        (["--data.source", "imagenet"], "data.source", "did you mean tiny_imagenet?"),
        (["--client.lr", "inf"], "client.lr", "expected a finite number, got 'inf'"),
        (["--trainer.clients_per_round", "x"], "trainer.clients_per_round", "expected a whole number or null"),
        (["--trainer.progress", "maybe"], "trainer.progress", "expected true or false, got 'maybe'"),
        (["--tracking.tags", "[[1]]"], "tracking.tags", "expected text, got '[1]'"),
        (["--model.hidden", "x"], "model.hidden", "expected a list in brackets (e.g. [1,2]), got 'x'"),
        (["--model.init_args", "[1]"], "model.init_args", "expected a mapping, got '[1]'"),
        (["--trainer.rounds"], "trainer.rounds: has no value", "--trainer.rounds=VALUE"),
    ],
)
def test_bad_input_fails_before_training(tmp_path, capsys, args, field, hint):
    assert run_cli(tmp_path, *args) == 2
    err = capsys.readouterr().err
    assert field in err and hint in err, err
    assert not (tmp_path / "r").exists()  # nothing was started


def test_the_pfl_script_imports_a_users_method_from_the_working_directory(tmp_path, monkeypatch, capsys):
    # The installed script's sys.path starts with its own folder, not the working directory as python -m's.
    (tmp_path / "users_prox.py").write_text(
        "from pfl.methods.fedprox import FedProx\n\n\nclass UsersProx(FedProx):\n"
        "    def __init__(self, users_mu: float = 0.5, **kwargs):\n"
        "        super().__init__(mu=users_mu, **kwargs)\n        self.users_mu = users_mu\n"
    )
    monkeypatch.chdir(tmp_path)
    kept = [p for p in sys.path if os.path.abspath(p or os.curdir) != str(tmp_path)]
    monkeypatch.setattr(sys, "path", kept)
    monkeypatch.setattr(sys, "argv", ["pfl", "fit", "--method", "users_prox.UsersProx", "--help"])
    assert main() == 0
    assert "--method.users_mu" in capsys.readouterr().out
    assert sys.path[0] == str(tmp_path)
    main()  # once there, it is not added again
    assert sys.path.count(str(tmp_path)) == 1


def test_a_reader_that_goes_away_ends_the_listing_quietly():
    import subprocess
    import sys

    from tests.helpers.cli_runs import child_env

    child = subprocess.Popen(
        [sys.executable, "-m", "pfl", "methods"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    child.stdout.close()  # gone before the listing is written: every write meets a closed pipe
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141 and err == "", err
