"""Sweep files: every file validates and parses; the local runner completes a 2x2 grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pfl.errors import ConfigError
from pfl.runner.sweep import command_argv, expand, plan, run_names

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_file_validates_and_every_run_parses_from_any_folder(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its --config paths name the shipped configs, not files of this folder
    runs, _ = plan(path, count=4, root=tmp_path / "runs")
    assert runs and all(r.argv[0] == "fit" for r in runs)
    configs = [a for r in runs for prev, a in zip(r.argv[:-1], r.argv[1:], strict=True) if prev == "--config"]
    assert all(Path(c).is_absolute() and Path(c).is_relative_to(ROOT / "conf") for c in configs)


def test_grid_expansion_and_macros():
    spec = {
        "method": "grid",
        "parameters": {
            "method.mu": {"values": [0.1, 0.01]},
            "seed": {"values": [0, 1]},
            "trainer.rounds": {"value": 2},
        },
        "command": ["${env}", "${interpreter}", "-m", "pfl", "fit", "--method.name", "fedprox", "${args}"],
    }
    grid = expand(spec)
    assert (
        len(grid) == 4 and {g["method.mu"] for g in grid} == {0.1, 0.01} and all(g["trainer.rounds"] == 2 for g in grid)
    )
    assert command_argv(spec, grid[0]) == [
        "fit",
        "--method.name",
        "fedprox",
        "--method.mu=0.1",
        "--seed=0",
        "--trainer.rounds=2",
    ]


def test_random_expansion_respects_bounds():
    spec = {
        "method": "random",
        "parameters": {"client.lr": {"distribution": "log_uniform_values", "min": 1e-3, "max": 1e-1}},
        "command": ["${interpreter}", "-m", "pfl", "fit", "${args}"],
    }
    draws = expand(spec, count=50)
    assert all(1e-3 <= d["client.lr"] <= 1e-1 for d in draws)
    with pytest.raises(ConfigError, match="--count"):
        expand(spec)


def test_bad_key_fails_before_any_run(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "method: grid\nparameters:\n  method.muu:\n    values: [1]\n"
        "command:\n  - ${interpreter}\n  - -m\n  - pfl\n  - fit\n  - --method.name\n  - fedprox\n  - ${args}\n"
    )
    with pytest.raises(ConfigError, match="method.muu|unrecognized"):
        plan(bad, root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_run_names_come_from_the_swept_values():
    grid = [{"method.mu": mu, "client.lr": lr, "seed": 0} for mu in (0.1, 1.0) for lr in (0.01, 1 / 3)]
    assert run_names(grid) == ["mu0.1-lr0.01", "mu0.1-lr0.3333", "mu1-lr0.01", "mu1-lr0.3333"]  # seed: one value
    both = [{"client.lr": 0.1, "server.lr": s} for s in (1.0, 0.5)] + [{"client.lr": 0.2, "server.lr": 1.0}]
    assert run_names(both) == ["client.lr0.1-server.lr1", "client.lr0.1-server.lr0.5", "client.lr0.2-server.lr1"]
    assert run_names([{"m": "a/b"}, {"m": "-x"}, {"m": "a/b"}]) == ["ma_b-000", "m-x", "ma_b-002"]
    assert run_names([{"seed": 0}]) == ["run000"]


def test_config_paths_are_read_beside_the_sweep_file_and_set_fixes_an_option(tmp_path, monkeypatch):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "base.yaml").write_text("data:\n  num_clients: 7\n")
    sweep = folder / "s.yaml"
    sweep.write_text(
        'method: grid\nparameters:\n  method.mu: {values: [0.1, 0.2]}\ncommand: ["${interpreter}", -m, pfl, fit, '
        '--config, conf/default.yaml, --config=base.yaml, --method.name, fedprox, "${args}"]\n'
    )
    monkeypatch.chdir(tmp_path)  # neither conf/default.yaml nor base.yaml is here
    runs, root = plan(sweep, root=tmp_path / "runs", overrides=["trainer.rounds=5", "--client.lr=0.2"])
    assert [r.name for r in runs] == ["mu0.1", "mu0.2"]
    argv = runs[0].argv
    assert argv[argv.index("--config") + 1] == str(ROOT / "conf" / "default.yaml")
    assert f"--config={folder / 'base.yaml'}" in argv
    assert argv[argv.index("--tracking.name") + 1] == "mu0.1"
    assert "--trainer.rounds=5" in argv and "--client.lr=0.2" in argv
    with pytest.raises(ConfigError, match="--set: method.mu is swept by the file"):
        plan(sweep, root=tmp_path / "runs", overrides=["method.mu=0.3"])
    with pytest.raises(ConfigError, match="--set: expected KEY=VALUE, got 'trainer.rounds'"):
        plan(sweep, root=tmp_path / "runs", overrides=["trainer.rounds"])
    with pytest.raises(ConfigError, match="--set: tracking.root is set by the sweep runner"):
        plan(sweep, root=tmp_path / "runs", overrides=["tracking.root=x"])
    with pytest.raises(ConfigError, match="trainer.roundz"):
        plan(sweep, root=tmp_path / "runs", overrides=["trainer.roundz=5"])  # parsed like any option
    assert not (tmp_path / "runs").exists()


def test_local_runner_completes_a_2x2_grid(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the config is the shipped one, found from any folder
    sweep = tmp_path / "grid.yaml"
    sweep.write_text(
        """
method: grid
metric: {name: pm.l_acc.mean, goal: maximize}
parameters:
  method.mu: {values: [0.0, 0.5]}
  client.lr: {values: [0.05, 0.1]}
command: ["${env}", "${interpreter}", -m, pfl, fit, --config, conf/default.yaml, --method.name, fedprox,
          --data.num_clients, "4", --model.hidden, "[16]", --tracking.wandb, "false", "${args}"]
"""
    )
    from pfl.cli import main

    root = tmp_path / "runs"
    argv = ["sweep", str(sweep), "--workers", "2", "--root", str(root), "--set", "trainer.rounds=2"]
    assert main([*argv, "--set", "trainer.eval_every=1"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(table) == 4 + 1  # header + 4 rows
    assert "mu0.5-lr0.1 method.mu=0.5, client.lr=0.1: ok" in out
    names = ["mu0-lr0.05", "mu0-lr0.1", "mu0.5-lr0.05", "mu0.5-lr0.1"]
    assert sorted(p.name for p in root.iterdir()) == sorted([*names, "results.csv", "results.md"])
    assert all(json.loads((root / n / "summary.json").read_text())["rounds"] == 2 for n in names)  # --set
    assert (root / "results.md").read_text().splitlines() == out.splitlines()[-6:]  # the table printed
    csv = (root / "results.csv").read_text().splitlines()
    assert csv[0].startswith("run,method,method.mu,client.lr,n,") and len(csv) == 5
