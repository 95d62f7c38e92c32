"""A user's own classes in the Python API and the command line: a method without a ``name``, a method whose
``__init__`` refuses its arguments, Method / nn.Module classes and instances given to ``pfl.fit``, FedRoD on
a user's Sequential subclass, the trained models read back (``Run.model()``, ``Run.personal_model``)."""

from __future__ import annotations

import importlib
import importlib.abc
import math
import random
import subprocess
import sys

import pytest
import torch
from torch import nn

import pfl
from pfl.api.overrides import to_argv
from pfl.cli import main
from pfl.config import ServerConfig
from pfl.data import build_data
from pfl.errors import ConfigError
from pfl.federation.robust import RobustRule
from pfl.methods import ClientContext, Method, ServerContext, State, Upload, weighted_mean_of
from pfl.methods.base import MethodFlagWarning
from pfl.methods.ditto import Ditto
from pfl.runner.args import parse_fit_args
from pfl.runner.wandb_run import run_identity
from tests.api.helpers import ROOT, tiny_fit

HERE = __name__  # the import path of the classes below


# A user who overrides aggregate without stating averages_uploads is told that it was set for them
# (False: robust aggregators refuse the method, as a test below checks).
with pytest.warns(MethodFlagWarning, match="Pull overrides aggregate without stating averages_uploads"):

    class Pull(Method):
        """FedAvg written as a user would, without a ``name``."""

        has_personal_model = False

        def __init__(self, mu: float = 0.0):
            if mu > 1:
                raise ValueError(f"mu must be at most 1, got {mu}")
            self.mu = mu

        def init_server(self, server: ServerContext) -> State:
            return {"global": server.init_state.clone()}

        def payload(self, server: ServerContext, cid: int) -> State:
            return {"global": server["global"]}

        def local_update(self, client: ClientContext, payload: State) -> Upload:
            return Upload(client.fit(payload["global"]), client.num_samples)

        def aggregate(self, server: ServerContext, uploads: dict[int, Upload]) -> None:
            server["global"] = weighted_mean_of(uploads)


class PullAgain(Pull):
    """A subclass of an unnamed class: named after itself, not after its parent."""


class Buggy(Pull):
    def __init__(self, mu: float = 0.0):
        raise RuntimeError("a bug in the method's own code")


class MyDitto(Ditto):
    """A subclass of a named method keeps its parent's name."""


class MyNet(nn.Sequential):
    """docs/models.md's shape: an nn.Sequential subclass built from (input_shape, num_classes)."""

    def __init__(self, input_shape, num_classes, width: int = 6):
        super().__init__(
            nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(), nn.Linear(width, num_classes)
        )
        self.width = width


class Flexible(nn.Sequential):
    def __init__(self, input_shape, num_classes, *layers, depth: int = 1, **options):
        super().__init__(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
        self.depth = depth


class Unstored(nn.Sequential):
    def __init__(self, input_shape, num_classes, width: int = 6):
        super().__init__(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


class UnstoredPull(Pull):
    """Keeps its argument under another name: an instance cannot say what it was built with."""

    def __init__(self, strength: float = 0.0):
        super().__init__()
        self._strength = strength


def test_a_method_instance_that_does_not_store_an_argument_is_refused_not_run_with_its_default():
    with pytest.raises(ConfigError, match="method: the UnstoredPull instance does not store its argument 'strength'"):
        to_argv(None, {"method": UnstoredPull(strength=0.5)})
    assert to_argv(None, {"method": UnstoredPull}) == ["--method.class_path", f"{HERE}.UnstoredPull"]  # the class
    assert Ditto.option_names()[:2] == ["lam", "personal_epochs"] and "lam" in Ditto(lam=0.3).hparams()


def test_a_method_without_a_name_is_named_after_its_class():
    assert (Pull.name, PullAgain.name, Buggy.name) == ("pull", "pullagain", "buggy")
    assert MyDitto.name == "ditto" and Method.name == ""


def test_an_unnamed_methods_run_folder_summary_and_wandb_tags_carry_its_name(tmp_path):
    run = pfl.fit(
        str(ROOT / "conf" / "default.yaml"),
        method=Pull,
        model=MyNet(input_shape=(64,), num_classes=10, width=5),  # an instance: its class and width
        data={"num_clients": 5},
        trainer={"rounds": 1, "eval_every": 1, "progress": False},
        tracking={"wandb": False, "root": str(tmp_path)},
    )
    assert run.path.name.startswith("pull-digits-s0-") and run.summary["method"] == "pull"
    assert run.config["method"]["name"] == f"{HERE}.Pull" and run.config["model"]["init_args"] == {"width": 5}
    cfg = parse_fit_args(["--config", str(run.path / "config.yaml")])[0]
    assert run_identity(cfg, run.path, resume=False).tags[0] == "pull"
    assert main(["report", str(run.path)]) == 0  # the folder's name is not read as an option


def test_method_and_model_classes_and_instances_become_the_config_form():
    argv = to_argv(None, {"method": Pull(mu=0.25), "model": MyNet((64,), 10, width=3)})
    assert argv == [
        "--method.class_path", f"{HERE}.Pull", "--method.init_args.mu", "0.25",
        "--model.class_path", f"{HERE}.MyNet", "--model.init_args", '{"width": 3}',
    ]  # fmt: skip
    cfg = parse_fit_args([*argv, "--tracking.wandb", "false"])[0]
    assert type(cfg.method) is Pull and cfg.method.mu == 0.25
    assert cfg.model.name == f"{HERE}.MyNet" and cfg.model.init_args == {"width": 3}
    assert to_argv(None, {"method": Pull, "model": MyNet}) == [
        "--method.class_path", f"{HERE}.Pull", "--model.class_path", f"{HERE}.MyNet"
    ]  # fmt: skip
    given = {"method": "ditto", "model": {"name": "cnn"}, "seed": 1}  # names and groups pass as they are
    assert to_argv(None, given) == ["--method", "ditto", "--model.name", "cnn", "--seed", "1"]
    with pytest.raises(ConfigError, match="model: the Unstored instance does not store its argument 'width'"):
        to_argv(None, {"model": Unstored((64,), 10)})
    for torch_layer in (nn.Sequential, nn.Sequential(nn.Linear(64, 10))):
        with pytest.raises(ConfigError, match="model: Sequential is torch's own layer"):
            to_argv(None, {"model": torch_layer})

    assert to_argv(None, {"model": Flexible((64,), 10, depth=3)})[-1] == '{"depth": 3}'  # past *layers, not **options
    with pytest.raises(ConfigError, match="model: .* is no config value"):
        to_argv(None, {"model": Pull})  # a class, but no nn.Module
    Moved = type("Moved", (Pull,), {"__module__": "no_such_module"})
    with pytest.raises(ConfigError, match="method: Moved cannot be imported as no_such_module.Moved"):
        to_argv(None, {"method": Moved})

    class Local(Pull):
        pass

    with pytest.raises(ConfigError, match="method: .*Local cannot be imported as .*define the class at the top level"):
        to_argv(None, {"method": Local})


def test_a_users_method_refusing_its_arguments_is_one_line_naming_the_class(capsys):
    with pytest.raises(
        ConfigError, match=rf"^method: {HERE}.Pull.__init__ raised ValueError: mu must be at most 1, got 5"
    ) as err:
        pfl.fit(method=Pull, **{"method.mu": 5, "tracking.wandb": False})
    assert isinstance(err.value.__cause__, ValueError)  # the original, for a traceback from Python
    rc = main(["fit", "--method", f"{HERE}.Pull", "--method.mu", "5", "--tracking.wandb", "false"])
    stderr = capsys.readouterr().err
    assert rc == 2 and stderr.count("\n") == 1 and "Pull.__init__ raised ValueError: mu must be at most 1" in stderr
    with pytest.raises(RuntimeError, match="a bug in the method's own code"):  # not a config problem: kept
        pfl.fit(method=Buggy, **{"tracking.wandb": False})


def test_a_robust_aggregator_refusing_a_users_method_names_averages_uploads():
    with pytest.raises(ConfigError, match="server.aggregator: median cannot apply to method 'pull'") as err:
        RobustRule.build(ServerConfig(aggregator="median"), Pull(), 5)
    assert "averages_uploads = True" in str(err.value)


def test_fedrod_on_a_users_sequential_subclass_and_its_trained_models_read_back(tmp_path):
    run = tiny_fit(tmp_path, "rod", method="fedrod", model=MyNet)
    cfg = parse_fit_args(["--config", str(run.path / "config.yaml")])[0]
    data = build_data(cfg.data, cfg.seed)
    before = torch.get_rng_state()
    net = run.model()
    assert torch.equal(torch.get_rng_state(), before)  # rebuilding the run leaves the caller's draws alone
    assert type(net) is MyNet and not net.training and all(p.device.type == "cpu" for p in net.parameters())

    def accuracy(model: nn.Module, idx: torch.Tensor) -> float:
        with torch.no_grad():
            return float((model(data.x[idx]).argmax(1) == data.y[idx]).float().mean())

    assert accuracy(net, data.global_test) == pytest.approx(run.summary["metrics"]["gm.acc"], abs=1e-6)
    gaps = (run.clients["pm.l_acc"] - run.clients["gm.l_acc"]).abs()
    row = run.clients.loc[gaps.idxmax()]  # a client trained in some round: its P-model is not the global one
    assert row["pm.l_acc"] != row["gm.l_acc"]
    cid = int(row["client"])
    personal = run.personal_model(cid)
    assert accuracy(personal, data.clients[cid].test) == pytest.approx(row["pm.l_acc"], abs=1e-6)
    assert not torch.equal(personal[3].bias, net[3].bias)  # FedRoD's P-model adds the client's own head
    n = data.num_clients
    for wrong in (n, -1, "0"):
        with pytest.raises(ConfigError, match=rf"cid: must be a client id in \[0, {n - 1}\], got {wrong!r}"):
            run.personal_model(wrong)
    assert type(run.personal_model(0)) is MyNet  # the first client is one


def test_a_run_without_checkpoints_has_no_trained_model_to_read_back(tmp_path):
    run = tiny_fit(tmp_path, "none", **{"trainer.checkpoint_every": 0})
    with pytest.raises(ConfigError, match=r"has no checkpoint to read the trained models from.*checkpoint_every >= 1"):
        run.model()


class _DrawsOnImport(importlib.abc.MetaPathFinder):
    """Draws from Python's generator when ``pfl.api.fit`` is imported, as importing Lightning does."""

    def find_spec(self, name, path=None, target=None):
        if name == "pfl.api.fit":
            random.random()
        return None  # the usual finders import it


def test_importing_pfl_api_leaves_pythons_random_draws_alone(monkeypatch):
    import pfl.api

    monkeypatch.setattr(pfl, "api", pfl.api)
    for name in ("pfl.api", "pfl.api.fit"):
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_DrawsOnImport(), *sys.meta_path])
    random.seed(3)
    expected = random.random()
    random.seed(3)
    importlib.import_module("pfl.api")
    assert random.random() == expected


def test_the_first_access_of_pfl_fit_leaves_pythons_random_draws_alone():
    code = (
        "import random; random.seed(3); expected = random.random(); random.seed(3)\n"
        "import pfl; pfl.fit\n"
        "assert random.random() == expected, 'importing pfl.fit drew from random'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_relative_config_path_is_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = ROOT / "conf" / "default.yaml"
    for given in ("conf/default.yaml", "default.yaml", "default"):
        assert to_argv(given, {}) == ["--config", str(shipped)]
    assert to_argv("method/ditto", {}) == ["--config", str(ROOT / "conf" / "method" / "ditto.yaml")]
    (tmp_path / "default.yaml").write_text("seed: 3\n")
    assert to_argv("default.yaml", {}) == ["--config", "default.yaml"]  # the caller's own file first
    assert to_argv("nowhere.yaml", {}) == ["--config", "nowhere.yaml"]  # the parser says it is not found
