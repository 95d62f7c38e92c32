"""bench.mutate classifies mutants right: on a tiny module and its test, a mutant the test catches is
killed, one it cannot catch survives, one on a line the test never runs is not covered."""

from __future__ import annotations

import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from bench import mutate as tool

MODULE = """\
def step(w, g):
    return w - 0.5 * g


def scale(w):
    return w * 2


def unused(w):
    return w + 7
"""

TEST = """\
from tinymod import scale, step


def test_step():
    assert step(4.0, 2.0) == 3.0


def test_scale(tmp_path):  # a pytest folder for each child
    assert scale(0.0) == 0.0
"""


@pytest.fixture
def tiny_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tinymod.py").write_text(MODULE)
    (tmp_path / "test_tinymod.py").write_text(TEST)
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "OUT", tmp_path / "out")
    monkeypatch.setattr(tool, "PYTEST_ARGS", [*tool.PYTEST_ARGS, "--rootdir", str(tmp_path), "-c", "/dev/null"])
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("tinymod", None)
    return tmp_path


def by_line(entry: dict) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for r in entry["results"].values():
        out.setdefault(r["line"], []).append(r["status"])
    return out


def pytest_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("pfl-mutate-*"))


def test_killed_survived_and_not_covered_are_told_apart(tiny_project: Path):
    cache: dict = {}
    source = tiny_project / "tinymod.py"
    folders = pytest_folders()
    entry = tool.mutate_file(source, ["test_tinymod.py"], cache, tiny_project / "cache.json", 2, False)
    assert pytest_folders() == folders  # the children's pytest folders went with the run
    status = by_line(entry)
    assert status[2] == [tool.KILLED] * 3  # "-" -> "+", "*" -> "/", 0.5 -> 1.5: step(4, 2) changes
    assert status[6] == [tool.SURVIVED] * 2  # "*" -> "/", 2 -> 3: scale(0) is 0 either way
    assert status[10] == [tool.NOT_COVERED, tool.NOT_COVERED]  # unused() never runs
    assert "tinymod" not in sys.modules  # the parent never imported the module under test

    text = tool.report(cache, ["tinymod.py"], [])
    assert "| tinymod.py | 7 | 3 | 0 | 2 | 0 | 2 | 2 |" in text
    explained = [{"file": "tinymod.py", "line": 6, "mutant": "return w / 2", "reason": "scale(0) test only"}]
    assert "| tinymod.py | 7 | 3 | 0 | 2 | 1 | 1 | 2 |" in tool.report(cache, ["tinymod.py"], explained)

    # A re-run with unchanged code and tests reuses every result; a new test re-runs only the survivors.
    (tiny_project / "test_tinymod.py").write_text(TEST + "\n\ndef test_scale_one():\n    assert scale(3.0) == 6.0\n")
    again = tool.mutate_file(source, ["test_tinymod.py"], cache, tiny_project / "cache.json", 2, False)
    assert by_line(again)[6] == [tool.KILLED] * 2
    assert by_line(again)[2] == status[2]


def test_clean_run_must_pass(tiny_project: Path):
    (tiny_project / "test_tinymod.py").write_text(TEST.replace("3.0", "5.0"))
    with pytest.raises(tool.CleanRunFailed, match="fail on the unmutated code"):
        tool.mutate_file(tiny_project / "tinymod.py", ["test_tinymod.py"], {}, tiny_project / "c.json", 1, False)


def test_mutants_are_mutmuts_and_skip_strings_and_pragmas(tmp_path: Path):
    path = tmp_path / "m.py"
    path.write_text(
        textwrap.dedent("""\
        def f(x):
            if x > 0:  # pragma: no mutate
                raise ValueError("x must be <= 0")
            return x - 1
    """)
    )
    mutated = [m.mutated.strip() for m in tool.generate(path)]
    assert mutated == ["return x + 1", "return x - 2"]
    assert 'raise ValueError("XXx must be <= 0XX")' in [m.mutated.strip() for m in tool.generate(path, strings=True)]


def test_saving_one_files_entry_keeps_what_another_run_wrote_meanwhile(tmp_path: Path):
    path = tmp_path / "cache.json"
    mine: dict = {}
    tool.save_entry(path, mine, "a.py", {"results": {"1_0": "killed"}})
    other: dict = tool.load_cache(path)  # a second run, started now, over another file
    tool.save_entry(path, other, "b.py", {"results": {"2_0": "survived"}})
    tool.save_entry(path, mine, "a.py", {"results": {"1_0": "killed", "1_1": "killed"}})  # its stale copy lacks b.py
    on_disk = tool.load_cache(path)
    assert on_disk == {
        "a.py": {"results": {"1_0": "killed", "1_1": "killed"}},
        "b.py": {"results": {"2_0": "survived"}},
    }
    assert mine == on_disk  # the writer's copy catches up too, for its report
    assert not list(tmp_path.glob("*.tmp"))


def test_the_test_files_that_ran_the_mutated_statement_run_first(tiny_project: Path, monkeypatch: pytest.MonkeyPatch):
    tests = {"test_a.py": ("scale", "scale(1.0) == 2.0"), "test_b.py": ("step", "step(4.0, 2.0) == 3.0")}
    for name, (function, check) in tests.items():
        (tiny_project / name).write_text(f"from tinymod import {function}\n\n\ndef test_it():\n    assert {check}\n")
    order: dict[str, list[str]] = {}
    real = tool.run_jobs

    def recording(jobs, workers, timeout):  # noqa: ANN001, ANN202
        order.update({job.mutant.key: job.args for job in jobs if job.mutant is not None})
        yield from real(jobs, workers, timeout)

    monkeypatch.setattr(tool, "run_jobs", recording)
    source, cache = tiny_project / "tinymod.py", tiny_project / "c.json"
    entry = tool.mutate_file(source, ["test_a.py", "test_b.py"], {}, cache, 2, False)
    line = {key: result["line"] for key, result in entry["results"].items()}
    assert {tuple(args) for key, args in order.items() if line[key] == 2} == {("test_b.py", "test_a.py")}
    assert {tuple(args) for key, args in order.items() if line[key] == 6} == {("test_a.py", "test_b.py")}
    assert by_line(entry) == {2: [tool.KILLED] * 3, 6: [tool.KILLED] * 2, 10: [tool.NOT_COVERED] * 2}
    mutant = next(m for m in tool.generate(source) if m.line == 2)
    options = ["test_a.py", "-k", "step", "test_b.py"]  # a target with options keeps its order
    assert tool.covering_first(mutant, options, {"test_b.py": {2}}, {}) == options


def test_a_run_with_no_files_mutates_every_target_and_every_module_of_the_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Targets outside the packages are mutated too; a package module without a target is still listed
    (the run reports it as skipped), and package __init__ files are left out."""
    for rel in ("pkg/__init__.py", "pkg/untargeted.py", "pkg/targeted.py", "other/targeted.py", "other/left.py"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("")
    targets = tmp_path / "targets.toml"
    targets.write_text('["other/targeted.py"]\ntests = ["t.py"]\n["pkg/targeted.py"]\ntests = ["t.py"]\n')
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "PACKAGES", ("pkg",))
    files = [str(p.relative_to(tmp_path)) for p in tool.default_files(targets)]
    assert files == ["other/targeted.py", "pkg/targeted.py", "pkg/untargeted.py"]


def test_a_packages_init_is_mutated_as_the_package_and_its_submodules_still_import(tiny_project: Path):
    """pkg/__init__.py is imported as ``pkg``: the mutant must be what ``import pkg`` finds (a finder keyed
    on ``pkg.__init__`` would serve nobody, so every mutant would survive), and ``pkg.sub`` still loads."""
    package = tiny_project / "tinypkg"
    package.mkdir()
    (package / "__init__.py").write_text("def half(w):\n    return w / 2\n\n\ndef double(w):\n    return w * 2\n")
    (package / "sub.py").write_text("from tinypkg import half\n\n\ndef quarter(w):\n    return half(half(w))\n")
    (tiny_project / "test_tinypkg.py").write_text(
        "from tinypkg import double, half\nfrom tinypkg.sub import quarter\n\n\n"
        "def test_half():\n    assert half(4.0) == 2.0 and quarter(8.0) == 2.0 and double(0.0) == 0.0\n"
    )
    sys.modules.pop("tinypkg", None)
    sys.modules.pop("tinypkg.sub", None)
    assert tool.module_name(package / "__init__.py") == "tinypkg"
    entry = tool.mutate_file(package / "__init__.py", ["test_tinypkg.py"], {}, tiny_project / "c.json", 2, False)
    # "/" -> "*" and 2 -> 3 change half(4); double(0) is 0 either way, so its mutants survive (they would
    # be "killed" by an ImportError if the mutated package lost its submodules)
    assert by_line(entry) == {2: [tool.KILLED] * 2, 6: [tool.SURVIVED] * 2}
