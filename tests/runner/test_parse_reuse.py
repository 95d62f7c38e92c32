"""What a fit parse keeps for the next one (a suite or sweep parses hundreds of runs): the parser's defaults,
worked out once, and what a config file names, read once per text; and what a resume's parse reads once."""

from __future__ import annotations

import jsonargparse
import pytest
import yaml

from pfl.errors import ConfigError
from pfl.runner import args, method_choice
from pfl.runner.args import build_fit_parser, default_config
from pfl.runner.method_choice import method_from_argv, method_in_file


def test_a_fit_parser_works_its_defaults_out_once_and_again_after_a_default_is_set(monkeypatch):
    calls = []
    jsonargparse_defaults = jsonargparse.ArgumentParser.get_defaults

    def counted(self, *args, **kwargs):
        calls.append(1)
        return jsonargparse_defaults(self, *args, **kwargs)

    monkeypatch.setattr(jsonargparse.ArgumentParser, "get_defaults", counted)
    parser = build_fit_parser("ditto")
    first, second = parser.parse_args([]), parser.parse_args(["--client.lr", "0.2"])
    assert len(calls) == 1 and (first.client.lr, second.client.lr) == (0.05, 0.2)
    defaults = parser.get_defaults()
    defaults.client.lr = 9.0  # a copy: the parser's own are untouched
    assert parser.parse_args([]).client.lr == 0.05 and len(calls) == 1
    parser.set_defaults({"client.lr": 0.5})
    assert parser.parse_args([]).client.lr == 0.5 and parser.get_defaults().client.lr == 0.5 and len(calls) == 2


def test_a_config_file_is_read_once_per_text_and_again_when_it_changes(tmp_path, monkeypatch):
    loads = []
    load_yaml = method_choice.load_yaml
    monkeypatch.setattr(method_choice, "load_yaml", lambda path, text: loads.append(path) or load_yaml(path, text))
    mine = tmp_path / "mine.yaml"
    mine.write_text("method: ditto\n")
    assert method_from_argv(["--config", str(mine)])[0] == "ditto"
    assert method_from_argv(["--config", str(mine), "--seed", "1"])[0] == "ditto" and len(loads) == 1
    mine.write_text("method: local\n")  # the same size: the text, not the file's size or age, tells
    assert method_from_argv(["--config", str(mine)])[0] == "local" and len(loads) == 2
    mine.write_text("method: ditto\n")
    assert method_in_file(mine) == ("ditto", None) and len(loads) == 2


def test_a_config_file_naming_its_method_through_the_environment_follows_it(tmp_path, monkeypatch):
    mine = tmp_path / "mine.yaml"
    mine.write_text("method:\n  name: ${oc.env:PFL_TEST_METHOD}\n")
    monkeypatch.setenv("PFL_TEST_METHOD", "ditto")
    assert method_from_argv(["--config", str(mine)])[0] == "ditto"
    monkeypatch.setenv("PFL_TEST_METHOD", "local")
    assert method_from_argv(["--config", str(mine)])[0] == "local"


def test_a_resume_reads_its_recorded_method_and_builds_its_parser_once(tmp_path, monkeypatch):
    """The recorded method names the parser of both the resume's options and its recorded settings, and
    which options predate the recorded run: each is worked out once."""
    run = tmp_path / "old"
    run.mkdir()
    recorded = default_config("pfedme")
    del recorded["method"]["weighting"]  # a run from before the option: it trained with weighting: samples
    (run / "config.yaml").write_text(yaml.safe_dump(recorded))
    named, built, predating = [], [], []
    monkeypatch.setattr(args, "method_in_file", lambda path: named.append(path) or method_in_file(path))
    monkeypatch.setattr(args, "build_fit_parser", lambda name: built.append(name) or build_fit_parser(name))
    predating_args = args.predating_args
    monkeypatch.setattr(args, "predating_args", lambda rec, name: predating.append(name) or predating_args(rec, name))
    cfg = args.parse_fit_args(["--resume", str(run), "--trainer.rounds", "60"])[0]
    assert cfg.method.weighting == "samples" and cfg.trainer.rounds == 60
    assert (named, built, predating) == ([run / "config.yaml"], ["pfedme"], ["pfedme"])
    with pytest.raises(ConfigError, match=r"may not change method\.weighting \('samples' -> 'uniform'\)"):
        args.parse_fit_args(["--resume", str(run), "--method.weighting", "uniform"])
