"""pfl from Python: fit (the CLI's path, raised errors, no state left behind), load, compare."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import pfl
from pfl.api.overrides import to_argv
from pfl.errors import ConfigError
from pfl.federation.loop import comparable_metrics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "conf" / "default.yaml")
TINY = {
    "data": {"num_clients": 5},
    "trainer": {"rounds": 2, "eval_every": 1, "progress": False},
    "model": {"hidden": [16]},
    "tracking": {"wandb": False},
}


def tiny_fit(tmp_path: Path, name: str, **overrides) -> pfl.Run:
    tracking = {**TINY["tracking"], "root": str(tmp_path), "name": name}
    return pfl.fit(CONFIG, **{**TINY, "tracking": tracking, **overrides})


# -- fit ------------------------------------------------------------------------------------------
def test_two_fits_in_one_process_equal_two_command_line_runs(tmp_path):
    ditto = tiny_fit(tmp_path, "a", method="ditto", **{"method.lam": 0.5})
    fedavg = tiny_fit(tmp_path, "b", method={"class_path": "pfl.methods.fedavg.FedAvg"}, seed=3)
    argv = [sys.executable, "-m", "pfl", "fit", *to_argv(CONFIG, TINY)]
    for run, extra in ((ditto, ["--method", "ditto", "--method.lam", "0.5"]), (fedavg, ["--seed", "3"])):
        name = f"cli-{run.path.name}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
        out = subprocess.run(
            [*argv, *extra, "--tracking.root", str(tmp_path), "--tracking.name", name],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        cli = json.loads((tmp_path / name / "summary.json").read_text())
        assert comparable_metrics(run.summary) == comparable_metrics(cli)
        assert (run.path / "config.yaml").read_text() == (tmp_path / name / "config.yaml").read_text().replace(
            f"name: {name}", f"name: {run.path.name}"
        )


def test_fit_leaves_no_global_state_behind(tmp_path):
    torch.set_num_threads(2)  # a run sets trainer.threads (1)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    warnings.filterwarnings("ignore", message="a marker filter")
    filters = list(warnings.filters)
    try:
        run = tiny_fit(tmp_path, "r")
        assert torch.get_num_threads() == 2
        assert list(warnings.filters) == filters
        after = (torch.rand(3), np.random.rand(3), random.random())
        assert torch.equal(after[0], expected[0]) and np.array_equal(after[1], expected[1])
        assert after[2] == expected[2]
    finally:
        warnings.filters.remove(filters[0])
        torch.set_num_threads(1)
    assert run.summary["rounds"] == 2


def test_resume_from_python(tmp_path):
    run = tiny_fit(tmp_path, "r")
    resumed = pfl.fit(resume=run.path, **{"trainer.rounds": 3})  # --resume DIR --trainer.rounds 3
    assert resumed.path == run.path and list(resumed.metrics["round"]) == [1, 2, 3]
    with pytest.raises(ConfigError, match="--resume: .* may not change client.lr"):
        pfl.fit(resume=run.path, client={"lr": 0.5})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA generators exist only on a GPU")
def test_fit_restores_the_cuda_rng(tmp_path):
    torch.cuda.init()
    torch.cuda.manual_seed_all(7)
    expected = torch.rand(3, device="cuda")
    torch.cuda.manual_seed_all(7)
    tiny_fit(tmp_path, "r", **{"trainer.accelerator": "cuda"})  # the run seeds the CUDA generators too
    assert torch.equal(torch.rand(3, device="cuda"), expected)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"trainer": {"fraction": 1.5}}, "trainer.fraction"),
        ({"trainer.fraction": 0}, "trainer.fraction"),
        ({"trainer.nope": 1}, "unrecognized"),
        ({"trainer": {"rounds": "many"}}, "trainer.rounds"),
        ({"method": "fedfoo"}, "method.name"),
        ({"method": {"class_path": "collections.OrderedDict"}}, "method.class_path"),
        ({"print_config": True}, "print_config"),
        ({"help": True}, "help"),
        ({"seed": object()}, "seed"),
    ],
)
def test_bad_input_raises_config_error_before_anything_is_written(tmp_path, overrides, field):
    with pytest.raises(ConfigError) as err:  # raised, not a SystemExit
        tiny_fit(tmp_path, "r", **overrides)
    assert field in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "r").exists()


def test_a_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--config: file not found: nope.yaml"):
        pfl.fit("nope.yaml")
    with pytest.raises(ConfigError, match="config: expected a path"):
        pfl.fit([CONFIG, 3])


def test_overrides_are_the_command_lines_arguments():
    assert to_argv(None, {"trainer": {"rounds": 20, "fraction": 0.5}}) == to_argv(
        None, {"trainer.rounds": 20, "trainer.fraction": 0.5}
    )
    argv = to_argv(
        ["a.yaml", Path("b.yaml")],
        {"method": {"name": "ditto", "lam": 1e-5}, "model": {"hidden": [8, 8], "init_args": {"w": 2}}, "seed": 1},
    )
    assert argv == [
        "--config", "a.yaml", "--config", "b.yaml", "--method.name", "ditto", "--method.lam", "1e-05",
        "--model.hidden", "[8, 8]", "--model.init_args", '{"w": 2}', "--seed", "1",
    ]  # fmt: skip
    assert to_argv("a.yaml", {"method": "ditto"}) == ["--config", "a.yaml", "--method", "ditto"]
    texts = [to_argv(None, {"k": v})[1] for v in (True, False, None, float("inf"), -float("inf"), float("nan"))]
    assert texts == ["true", "false", "null", ".inf", "-.inf", ".nan"]
    assert to_argv(None, {"tracking.root": Path("x/y")}) == ["--tracking.root", "x/y"]
    with pytest.raises(ConfigError, match="not an option name"):
        to_argv(None, {"trainer": {1: 2}})
    with pytest.raises(ConfigError, match=r"model.hidden: \[nan\] is no config value"):
        to_argv(None, {"model": {"hidden": [float("nan")]}})  # YAML has no JSON NaN: refused, not mistyped


def test_a_users_model_class_with_init_args(tmp_path, monkeypatch):
    (tmp_path / "my_nets.py").write_text(
        textwrap.dedent(
            """
            import math
            from torch import nn

            class Wide(nn.Sequential):
                def __init__(self, input_shape, num_classes, width=4):
                    super().__init__(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
                                     nn.Linear(width, num_classes))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = {"class_path": "my_nets.Wide", "init_args": {"width": 7}}
    run = tiny_fit(tmp_path, "r", model=model)
    assert run.config["model"]["name"] == "my_nets.Wide" and run.config["model"]["init_args"] == {"width": 7}
    parameters = (64 * 7 + 7) + (7 * 10 + 10)  # digits: 8x8 inputs, 10 classes
    # FedAvg uploads the whole model: 2 of the 5 clients per round (fraction 0.5), float32
    assert run.summary["metrics"]["comm.up_bytes.per_round"] == 2 * parameters * 4
    with pytest.raises(ConfigError, match="model.init_args: my_nets.Wide cannot be called"):
        tiny_fit(tmp_path, "bad", model={"class_path": "my_nets.Wide", "init_args": {"depth": 2}})


# -- load -----------------------------------------------------------------------------------------
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


# -- compare --------------------------------------------------------------------------------------
def test_compare_is_the_reports_table(tmp_path):
    runs = [
        pfl.load(write_run(tmp_path / "d0", 0, "ditto", 0.6)),
        write_run(tmp_path / "d1", 1, "ditto", 0.8),  # a path works as well as a Run
        pfl.load(write_run(tmp_path / "f0", 0, "fedavg", 0.5)),
    ]
    table = pfl.compare(runs)
    assert list(table["method"]) == ["ditto", "fedavg"] and list(table["n"]) == [2, 1]
    assert table["pm.l_acc"].tolist() == pytest.approx([0.7, 0.5])
    assert table["pm.l_acc_std"][0] == pytest.approx(np.std([0.6, 0.8], ddof=1))
    assert table["pm.l_acc_best"].tolist() == [1, 0] and table["gm.acc"].tolist() == pytest.approx([0.35, 0.25])
    per_run = pfl.compare(runs, metrics=["gm.acc"], per_run=True)
    assert len(per_run) == 3 and per_run["seed"].tolist() == [0, 1, 0] and "pm.l_acc" not in per_run
    with pytest.raises(ConfigError, match="runs: is empty"):
        pfl.compare([])
    lr = pfl.compare([runs[0], write_run(tmp_path / "d2", 2, "ditto", 0.9, lr=0.01)])
    assert lr["client.lr"].tolist() == [0.1, 0.01]  # told apart by their config.yaml, not only their summary


# -- import -----------------------------------------------------------------------------------------
def test_import_pfl_stays_light_and_exports_the_api():
    code = "import sys, pfl; assert 'torch' not in sys.modules; print(sorted(pfl.__all__))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['Run',", "'compare',", "'fit',", "'load']"]
    from pfl.api import Run, compare, fit, load

    assert (pfl.fit, pfl.load, pfl.compare, pfl.Run) == (fit, load, compare, Run)
    assert {"fit", "load", "compare", "Run"} <= set(dir(pfl))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = pfl.nope
