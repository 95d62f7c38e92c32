"""``fit --help`` from the index is the parser's own text, byte for byte, at any terminal width; what the
index cannot vouch for (a user's method class, edited sources, no index) gets the parser's help."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pfl.methods.registry import method_names
from pfl.runner import args as args_module
from pfl.runner import fit_help as module
from pfl.runner.args import build_fit_parser, default_config
from pfl.runner.fit_help import INDEX, PACKAGE, fingerprint, fit_help, indexed_help, method_defaults
from pfl.runner.fit_help_index import REGENERATE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parsers():
    return {name: build_fit_parser(name) for name in method_names()}


@pytest.mark.parametrize("columns", ["80", "120", "200"])
def test_every_built_in_methods_help_from_the_index_is_the_parsers_own(parsers, columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    differing = [name for name, parser in parsers.items() if indexed_help(name) != parser.format_help()]
    assert not differing, f"fit --help from {INDEX.name} differs for {differing} (is the index stale? {REGENERATE})"


def test_the_width_shapes_the_text(monkeypatch):
    lines = {}
    for columns in ("80", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        lines[columns] = len(indexed_help("ditto").splitlines())
    assert lines["80"] > 1.5 * lines["200"]  # the help wrapped to the terminal, as argparse does


def test_the_help_is_that_of_the_method_the_command_line_chooses():
    ditto, pgfed = indexed_help("ditto"), indexed_help("pgfed")
    assert fit_help([]) == indexed_help("fedavg")
    assert fit_help(["--method", "ditto"]) == fit_help(["--method.name=ditto"]) == ditto
    config = str(ROOT / "conf" / "method" / "ditto.yaml")
    assert fit_help(["--config", config, "--trainer.rounds", "3"]) == ditto  # the method a config file names
    assert fit_help(["--config", config, "--method", "pgfed"]) == pgfed  # a later choice wins
    assert fit_help(["--method", "pgfed", "--config", config]) == ditto


def test_a_users_method_class_gets_the_parsers_help(parsers):
    path = "pfl.methods.ditto.Ditto"  # a class path, as a user's own class is named
    assert indexed_help(path) is None
    assert fit_help(["--method", path]) == build_fit_parser(path).format_help()


def test_the_method_shorthand_is_described_as_what_it_reads(parsers, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = parsers["ditto"].format_help()
    assert "[--method NAME]" in text and "--method CONFIG" not in text  # a name, not the group's YAML file
    assert "--method NAME  " in text and "--method.name NAME, or the class whole" in text
    # a user's method without options has no --method group: its parser is built all the same
    assert "--method.name" in build_fit_parser("tests.helpers.crashing.RaisingMethod").format_help()


def test_a_stale_missing_or_broken_index_is_not_used(parsers, tmp_path, monkeypatch):
    index = json.loads(INDEX.read_text(encoding="utf-8"))
    index["fingerprint"]["sources"] = "0" * 64
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(index))
    broken = tmp_path / "broken.json"
    broken.write_text(INDEX.read_text(encoding="utf-8")[:1000])
    for path in (stale, broken, tmp_path / "missing.json"):
        assert indexed_help("ditto", path) is None
    monkeypatch.setattr(module, "INDEX", stale)
    assert fit_help(["--method", "ditto"]) == parsers["ditto"].format_help()


def test_the_fingerprint_changes_with_any_source(tmp_path):
    copy = tmp_path / "pfl"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert fingerprint(copy) == fingerprint()
    (copy / "methods" / "ditto.py").write_text((copy / "methods" / "ditto.py").read_text() + "\n")
    edited = fingerprint(copy)
    assert edited["sources"] != fingerprint()["sources"]
    (copy / "methods" / "mine.py").write_text("")
    assert fingerprint(copy)["sources"] != edited["sources"]


def test_a_built_in_methods_defaults_come_from_the_index_as_its_parser_gives_them(monkeypatch):
    expected = {name: default_config(name) for name in ("pgfed", "fedavg")}

    def parser_built(name):
        raise AssertionError(f"the parser of {name} was built")

    monkeypatch.setattr(args_module, "default_config", parser_built)
    got = method_defaults("pgfed")
    assert got == expected["pgfed"] and method_defaults("fedavg") == expected["fedavg"]
    assert got["method"]["name"] == "pgfed" and "mu" in got["method"]  # the method's own options, not fedavg's
    got["method"]["mu"], got["trainer"]["rounds"] = -1.0, -1  # the caller's copy: the next call is unchanged
    assert method_defaults("pgfed") == expected["pgfed"]


def test_without_a_current_index_the_defaults_come_from_the_parser(tmp_path, monkeypatch):
    user_class = "pfl.methods.ditto.Ditto"  # a class path, as a user's own method is named: never indexed
    assert method_defaults(user_class) == default_config(user_class)
    assert method_defaults("no_such_method") is None
    index = json.loads(INDEX.read_text(encoding="utf-8"))
    index["values"] = [{"edited": True} for _ in index["values"]]  # what a stale index would give
    index["fingerprint"]["sources"] = "0" * 64
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(index))
    monkeypatch.setattr(module, "INDEX", stale)
    got = method_defaults("ditto")
    assert got == default_config("ditto")
    got["method"]["lam"], got["trainer"]["rounds"] = -1.0, -1  # the caller's copy, not the parser's kept one
    assert method_defaults("ditto") == default_config("ditto") and default_config("ditto")["trainer"]["rounds"] > 0
