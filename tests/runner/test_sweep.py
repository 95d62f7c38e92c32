"""Sweep files: every file validates and parses; the local runner completes a 2x2 grid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pfl.errors import ConfigError
from pfl.runner.sweep import (
    _draw,
    command_argv,
    config_paths,
    expand,
    load_sweep,
    plan,
    run_names,
    run_status,
    tracking_args,
    validate_spec,
)

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


def test_a_sweeps_runs_go_under_runs_sweeps_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, root = plan(ROOT / "sweeps" / "fedprox_mu.yaml", count=1)
    assert root.parent == Path("runs") / "sweeps" and root.name.startswith("fedprox_mu-20")  # the file, the time
    assert not root.exists()  # planned, not made


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


def fedprox_grid(path: Path, mu: list[float], lr: list[float] | None = None) -> Path:
    """A grid sweep file of FedProx's mu (and client.lr) on 4 clients of the shipped default experiment."""
    lrs = "" if lr is None else f"\n  client.lr: {{values: {lr}}}"
    path.write_text(
        f"""
method: grid
metric: {{name: pm.l_acc.mean, goal: maximize}}
parameters:
  method.mu: {{values: {mu}}}{lrs}
command: ["${{env}}", "${{interpreter}}", -m, pfl, fit, --config, conf/default.yaml, --method.name, fedprox,
          --data.num_clients, "4", --model.hidden, "[16]", --tracking.wandb, "false", "${{args}}"]
"""
    )
    return path


def test_local_runner_completes_a_2x2_grid(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the config is the shipped one, found from any folder
    sweep = fedprox_grid(tmp_path / "grid.yaml", mu=[0.0, 0.5], lr=[0.05, 0.1])
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


def _numbers(run: Path) -> dict:
    metrics = json.loads((run / "summary.json").read_text())["metrics"]
    return {k: v for k, v in metrics.items() if not k.startswith(("time.", "throughput."))}


def test_an_interrupted_sweep_is_resumed_and_gives_a_fresh_sweeps_numbers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sweep = fedprox_grid(tmp_path / "mu.yaml", mu=[0.0, 0.5])
    from pfl.cli import main

    root, fresh = tmp_path / "runs", tmp_path / "fresh"
    assert main(["sweep", str(sweep), "--root", str(root), "--set", "trainer.rounds=1"]) == 0
    shutil.rmtree(root / "mu0.5")  # stopped after its first run: mu0 has 1 round and a checkpoint
    capsys.readouterr()
    # a second call into the folder is refused before any run, nothing changed
    before = (root / "mu0" / "summary.json").read_bytes()
    assert main(["sweep", str(sweep), "--root", str(root), "--set", "trainer.rounds=2"]) == 2
    err = capsys.readouterr().err
    assert "--root: " in err and "already holds runs named as this sweep's (mu0)" in err
    assert f"continue that sweep with --resume {root}" in err
    assert (root / "mu0" / "summary.json").read_bytes() == before and not (root / "mu0.5").exists()

    # resumed with more rounds: mu0 continues from its checkpoint, mu0.5 starts
    assert main(["sweep", str(sweep), "--resume", str(root), "--set", "trainer.rounds=2"]) == 0
    out = capsys.readouterr().out
    assert f"resuming the sweep in {root}: 1 of 2 runs started there" in out
    for run in plan(sweep, root=root, overrides=["trainer.rounds=2"])[0]:  # uninterrupted, in this process
        assert main([*run.argv, "--tracking.root", str(fresh)]) == 0
    for name in ("mu0", "mu0.5"):
        assert json.loads((root / name / "summary.json").read_text())["rounds"] == 2
        assert _numbers(root / name) == _numbers(fresh / name)  # a resume continues the same run exactly
    assert len((root / "results.csv").read_text().splitlines()) == 3

    # resumed again: a finished run is kept as it is, and a run recorded with other settings is not mixed
    # in (its resume is refused, naming the setting)
    from pfl.runner.sweep import run_sweep

    kept = {name: (root / name / "summary.json").read_bytes() for name in ("mu0", "mu0.5")}
    config = root / "mu0.5" / "config.yaml"
    config.write_text(config.read_text().replace("mu: 0.5", "mu: 0.25"))
    with pytest.raises(ConfigError, match=r"1 of 2 runs failed: mu0\.5 .*may not change method\.mu \(0\.25 -> 0\.5\)"):
        run_sweep(sweep, resume=root, overrides=["trainer.rounds=2"])
    assert kept == {name: (root / name / "summary.json").read_bytes() for name in kept}


def test_a_sweep_with_failed_runs_saves_the_table_of_those_that_finished(tmp_path, monkeypatch):
    import pfl.runner.sweep as sweep
    from tests.helpers.reports import config, write_run

    path = ROOT / "sweeps" / "fedprox_mu.yaml"  # 4 runs
    names = [run.name for run in sweep.plan(path, root=tmp_path)[0]]

    def two_finish(argvs, workers, fresh):
        for mu, name in enumerate(names[:2]):
            write_run(
                tmp_path, name, "fedprox", {"pm.l_acc.mean": 0.5}, config=config("fedprox", 0, tmp_path, name, mu=mu)
            )
        raise ConfigError("sweep", "2 of 4 runs failed: ...")

    monkeypatch.setattr(sweep, "run_parallel", two_finish)
    with pytest.raises(ConfigError) as failed:
        sweep.run_sweep(path, root=tmp_path)
    results = tmp_path / "results.md"
    assert (
        str(failed.value) == f"sweep: 2 of 4 runs failed: ... (the table of the 2 runs that finished is in {results})"
    )
    assert [line.split(" | ")[0] for line in results.read_text().splitlines()[2:]] == [f"| {n}" for n in names[:2]]
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 3

    def none_finish(argvs, workers, fresh):
        raise ConfigError("sweep", "4 of 4 runs failed: ...")

    monkeypatch.setattr(sweep, "run_parallel", none_finish)
    results.unlink()
    with pytest.raises(ConfigError, match=r"^sweep: 4 of 4 runs failed: \.\.\.$"):
        sweep.run_sweep(path, root=tmp_path / "other")
    assert not (tmp_path / "other" / "results.md").exists()


def test_the_sweeps_table_notes_runs_of_more_than_one_platform_on_stderr(tmp_path, monkeypatch, capsys):
    import pfl.runner.sweep as sweep
    from pfl.cli import main
    from tests.helpers.reports import config, write_run

    path = ROOT / "sweeps" / "fedprox_mu.yaml"  # 4 runs
    amd = {"torch": "2.14.1", "cpu": "AMD EPYC", "cpu_kernels": "AVX2", "threads": 1}
    kernels: list[str] = []

    def finish(argvs, workers, fresh):  # the runs as fit writes them, each on the platform of its kernels
        for mu, (argv, cpu_kernels) in enumerate(zip(argvs.values(), kernels, strict=True)):
            root, name = Path(argv[argv.index("--tracking.root") + 1]), argv[argv.index("--tracking.name") + 1]
            cfg = config("fedprox", 0, root, name, mu=mu)
            run = write_run(root, name, "fedprox", {"pm.l_acc.mean": 0.5}, config=cfg)
            summary = json.loads((run / "summary.json").read_text())
            summary["platform"] = {**amd, "cpu_kernels": cpu_kernels}
            (run / "summary.json").write_text(json.dumps(summary))

    monkeypatch.setattr(sweep, "run_parallel", finish)
    kernels[:] = ["AVX2"] * 4
    assert main(["sweep", str(path), "--root", str(tmp_path / "one")]) == 0
    out, err = capsys.readouterr()
    assert out == (tmp_path / "one" / "results.md").read_text() and "| mu" in out  # stdout: the table alone
    assert err == ""  # one platform: nothing to note
    kernels[:] = ["AVX2", "AVX512", "AVX2", "AVX2"]
    assert main(["sweep", str(path), "--root", str(tmp_path / "two")]) == 0
    out, err = capsys.readouterr()
    assert out == (tmp_path / "two" / "results.md").read_text()
    assert err.count("\n") == 1 and err.startswith(
        "note: Numbers computed on 2 platforms (torch 2.14.1, AMD EPYC (AVX2 kernels, 1 thread): 3 run(s); "
        "torch 2.14.1, AMD EPYC (AVX512 kernels, 1 thread): 1 run(s)). The same run can give other numbers"
    )


def test_a_refused_second_sweep_names_the_first_three_runs_it_found(tmp_path, monkeypatch):
    import pfl.runner.sweep as sweep

    monkeypatch.setattr(sweep, "run_parallel", lambda *args, **kwargs: pytest.fail("a run started"))
    path = ROOT / "sweeps" / "fedprox_mu.yaml"  # 4 runs
    names = [run.name for run in sweep.plan(path, root=tmp_path)[0]]
    for shown, started in ((", ".join(names[:3]), 3), (", ".join(names[:3]) + ", ...", 4)):
        for name in names[:started]:
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / "config.yaml").write_text("{}")
        with pytest.raises(ConfigError) as refused:
            sweep.run_sweep(path, root=tmp_path)
        assert f"already holds runs named as this sweep's ({shown})" in str(refused.value)


def test_a_resume_names_the_sweeps_folder_alone_and_a_rerun_that_overwrites_is_not_refused(tmp_path, monkeypatch):
    import pfl.runner.sweep as sweep

    ran = []
    monkeypatch.setattr(sweep, "run_parallel", lambda argvs, workers, fresh: ran.append(list(argvs.values())))
    monkeypatch.setattr(sweep, "save_results", lambda root, dirs: None)
    path = ROOT / "sweeps" / "fedprox_mu.yaml"
    with pytest.raises(ConfigError, match=r"^--root: is given with --resume, which names the sweep's folder itself"):
        sweep.run_sweep(path, 2, root=tmp_path, resume=tmp_path)
    with pytest.raises(ConfigError, match=r"^--resume: .*nothing is not a folder .*give the folder of the sweep"):
        sweep.run_sweep(path, 2, resume=tmp_path / "nothing")
    assert ran == [] and not (tmp_path / "nothing").exists()
    runs, _ = sweep.plan(path, 2, tmp_path)
    (tmp_path / runs[0].name).mkdir()
    (tmp_path / runs[0].name / "config.yaml").write_text("{}")  # a run of that name was started there
    (tmp_path / runs[1].name).mkdir()  # an empty folder: a new run uses it
    with pytest.raises(ConfigError, match=rf"already holds runs named as this sweep's \({runs[0].name}\)"):
        sweep.run_sweep(path, 2, root=tmp_path)
    sweep.run_sweep(path, 2, root=tmp_path, overrides=["tracking.overwrite=true"])  # replaces it, as fit does
    assert [argv[:2] for argv in ran[0]] == [["fit", "--config"]] * 2
    sweep.run_sweep(path, 2, resume=tmp_path)
    assert ran[1][0][:3] == ["fit", "--resume", str(tmp_path / runs[0].name)] and ran[1][0][3:] == runs[0].argv[1:]
    assert ran[1][1] == runs[1].argv  # nothing recorded there: it starts


# -- the sweep file's checks, each refusal naming its field -------------------------------------------------
COMMAND = ["${interpreter}", "-m", "pfl", "fit", "${args}"]


def spec_of(**kw) -> dict:
    return {"method": "grid", "parameters": {"seed": {"values": [0, 1]}}, "command": COMMAND, **kw}


def random(**law) -> dict:
    """A random search over one parameter ``a`` drawn from ``law``."""
    return spec_of(method="random", parameters={"a": law})


def test_a_valid_spec_passes_and_each_refusal_names_its_field():
    validate_spec(spec_of())
    validate_spec(spec_of(method="random", parameters={"client.lr": {"min": 0.1, "max": 0.2}}, project="p"))
    validate_spec(spec_of(parameters={"seed": {"value": 3}}, metric={"name": "m"}))
    validate_spec(spec_of(command=["python", "train.py", "${args}"], program="pfl"))  # a program instead of -m pfl
    for dist, extra in (
        ("normal", {"mu": 0, "sigma": 0}),
        ("categorical", {"values": ["a"]}),
        ("int_uniform", {"min": 1, "max": 1}),
        ("log_uniform_values", {"min": 1e-3, "max": 1}),
        ("uniform", {"min": -1, "max": 0.5}),
    ):
        validate_spec(spec_of(method="bayes", parameters={"k": {"distribution": dist, **extra}}))
    refusals = [
        (spec_of(method="hyperband"), r"sweep\.method: got 'hyperband'.*one of"),
        (spec_of(parameters={}), r"sweep\.parameters: missing or empty"),
        (spec_of(parameters=None), r"sweep\.parameters: missing or empty"),
        (spec_of(parameters={"seed": 3}), r"sweep\.parameters\.seed: must be a mapping"),
        (spec_of(parameters={"a": {"parameters": {}}}), r"sweep\.parameters\.a: nested parameter groups"),
        (spec_of(parameters={"seed": {"values": []}}), r"sweep\.parameters\.seed: values must be a non-empty list"),
        (spec_of(parameters={"seed": {"values": 3}}), r"sweep\.parameters\.seed: values must be a non-empty list"),
        (spec_of(parameters={"seed": {}}), r"sweep\.parameters\.seed: distribution None is not supported"),
        (spec_of(parameters={"a": {"distribution": "beta"}}), r"sweep\.parameters\.a: distribution 'beta'"),
        (spec_of(method="random", parameters={"a": {"min": 1}}), r"sweep\.parameters\.a: uniform needs min and max"),
        (
            spec_of(method="random", parameters={"a": {"distribution": "normal", "mu": 0}}),
            r"sweep\.parameters\.a: normal needs mu and sigma",
        ),
        (spec_of(parameters={"a": {"min": 0, "max": 1}}), r"sweep\.parameters\.a: grid search needs discrete values"),
        (random(distribution="categorical"), r"sweep\.parameters\.a: categorical needs values \(give values"),
        (random(min="1e-3", max=1.0), r"parameters\.a\.min: must be a finite number \(got '1e-3'\) \(YAML reads"),
        (random(min=0, max=float("inf")), r"sweep\.parameters\.a\.max: must be a finite number \(got inf\)$"),
        (random(min=True, max=2), r"sweep\.parameters\.a\.min: must be a finite number \(got True\)"),
        (random(min=2, max=1), r"sweep\.parameters\.a: min 2 is above max 1"),
        (random(distribution="int_uniform", min=1, max=2.5), r"a\.max: must be a finite integer \(got 2\.5"),
        (random(distribution="log_uniform_values", min=0, max=1), r"parameters\.a\.min: must be > 0 on a log scale"),
        (random(distribution="normal", mu=0, sigma=-1), r"sweep\.parameters\.a\.sigma: must be >= 0 \(got -1\)"),
        (random(distribution="normal", mu=None, sigma=1), r"sweep\.parameters\.a\.mu: must be a finite number"),
        (spec_of(command=["python", "-m", "pfl", "fit"]), r"sweep\.command: must be a list containing \$\{args\}"),
        (spec_of(command="python -m pfl fit ${args}"), r"sweep\.command: must be a list"),
        (spec_of(command=[*COMMAND, "${args_json_file}"]), r"sweep\.command: \$\{args_json_file\} is not read"),
        (spec_of(project=3), r"sweep\.project: must be a W&B project name"),
        (spec_of(command=["python", "train.py", "${args}"]), r"sweep\.command: must run pfl"),
        (spec_of(metric={"goal": "maximize"}), r"sweep\.metric: needs a name"),
        (spec_of(metric="acc"), r"sweep\.metric: needs a name"),
        (spec_of(metric={"name": "m", "goal": "max"}), r"sweep\.metric\.goal: maximize\|minimize"),
    ]
    for spec, message in refusals:
        with pytest.raises(ConfigError, match=message):
            validate_spec(spec)


def test_a_sweep_file_that_is_missing_not_yaml_or_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"sweep: file not found: .*nope\.yaml"):
        load_sweep(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("command: [${args}\n")
    with pytest.raises(ConfigError) as refused:
        load_sweep(broken)
    assert str(refused.value) == (
        f"sweep: {broken} is not valid YAML at line 1, column 12: expected ',' or ']', but got '{{' "
        "(quote ${...} macros in flow lists)"
    )  # one line, at the macro left unquoted
    with pytest.raises(ConfigError, match=r"sweep: .* is not a file"):
        load_sweep(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"method: grid\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"sweep: cannot read .*binary\.yaml: .*utf-8.*\(pass a W&B sweep YAML"):
        load_sweep(binary)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"sweep: .*list\.yaml is not a YAML mapping"):
        load_sweep(listing)


def test_grid_is_cut_to_count_and_random_and_bayes_draw_count_sets_from_the_seed():
    grid = spec_of(parameters={"a": {"values": [1, 2, 3]}, "b": {"values": ["x", "y"]}})
    assert expand(grid) == [{"a": a, "b": b} for a in (1, 2, 3) for b in ("x", "y")]
    assert expand(grid, count=4) == expand(grid)[:4]
    drawn = spec_of(method="random", parameters={"a": {"values": [1, 2, 3]}, "b": {"value": 7}})
    assert expand(drawn, count=5, seed=1) == expand(drawn, count=5, seed=1) != expand(drawn, count=5, seed=2)
    assert expand(drawn, count=5) == expand(drawn, count=5, seed=0)  # a sweep file draws the same runs every time
    assert len(expand(drawn, count=5)) == 5 and {d["b"] for d in expand(drawn, count=5)} == {7}
    bayes = {**drawn, "method": "bayes"}
    assert expand(bayes, count=5, seed=1) == expand(drawn, count=5, seed=1)  # no server: random search
    with pytest.raises(ConfigError, match="--count: bayes search needs --count N"):
        expand(bayes)
    for count in (0, -2):  # neither the whole grid nor all but its last two runs
        with pytest.raises(ConfigError, match=rf"--count: {count} is not a number of runs \(give 1 or more"):
            expand(grid, count=count)


def test_a_sweep_without_a_worker_or_with_a_file_for_its_folder_is_refused_before_any_run(tmp_path):
    from pfl.runner.sweep import run_sweep

    for workers in (0, -1):
        with pytest.raises(ConfigError, match=rf"--workers: {workers} is not a number of worker processes"):
            run_sweep(ROOT / "sweeps" / "fedprox_mu.yaml", 1, workers, tmp_path / "runs")
    assert not (tmp_path / "runs").exists()
    (tmp_path / "file").write_text("kept")
    with pytest.raises(ConfigError, match=r"^--root: .*file cannot be created: .*is a file.*choose another --root"):
        run_sweep(ROOT / "sweeps" / "fedprox_mu.yaml", 1, 1, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "kept"


def test_a_python_sweep_runs_its_plan_in_one_warm_worker_by_default(tmp_path, monkeypatch):
    import pfl.runner.sweep as sweep

    seen = {}

    def run_parallel(argvs: dict, workers: int, fresh: bool) -> None:
        seen.update(argvs=argvs, workers=workers, fresh=fresh)

    monkeypatch.setattr(sweep, "run_parallel", run_parallel)
    monkeypatch.setattr(sweep, "save_results", lambda root, dirs: seen.update(root=root, dirs=dirs))
    root = tmp_path / "sweeps" / "mu"  # its folders are made
    for _ in range(2):  # and a folder that exists is used as it is
        dirs = sweep.run_sweep(ROOT / "sweeps" / "fedprox_mu.yaml", 2, root=root)
        assert (seen["workers"], seen["fresh"]) == (1, False)
        assert seen["root"] == root and seen["dirs"] == dirs and len(dirs) == len(seen["argvs"]) == 2


def test_a_sweeps_runs_are_parsed_with_one_parser_per_method(monkeypatch):
    import pfl.runner.args as args
    import pfl.runner.sweep as sweep

    built = []
    build = args.build_fit_parser
    monkeypatch.setattr(args, "build_fit_parser", lambda name: built.append(name) or build(name))
    runs, _ = sweep.plan(ROOT / "sweeps" / "fedprox_mu.yaml")
    assert len(runs) == 4 and built == ["fedprox"]


def test_a_given_root_under_a_file_is_refused_before_the_runs_are_parsed(tmp_path, monkeypatch):
    import pfl.runner.sweep as sweep

    monkeypatch.setattr(sweep, "plan", lambda *a: pytest.fail("the runs were parsed first"))
    (tmp_path / "file").write_text("kept")
    with pytest.raises(ConfigError, match=r"^--root: "):
        sweep.run_sweep(ROOT / "sweeps" / "fedprox_mu.yaml", root=tmp_path / "file" / "sweep")
    assert (tmp_path / "file").read_text() == "kept"


def test_each_distribution_draws_within_its_law():
    rng = np.random.default_rng(0)
    draws = {
        "uniform": [_draw({"min": 2.0, "max": 3.0}, rng) for _ in range(400)],
        "log": [_draw({"distribution": "log_uniform_values", "min": 1e-4, "max": 1.0}, rng) for _ in range(400)],
        "int": [_draw({"distribution": "int_uniform", "min": 1, "max": 3}, rng) for _ in range(400)],
        "normal": [_draw({"distribution": "normal", "mu": 5.0, "sigma": 0.1}, rng) for _ in range(400)],
        "values": [_draw({"values": ["a", "b", "c"]}, rng) for _ in range(400)],
    }
    assert all(2.0 <= x <= 3.0 and isinstance(x, float) for x in draws["uniform"])
    assert abs(np.mean(draws["uniform"]) - 2.5) < 0.05
    logs = np.log10(draws["log"])  # uniform in the exponent: about half below 1e-2
    assert all(-4 <= v <= 0 for v in logs) and abs(np.mean(logs) + 2) < 0.15
    assert set(draws["int"]) == {1, 2, 3} and all(type(x) is int for x in draws["int"])  # both ends drawn
    assert abs(np.mean(draws["normal"]) - 5.0) < 0.03 and 0.07 < np.std(draws["normal"]) < 0.13
    assert set(draws["values"]) == {"a", "b", "c"} and _draw({"value": 9}, rng) == 9


def test_the_command_fills_both_arg_macros_drops_the_launchers_and_writes_booleans_in_lower_case():
    spec = spec_of(command=["${env}", "${program}", "fit", "${args_no_hyphens}", "--x", "${args}"])
    assert command_argv(spec, {"a.b": True, "c": 0.5}) == ["fit", "a.b=true", "c=0.5", "--x", "--a.b=true", "--c=0.5"]
    assert command_argv(spec_of(command=["pfl", "fit", "${args}"]), {"k": False}) == ["pfl", "fit", "--k=false"]
    unquoted = ["-m", "pfl", "fit", "--data.num_clients", 4, "--trainer.progress", False, "${args}"]  # as YAML reads
    expected = ["fit", "--data.num_clients", "4", "--trainer.progress", "false"]
    assert command_argv(spec_of(command=unquoted), {}) == expected


def test_runs_are_grouped_under_the_sweep_unless_the_command_sets_the_tracking_itself(tmp_path):
    root = tmp_path / "mysweep"
    assert tracking_args({"project": "p"}, ["fit"], root) == [
        "--tracking.project", "p", "--tracking.group", "mysweep", "--tracking.job_type", "sweep",
    ]  # fmt: skip
    given = ["fit", "--tracking.project=q", "--tracking.group", "g", "--tracking.job_type=x"]
    assert tracking_args({"project": "p"}, given, root) == []
    assert tracking_args({}, ["fit"], root) == ["--tracking.group", "mysweep", "--tracking.job_type", "sweep"]


def test_config_paths_leave_absolute_and_unknown_paths_as_given(tmp_path):
    absolute = str(tmp_path / "elsewhere.yaml")
    argv = ["fit", "--config", absolute, "--config=nowhere.yaml", "--config", "default", "--seed", "default"]
    out = config_paths(argv, tmp_path)
    assert out[:4] == ["fit", "--config", absolute, "--config=nowhere.yaml"]
    assert out[5] == str(ROOT / "conf" / "default.yaml") and out[6:] == ["--seed", "default"]  # only --config's value
    shipped = str(ROOT / "conf" / "default.yaml")
    assert config_paths(["--config", "default"], tmp_path) == ["--config", shipped]  # a value from the first
    assert config_paths(["default", "--config"], tmp_path) == ["default", "--config"]  # the first is no value


def test_a_runs_status_names_what_its_exit_code_means():
    assert run_status(0) == "ok"
    assert run_status(2) == "FAILED (exit 2: bad input)" and run_status(3) == "FAILED (exit 3: training diverged)"
    assert run_status(-9) == "FAILED (exit -9: killed)" and run_status(1) == "FAILED (exit 1: error)"


@pytest.mark.parametrize("tty", [True, False])
def test_a_bar_is_drawn_on_a_terminal_only_and_never_for_nothing_to_run(tty, monkeypatch):
    from pfl.runner.sweep import RunProgress
    from tests.data.test_ecosystem_data import Terminal

    drawn = {}
    for total in (0, 1):
        terminal = Terminal(tty=tty)
        monkeypatch.setattr("sys.stderr", terminal)
        RunProgress(total, "sweep", 1).close()
        drawn[total] = terminal.text
    assert drawn[0] == ""  # an empty suite (every run reused) draws no 0/0 bar
    assert ("0/1" in drawn[1]) == tty and (drawn[1] == "") != tty


def test_the_eta_counts_the_queued_runs_on_the_workers_there_are():
    from pfl.runner.sweep import RunProgress

    for workers, eta in ((1, 20.0), (2, 10.0)):  # after a 10 s run, 2 runs queued: one after the other, or side by side
        progress = RunProgress(3, "sweep", workers)
        start = progress.started("a")
        progress.finished("a", "ok", 10.0)
        assert progress.eta_seconds(start) == eta
        progress.close()


def test_the_elapsed_time_counts_from_the_progress_start(monkeypatch, capsys):
    from pfl.runner.sweep import RunProgress

    now = [100.0]  # the clock does not start at 0
    monkeypatch.setattr("pfl.runner.sweep.time.perf_counter", lambda: now[0])
    progress = RunProgress(1, "sweep", 1)
    progress.started("a")
    now[0] = 165.0
    progress.finished("a", "ok", 65.0)
    progress.close()
    assert capsys.readouterr().out.splitlines() == ["[1/1] a: ok in 65 s (elapsed 01:05, ETA 00:00)"]


def test_the_bar_never_shows_a_new_eta_beside_the_old_count(monkeypatch):
    from pfl.runner.sweep import RunProgress
    from tests.data.test_ecosystem_data import Terminal

    now = [0.0]
    monkeypatch.setattr("pfl.runner.sweep.time.perf_counter", lambda: now[0])
    monkeypatch.setattr("tqdm.std.time", lambda: now[0])
    terminal = Terminal(tty=True)
    monkeypatch.setattr("sys.stderr", terminal)
    progress = RunProgress(2, "sweep", 1)
    progress.started("a")
    now[0] = 10.0
    progress.finished("a", "ok", 10.0)
    progress.close()
    frames = [f.strip() for f in terminal.text.split("\r") if f.strip()]
    assert frames[-1].endswith("1/2 [00:10, ETA 00:10]"), frames
    assert all("ETA ?" in f for f in frames if "0/2" in f), frames  # the ETA moves with the count


def test_a_busy_worker_takes_the_queued_runs_after_its_running_one():
    from pfl.runner.sweep import RunProgress

    progress = RunProgress(3, "sweep", 1)
    progress.started("a")
    progress.finished("a", "ok", 10.0)
    b = progress.started("b")  # the one worker is busy until b + 10; c can only start then
    assert progress.eta_seconds(b) == 20.0
    progress.close()
