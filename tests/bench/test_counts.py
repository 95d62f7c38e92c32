"""docs/counts.md is what ``python -m bench.counts`` writes, so the figures the docs quote cannot go stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.counts import COUNTS, ROOT, collected_tests, render, stale
from pfl.methods import methods


def collects_what_make_test_does(config: pytest.Config) -> bool:
    """This session collected the whole tests folder with pyproject's own selection and nothing left out."""
    whole = [Path(arg).resolve() for arg in config.args] == [ROOT / "tests"]
    left_out = ("keyword", "deselect", "ignore", "ignore_glob", "lf")  # options that collect or keep fewer
    return whole and config.option.markexpr == "not slow" and not any(config.getoption(o, None) for o in left_out)


@pytest.fixture(scope="module")
def test_ids(request: pytest.FixtureRequest) -> list[str]:
    if collects_what_make_test_does(request.config):  # `make test` itself: what it collected (saves a collection)
        return [item.nodeid for item in request.session.items]
    return collected_tests()


def test_docs_counts_md_holds_the_figures_as_they_are_now(test_ids):
    problem = stale(COUNTS, render(test_ids))
    assert problem is None, problem


def test_a_missing_or_changed_figure_is_reported_with_the_command_that_fixes_it(tmp_path, test_ids):
    text, path = render(test_ids), tmp_path / "counts.md"
    assert stale(path, text) == "counts.md is missing: run python -m bench.counts"
    path.write_text(text)
    assert stale(path, text) is None
    path.write_text(text.replace(f"| {len(test_ids)} |", f"| {len(test_ids) + 1} |"))
    assert stale(path, text) == "counts.md is stale: run python -m bench.counts to regenerate it"


def test_the_figures_count_what_they_name(test_ids):
    text = render(test_ids)
    assert f"| registered methods (`python -m pfl methods`) | {len(methods())} |" in text
    assert f"| tests `make test` runs | {len(test_ids)} |" in text
    assert any(test_id.startswith("tests/bench/test_counts.py::") for test_id in test_ids)
    per_folder = re.findall(r"^\| [^|]+ \| (\d+) \| (\d+) \|$", text, flags=re.M)
    assert sum(int(tests) for _, tests in per_folder) == len(test_ids)
    assert sum(int(files) for files, _ in per_folder) == len(
        list(COUNTS.parents[1].joinpath("tests").rglob("test_*.py"))
    )
