"""pfl/runner/fit_help.json is what ``python -m pfl.runner.fit_help_index --write`` writes from the sources
as they are, so ``fit --help`` never renders an outdated text."""

from __future__ import annotations

import json

from pfl.methods.registry import method_names
from pfl.runner.fit_help import INDEX
from pfl.runner.fit_help_index import REGENERATE, index_text, stale


def test_the_committed_index_is_the_one_the_sources_give():
    problem = stale(INDEX, index_text())
    assert problem is None, problem


def test_a_missing_or_outdated_index_is_reported_with_the_command_that_fixes_it(tmp_path):
    path, text = tmp_path / "fit_help.json", INDEX.read_text(encoding="utf-8")
    assert stale(path, text) == f"fit_help.json is missing: run {REGENERATE}"
    path.write_text(text.replace('"python": "', '"python": "2.'))
    assert stale(path, text) == f"fit_help.json is stale: run {REGENERATE}"
    path.write_text(text)
    assert stale(path, text) is None


def test_every_built_in_method_is_indexed_and_the_options_they_share_stored_once():
    index = json.loads(INDEX.read_text(encoding="utf-8"))
    assert list(index["parsers"]) == method_names()
    rounds = [a for a in index["actions"] if a["options"] == ["--trainer.rounds"]]
    assert len(rounds) == 1
    assert all(
        index["parsers"][name]["actions"].count(index["actions"].index(rounds[0])) == 1 for name in index["parsers"]
    )
