"""What a fit parse keeps for the next one (a suite or sweep parses hundreds of runs): the parser's defaults,
worked out once, and what a config file names, read once per text."""

from __future__ import annotations

import jsonargparse

from pfl.runner import method_choice
from pfl.runner.args import build_fit_parser
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
