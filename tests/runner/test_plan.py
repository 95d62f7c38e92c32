"""A run is validate -> plan -> build -> fit: the plan makes every data and resume check before anything
is built, the loop comes out of build_loop complete, and a checkpoint saves named parts, not the loop."""

from __future__ import annotations

import ast
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import pfl.runner.assembly as assembly
import pfl.runner.experiment as experiment
from pfl.data import build_data
from pfl.engine.stacked import net_problems
from pfl.errors import ConfigError
from pfl.federation.attacks import Attack
from pfl.federation.checkpoint import Checkpointer, RunState
from pfl.federation.dispatch import SequentialDispatcher
from pfl.federation.loop import Checkpointing, ProgressBar, comparable_metrics
from pfl.federation.progress import RunProgress
from pfl.models import ModelConfig, meta_model
from pfl.runner.args import parse_fit_args
from pfl.runner.assembly import build_loop
from pfl.runner.plan import plan_run
from tests.conftest import make_loop, tiny_config
from tests.helpers.cli_runs import fit

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_holds_every_derived_value_and_is_frozen():
    cfg = tiny_config("fedprox", client={"lr": 0.2, "lr_decay": 0.5}, trainer={"fraction": 0.5})
    plan = plan_run(cfg, build_data(cfg.data, cfg.seed))
    assert plan.clients_per_round == 3 and plan.settings.lr_at(2) == 0.2 * 0.25
    assert plan.robust_rule.kind == "mean" and plan.resume is None and not plan.finished and plan.start_round == 0
    assert plan.recorded["method.name"].endswith("FedProx") or plan.recorded["method.name"] == "fedprox"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.clients_per_round = 4  # type: ignore[misc]
    loop = build_loop(plan)
    assert loop.worker.settings is plan.settings and loop.server.clients_per_round == 3
    assert loop.checkpointer.settings == plan.recorded


def test_data_dependent_errors_come_from_the_plan_before_any_model(monkeypatch):
    built = []
    monkeypatch.setattr(assembly, "build_checked_model", lambda *a: built.append(a))
    cfg = tiny_config("fedavg", server={"aggregator": "krum", "krum_f": 2}, trainer={"clients_per_round": 3})
    with pytest.raises(ConfigError, match="server.krum_f"):
        plan_run(cfg, build_data(cfg.data, cfg.seed))
    cfg = tiny_config("fedavg", model={"name": "fedpg_cnn"})  # 8x8 digits: too small for its 5x5 convs
    with pytest.raises(ConfigError, match="model.name"):
        plan_run(cfg, build_data(cfg.data, cfg.seed))
    cfg = tiny_config("fedavg", eval={"target": 2.0})
    with pytest.raises(ConfigError, match="eval.target"):
        plan_run(cfg, build_data(cfg.data, cfg.seed))
    for cfg in (
        tiny_config("ditto", {"prox": "autograd"}, trainer={"vectorize": True}),
        tiny_config("fedavg", trainer={"vectorize": True, "precision": "16-mixed"}),
    ):
        with pytest.raises(ConfigError, match="trainer.vectorize"):
            plan_run(cfg, build_data(cfg.data, cfg.seed))
    assert built == []


def test_a_built_in_models_structure_is_read_on_the_meta_device():
    net = meta_model(ModelConfig(name="wrn28_10", depth=10, widen=1, dropout=0.3), (3, 8, 8), 10)
    assert net is not None and all(p.is_meta for p in net.parameters())
    assert net_problems(net) == []  # its dropout is keyed (pfl.models.dropout): it stacks
    assert meta_model(ModelConfig(name="tests.runner.test_plan:_user_builder"), (4,), 2) is None  # never called


def _user_builder(cfg, input_shape, num_classes):
    raise AssertionError("meta_model never calls a user builder")


def _dropout_builder(cfg, input_shape, num_classes):
    """A user's model whose structure refuses trainer.vectorize (dropout), known only once it is built."""
    return nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(int(np.prod(input_shape)), num_classes))


def test_vectorize_true_with_a_users_model_is_refused_by_the_plan_before_anything_is_built(tmp_path, monkeypatch):
    cfg = tiny_config(
        "fedavg",
        model={"name": "tests.runner.test_plan:_dropout_builder"},
        trainer={"vectorize": True},
        tracking={"root": str(tmp_path), "wandb": False},
    )
    built, loops = [], []
    monkeypatch.setattr(assembly, "build_checked_model", lambda *a: built.append(a))
    monkeypatch.setattr(experiment, "build_loop", lambda *a, **k: loops.append(a))
    state = torch.random.get_rng_state()
    with pytest.raises(ConfigError, match=r"^trainer.vectorize: the model has dropout"):
        plan_run(cfg, build_data(cfg.data, cfg.seed))
    assert torch.equal(torch.random.get_rng_state(), state)  # the plan's build drew nothing the run's would
    with pytest.raises(ConfigError, match=r"^trainer.vectorize: the model has dropout"):
        experiment.run_experiment(cfg)
    assert built == [] and loops == [] and list(tmp_path.iterdir()) == []  # no model, no loop, no run folder
    monkeypatch.undo()
    auto = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, vectorize="auto"))
    assert type(build_loop(plan_run(auto, build_data(cfg.data, cfg.seed))).dispatcher) is SequentialDispatcher


def test_a_resume_is_checked_and_read_by_the_plan(tmp_path, monkeypatch):
    assert fit(tmp_path, "r") == 0  # 2 rounds, finished
    run = tmp_path / "r"
    cfg = parse_fit_args(["--resume", str(run)])[0]
    data = build_data(cfg.data, cfg.seed)
    built = []
    monkeypatch.setattr(assembly, "build_checked_model", lambda *a: built.append(a))
    fewer = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, rounds=1))
    with pytest.raises(ConfigError, match="1 is fewer than the 2 rounds"):
        plan_run(fewer, data, resume_dir=run)
    edited = dataclasses.replace(cfg, client=dataclasses.replace(cfg.client, lr=0.5))
    with pytest.raises(ConfigError, match="sets client.lr to 0.5"):
        plan_run(edited, data, resume_dir=run)
    assert built == []  # refused before anything was built
    monkeypatch.undo()
    plan = plan_run(cfg, data, resume_dir=run)
    assert plan.finished and plan.start_round == 2
    more = plan_run(dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, rounds=3)), data, run)
    assert not more.finished and more.resume is not None
    loop = build_loop(more, run_dir=run)  # the checkpoint restored while the loop is built
    assert loop.round == 2 and [row["round"] for row in loop.history] == [1, 2]
    assert loop.checkpointer.chain is more.resume.chain  # the next link extends the chain that was read


def test_the_loop_comes_out_of_build_loop_complete(tmp_path):
    cfg = tiny_config("fedavg", attack={"kind": "scale", "fraction": 0.34})
    reference = {"method": "local", "values": [0.5] * 6}
    loop = build_loop(plan_run(cfg, build_data(cfg.data, cfg.seed)), run_dir=tmp_path, reference=reference)
    attack = next(t for t in loop.transforms if isinstance(t, Attack))
    assert loop.evals.reference is reference and loop.evals.malicious == attack.malicious != frozenset()
    server = loop.server  # constructed complete: the evaluators are the worker's
    assert server.evaluator is not None and server.client_loss is not None and server.state
    assert server.val_evaluator is None  # no client holds a validation split (data.val_frac 0)
    assert loop.checkpointer.run_dir == tmp_path
    assert [type(cb) for cb in loop.callbacks] == [Checkpointing]  # trainer.progress false: no bar
    shown = tiny_config("fedavg", trainer={"progress": True})
    assert isinstance(make_loop(shown).callbacks[-1], ProgressBar)
    assert not any(isinstance(cb, Checkpointing) for cb in make_loop(shown).callbacks)  # no run_dir: none


def _assigned_attributes(path: Path, names: set[str]) -> list[str]:
    """``name.attr... = value`` statements in ``path`` whose target starts at one of ``names``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        )
        for target in targets:
            base = target
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(target, ast.Attribute) and isinstance(base, ast.Name) and base.id in names:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_caller_sets_an_attribute_of_a_built_loop():
    callers = [ROOT / "pfl/runner/experiment.py", ROOT / "pfl/runner/reference.py", ROOT / "pfl/api/models.py"]
    assert [hit for p in callers for hit in _assigned_attributes(p, {"loop"})] == []
    # The loop never rewrites the settings: the rate of a round is read from them (TrainSettings.lr_at).
    assert "settings" not in (ROOT / "pfl/federation/loop.py").read_text().replace("settings=", "")


def test_the_progress_is_one_state_that_round_trips():
    progress = RunProgress(3, [{"round": 3, "x": 1.0}], [{"client": 0}], 120, 1.5)
    again = RunProgress()
    again.load_state_dict(progress.state_dict())
    assert again == progress
    again.load_state_dict({k: v for k, v in progress.state_dict().items() if k != "client_rows"})
    assert again.client_rows == []  # a checkpoint written before any evaluation


def test_the_checkpointer_saves_and_restores_the_parts_it_is_given(tmp_path):
    loop = make_loop(tiny_config("ditto", trainer={"rounds": 2}), run_dir=tmp_path)
    loop.fit()
    other = make_loop(tiny_config("ditto", trainer={"rounds": 2}))
    progress = RunProgress()
    state = RunState(progress, other.server, other.clients, other.evals, other.worker.device)
    checkpointer = Checkpointer(run_dir=None, state=state)
    assert checkpointer.resume(tmp_path)
    assert progress == loop.progress and other.round == 0  # only the parts it was given
    assert torch.equal(other.server["global"], loop.server["global"]) and other.server.round == 2
    assert torch.equal(other.clients[1]["personal"], loop.clients[1]["personal"])
    with pytest.raises(RuntimeError, match="no run state"):
        Checkpointer(run_dir=tmp_path / "elsewhere").save()


@pytest.fixture
def one_thread():
    """Torch on one thread, as a run trains by default (trainer.threads): the stored run's sums were made so."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_a_checkpoint_of_the_earlier_loop_still_resumes(tmp_path, one_thread):
    """A run folder written before the run state was split from the loop (2 of ditto's rounds; the
    file layout is unchanged) resumes with exactly the state it stored, and its third round is the
    uninterrupted run's. The folder's rounds were summed on the machine that wrote it: another CPU's
    kernels round differently (by about 1e-7 on an AMD EPYC), so the runs agree to float rounding there,
    while a state restored wrongly (a client's model or the global one missing) is off by far more."""
    run = tmp_path / "old"
    shutil.copytree(ROOT / "tests/data/run_before_run_state", run)
    stored = torch.load(run / "checkpoint.pt", weights_only=True, map_location="cpu")
    argv = ["--resume", str(run), "--trainer.rounds", "3", "--tracking.root", str(tmp_path)]
    cfg = parse_fit_args(argv)[0]
    data = build_data(cfg.data, cfg.seed)
    plan = plan_run(cfg, data, resume_dir=run)
    assert plan.start_round == 2 and not plan.finished
    resumed = build_loop(plan, run_dir=run)
    assert [row["round"] for row in resumed.history] == [1, 2] and resumed.progress.train_samples > 0
    assert torch.equal(resumed.server["global"], stored["server"]["global"])  # exactly what was stored
    assert sorted(resumed.clients.keys()) == sorted(stored["clients"]) == [0, 1, 2, 3]
    straight = build_loop(plan_run(cfg, data))
    got, expected = comparable_metrics(resumed.fit()), comparable_metrics(straight.fit())
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(resumed.server["global"], straight.server["global"], rtol=0, atol=1e-5)
