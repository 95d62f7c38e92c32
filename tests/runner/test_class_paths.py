"""Lightning's class_path / init_args form of method: and model:, next to pfl's own short forms."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from omegaconf import OmegaConf

from pfl.cli import main
from pfl.errors import ConfigError
from pfl.methods.ditto import Ditto
from pfl.runner.args import parse_fit_args
from pfl.runner.class_paths import expand_arg, rewrite_arg, rewrite_config

TINY = ["--data.num_clients", "5", "--trainer.rounds", "2", "--model.hidden", "[16]", "--tracking.wandb", "false"]


def parsed(tmp_path, text: str | None = None, *args: str):
    argv = list(TINY)
    if text is not None:
        path = tmp_path / "c.yaml"
        path.write_text(textwrap.dedent(text))
        argv += ["--config", str(path)]
    cfg, ns, parser, _ = parse_fit_args([*argv, *args])
    return cfg, yaml.safe_load(parser.dump(ns))


def test_yaml_class_path_is_the_short_form(tmp_path):
    cfg, dumped = parsed(tmp_path, "method:\n  class_path: pfl.methods.ditto.Ditto\n  init_args:\n    lam: 0.3\n")
    short_cfg, short = parsed(tmp_path, "method:\n  name: ditto\n  lam: 0.3\n")
    assert type(cfg.method) is Ditto and cfg.method.lam == 0.3
    assert dumped == short and dumped["method"]["name"] == "ditto"  # config.yaml: the registered name
    assert cfg.method.hparams() == short_cfg.method.hparams()


@pytest.mark.parametrize(
    "args",
    [
        ["--method.class_path", "pfl.methods.ditto.Ditto", "--method.init_args.lam", "0.3"],
        ["--method.class_path=pfl.methods.ditto.Ditto", "--method.init_args.lam=0.3"],
        ["method.class_path=pfl.methods.ditto.Ditto", "method.init_args.lam=0.3"],  # Hydra / W&B style
        ["--method", '{"class_path": "pfl.methods.ditto.Ditto", "init_args": {"lam": 0.3}}'],
        ["--method={class_path: pfl.methods.ditto.Ditto, init_args: {lam: 0.3}}"],
        ["--method", "ditto", "--method.init_args", "{lam: 0.3}"],
        ["--method.init_args={lam: 0.3}", "--method", "{name: ditto}"],
        ["--method", "ditto", "--method.lam", "0.3"],
    ],
)
def test_command_line_forms(tmp_path, args):
    cfg, dumped = parsed(tmp_path, None, *args)
    assert type(cfg.method) is Ditto and cfg.method.lam == 0.3
    assert dumped["method"]["name"] == "ditto"


def test_command_line_overrides_a_class_path_file(tmp_path):
    text = "method:\n  class_path: pfl.methods.fedprox.FedProx\n  init_args:\n    mu: 0.2\n"
    cfg, _ = parsed(tmp_path, text, "--method.init_args.mu", "0.05")
    assert cfg.method.name == "fedprox" and cfg.method.mu == 0.05
    cfg, _ = parsed(tmp_path, "method:\n  class_path: pfl.methods.fedprox.FedProx\n", "--method.class_path", "ditto")
    assert type(cfg.method) is Ditto  # a later choice of method wins, as with --method


def test_print_config_round_trips(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("method:\n  class_path: pfl.methods.ditto.Ditto\n  init_args:\n    lam: 0.3\n")
    with pytest.raises(SystemExit):
        main(["fit", *TINY, "--config", str(path), "--print_config"])
    first = capsys.readouterr().out
    assert yaml.safe_load(first)["method"]["lam"] == 0.3
    (tmp_path / "printed.yaml").write_text(first)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(tmp_path / "printed.yaml"), "--print_config"])
    assert capsys.readouterr().out == first


def test_a_users_own_method_class(tmp_path, monkeypatch):
    (tmp_path / "my_methods.py").write_text(
        textwrap.dedent(
            """
            from pfl.methods.fedavg import FedAvg

            class Shrunk(FedAvg):
                name = "shrunk"

                def __init__(self, shrink: float = 1.0, **kwargs):
                    super().__init__(**kwargs)
                    self.shrink = shrink
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = "method:\n  class_path: my_methods.Shrunk\n  init_args:\n    shrink: 0.5\n"
    cfg, dumped = parsed(tmp_path, text)
    assert type(cfg.method).__name__ == "Shrunk" and cfg.method.shrink == 0.5
    assert dumped["method"]["name"] == "my_methods.Shrunk"  # not registered: recorded by its import path
    cfg, _ = parsed(tmp_path, None, "--method.class_path", "my_methods.Shrunk", "--method.init_args.shrink", "0.25")
    assert cfg.method.shrink == 0.25


@pytest.mark.parametrize(
    ("text", "args", "field", "hint"),
    [
        ("method:\n  class_path: collections.OrderedDict\n", [], "method.class_path", "not a subclass"),
        (None, ["--method.class_path", "collections.OrderedDict"], "method.class_path", "not a subclass"),
        (None, ["--method.class_path", "nowhere.Nothing"], "method.class_path", "cannot import"),
        ("method:\n  class_path: pfl.methods.ditto.Ditto\n  name: ditto\n", [], "method.class_path", "one of them"),
        ("method:\n  class_path: pfl.methods.ditto.Ditto\n  init_args: 3\n", [], "method.init_args", "mapping"),
        ("method:\n  lam: 0.1\n  init_args:\n    lam: 0.3\n", [], "method.init_args.lam", "once"),
        (
            None,
            ["--method.class_path", "pfl.methods.ditto.Ditto", "--method.init_args.mu", "1"],
            "method.mu",
            "unrecognized",
        ),
        ("model:\n  class_path: a.B\n  name: mlp\n", [], "model.class_path", "one of them"),
        ("model:\n  name: mlp\n  init_args:\n    width: 3\n", [], "model.init_args", "built-in"),
    ],
)
def test_bad_class_path_input(tmp_path, text, args, field, hint):
    with pytest.raises(ConfigError) as err:
        parsed(tmp_path, text, *args)
    assert field in str(err.value) and hint in str(err.value), err.value


def test_rewrite_arg_leaves_other_options_alone():
    assert rewrite_arg("--method.lam", "0.3") is None
    assert rewrite_arg("--model.name", "mlp") is None
    assert rewrite_arg("--method.class_path", None) is None  # no value: the parser reports it
    assert rewrite_arg("--model.class_path=a.B", None) == ("--model.name=a.B", None)
    assert rewrite_arg("--model.class_path", "a.B") == ("--model.name", "a.B")
    assert rewrite_arg("--method.init_args.lam", "1") == ("--method.lam", "1")
    assert rewrite_arg("--method.init_args.lam=1", None) == ("--method.lam=1", None)


def test_model_class_path_in_a_file_and_on_the_command_line(tmp_path):
    text = "model:\n  class_path: my_nets.Wide\n  init_args:\n    width: 7\n  hidden: [8]\n"
    cfg, dumped = parsed(tmp_path, text)
    assert (cfg.model.name, cfg.model.init_args, cfg.model.hidden) == ("my_nets.Wide", {"width": 7}, [8])
    assert dumped["model"]["name"] == "my_nets.Wide" and "class_path" not in dumped["model"]
    cfg, _ = parsed(tmp_path, None, "--model.class_path", "my_nets.Wide", "--model.init_args.width", "3")
    assert (cfg.model.name, cfg.model.init_args) == ("my_nets.Wide", {"width": 3})
    cfg, _ = parsed(tmp_path, None, "--model", "{class_path: my_nets.Wide, init_args: {width: 5}, hidden: [4]}")
    assert (cfg.model.name, cfg.model.init_args, cfg.model.hidden) == ("my_nets.Wide", {"width": 5}, [4])


def test_a_file_without_the_class_path_form_is_read_as_it_is():
    assert rewrite_config(OmegaConf.create({"method": {"name": "ditto", "lam": 0.3}, "model": {"name": "mlp"}})) is None
    assert rewrite_config(OmegaConf.create({"method": "ditto"})) is None


def test_expand_arg_takes_only_a_mapping_given_to_method_or_model():
    assert expand_arg("--method", "ditto") is None  # the --method NAME shorthand
    assert expand_arg("--method", None) is None
    assert expand_arg("--trainer", "{rounds: 3}") is None  # other groups: jsonargparse reads them itself
    assert expand_arg("--method", "{lam: [0.3") is None  # not YAML: the parser reports the value
    assert expand_arg("--method", " {name: ditto}") == (["--method.name", "ditto"], 2)
    assert expand_arg("--model={init_args: {w: 2}}", None) == (["--model.init_args", '{"w": 2}'], 1)
