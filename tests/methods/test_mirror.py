"""The tests mirror the code.

- tests/ holds one folder per pfl subpackage (``pfl/<package>/`` is tested in ``tests/<package>/``), and a
  test file there is named after one of the package's modules (``test_<module>*.py``) or imports the
  package; ``bench/`` and ``docs/`` are tested in tests/bench and tests/docs, and helpers used by several
  folders live in tests/helpers. tests/'s root keeps ``conftest.py``, the tests of pfl's top-level modules
  (``pfl/<module>.py``: ``test_<module>*.py``) and the few files that test no single package
  (``CROSS_CUTTING``, each with its reason).
- The method tests mirror the method modules: ``pfl/methods/<module>.py`` is tested by
  ``tests/methods/test_<module>.py``, which runs the registry-wide properties of exactly the methods the
  module registers (``registry_properties.properties_of``), so every registered method gets them and a
  mutation target is a file.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pfl.methods import method_class, methods
from tests.methods import registry_properties
from tests.methods.defaults_learn import floors

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent

# Folders of tests/ that mirror no pfl subpackage: what each holds.
OTHER_FOLDERS = {
    "bench": "the tests of bench/ (benchmarks and the mutation tool): each imports bench",
    "docs": "the tests of docs/: each runs or reads a document there",
    "helpers": "helpers shared by several test folders (no tests)",
}
# Test files at tests/'s root that test no single pfl package: why each stays there.
CROSS_CUTTING = {
    "test_architecture.py": "the import layers of the whole package (import-linter's contracts)",
    "test_device_placement.py": "every method's run on a stand-in training device: methods, engine and loop together",
    "test_packaging.py": "the installed distribution: its files, entry point and metadata",
    "test_security.py": "datasets, checkpoints and run names opened through every layer",
    "test_startup.py": "what each command imports, across all packages",
}
ROOT_FILES = {"__init__.py", "conftest.py"}


def _imported_modules(path: Path) -> set[str]:
    """Every module the file imports (``from a.b import c`` counts as a.b and a.b.c), anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _mirrors(path: Path, modules: set[str]) -> bool:
    """``test_<module>.py`` or ``test_<module>_<aspect>.py`` for one of ``modules``."""
    return any(f"{path.stem}_".startswith(f"test_{module}_") for module in modules)


def _imports(path: Path, package: str) -> bool:
    modules = _imported_modules(path)
    if package == "pfl.api" and "pfl" in modules:  # pfl.fit, pfl.load, ... are pfl.api's names
        return True
    return any(m == package or m.startswith(package + ".") for m in modules)


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}


def layout_problems(pfl: Path, tests: Path) -> list[str]:
    """Each place where ``tests`` does not mirror the package ``pfl``, one line each; empty when it does."""
    problems = []
    packages = {p.parent.relative_to(pfl) for p in pfl.rglob("__init__.py") if p.parent != pfl}
    top_modules = _modules(pfl)
    for package in sorted(packages):
        folder = tests / package
        if len(package.parts) == 1 and not any(folder.glob("test_*.py")):
            problems.append(f"pfl/{package}/ has no test folder tests/{package}/ with a test file")
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        rel = folder.relative_to(tests)
        if "__pycache__" in rel.parts or not any(folder.glob("*.py")):
            continue
        if rel.parts[0] in OTHER_FOLDERS:
            package = None
        elif rel in packages:
            package = "pfl." + ".".join(rel.parts)
        else:
            problems.append(
                f"tests/{rel}/ mirrors no pfl subpackage (pfl/{rel}/ is none) and is not one of {sorted(OTHER_FOLDERS)}"
            )
            continue
        for path in sorted(folder.glob("test_*.py")):
            name = f"tests/{rel}/{path.name}"
            if rel.parts[0] == "helpers":
                problems.append(f"{name}: tests/helpers holds helpers, not tests")
            elif rel.parts[0] == "bench" and not _imports(path, "bench"):
                problems.append(f"{name} imports nothing from bench/: it belongs in the folder of what it tests")
            elif rel.parts[0] == "docs" and "docs" not in path.read_text():
                problems.append(f"{name} names no document in docs/: it belongs in the folder of what it tests")
            elif package and not _mirrors(path, _modules(pfl / rel)) and not _imports(path, package):
                problems.append(
                    f"{name} is named after no module of {package} and imports nothing from it: "
                    "it belongs in the folder of what it tests"
                )
    for path in sorted(tests.glob("*.py")):
        if path.name in ROOT_FILES or path.name in CROSS_CUTTING:
            continue
        module = next((m for m in top_modules if _mirrors(path, {m})), None)
        if not path.name.startswith("test_"):
            problems.append(
                f"tests/{path.name}: a helper at tests/'s root; move it next to its users or into tests/helpers"
            )
        elif module is None or not _imports(path, f"pfl.{module}"):
            problems.append(
                f"tests/{path.name} is not the test of a top-level module (pfl/<module>.py as test_<module>*.py) "
                "nor in CROSS_CUTTING: move it into the folder of the package it tests"
            )
    return problems


def test_the_tests_mirror_the_package():
    assert layout_problems(ROOT / "pfl", TESTS) == []


def _registered_by_module() -> dict[str, set[str]]:
    by_module: dict[str, set[str]] = {}
    for name in methods():
        by_module.setdefault(method_class(name).__module__.rsplit(".", 1)[-1], set()).add(name)
    return by_module


def test_every_method_module_has_its_test_file_checking_exactly_its_methods(request):
    folder = request.node.parent.parent  # tests/methods, as pytest collects it
    for module, names in _registered_by_module().items():
        path = HERE / f"test_{module}.py"
        assert path.exists(), f"pfl/methods/{module}.py registers {sorted(names)} but {path.name} is missing"
        collected = request.node.ihook.pytest_pycollect_makemodule(module_path=path, parent=folder).collect()
        checked = [node.obj for node in collected if node.name == "TestRegistryProperties"]
        assert checked, f"{path.name}: no TestRegistryProperties collected"
        assert set(checked[0].METHODS) == names, f"{path.name} checks {sorted(checked[0].METHODS)}, not {sorted(names)}"


def test_the_partial_properties_name_registered_methods_only():
    """A misspelt name in a table would silently check nothing."""
    tables = ("RESUMED_FROM_A_COPY", "OFFICIAL_CONFIGS", "PAPER_DEFAULTS", "BOUNDS")
    for table in tables:
        unknown = set(getattr(registry_properties, table)) - set(methods())
        assert not unknown, f"registry_properties.{table} names {sorted(unknown)}, which no module registers"


def test_the_floor_is_well_above_chance(fedavg_run):
    reference, classes = fedavg_run
    assert all(floor >= 3.0 / classes for floor in floors(reference, classes).values())


def _write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_layout_problems_name_each_misplaced_file_and_each_package_without_tests(tmp_path):
    pfl, tests = tmp_path / "pfl", tmp_path / "tests"
    for package in ("", "data", "engine", "engine/kernels"):
        _write(pfl / package / "__init__.py")
    _write(pfl / "cli.py")
    _write(pfl / "data" / "split.py")
    _write(tests / "conftest.py")
    _write(tests / "data" / "test_split_edges.py", "from tests.conftest import tiny_config\n")
    _write(tests / "data" / "test_loaders.py", "from pfl.data import build_data\n")
    _write(tests / "data" / "test_worker.py", "from pfl.engine.worker import Worker\n")
    _write(tests / "test_cli_errors.py", "def test():\n    from pfl.cli import main\n")
    _write(tests / "test_everything.py", "import pfl.data\n")
    _write(tests / "shared_runs.py")
    _write(tests / "stuff" / "test_z.py", "import pfl.data\n")
    _write(tests / "helpers" / "test_h.py")
    assert layout_problems(pfl, tests) == [
        "pfl/engine/ has no test folder tests/engine/ with a test file",
        "tests/data/test_worker.py is named after no module of pfl.data and imports nothing from it: "
        "it belongs in the folder of what it tests",
        "tests/helpers/test_h.py: tests/helpers holds helpers, not tests",
        f"tests/stuff/ mirrors no pfl subpackage (pfl/stuff/ is none) and is not one of {sorted(OTHER_FOLDERS)}",
        "tests/shared_runs.py: a helper at tests/'s root; move it next to its users or into tests/helpers",
        "tests/test_everything.py is not the test of a top-level module (pfl/<module>.py as test_<module>*.py) "
        "nor in CROSS_CUTTING: move it into the folder of the package it tests",
    ]
    _write(tests / "engine" / "test_worker.py", "from pfl.engine.worker import Worker\n")
    (tests / "data" / "test_worker.py").unlink()
    for path in (tests / "test_everything.py", tests / "shared_runs.py", tests / "stuff" / "test_z.py"):
        path.unlink()
    (tests / "helpers" / "test_h.py").rename(tests / "helpers" / "runs.py")
    assert layout_problems(pfl, tests) == []
