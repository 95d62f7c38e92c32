"""pfl installs as the distribution pfl-lightning with its experiment configs, type marker and license,
and an installed copy runs the default experiment by name from a folder outside the checkout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pfl

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "pfl", "conf")


def pip(*args: str, cwd: Path) -> None:
    # --no-build-isolation: the build uses this environment's setuptools (no package index needed)
    out = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--no-deps", "--no-build-isolation", "-q"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of what a build reads (a build writes build/ and *.egg-info beside its sources)."""
    copy = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, copy / name)
    return copy


@pytest.fixture(scope="module")
def built(source, tmp_path_factory) -> Path:
    """The wheel ``pip install <checkout>`` builds and installs."""
    out = tmp_path_factory.mktemp("wheel")
    pip("wheel", "-w", str(out), str(source), cwd=out)
    (wheel_file,) = out.glob("*.whl")
    return wheel_file


@pytest.fixture(scope="module")
def wheel(built) -> zipfile.ZipFile:
    return zipfile.ZipFile(built)


def metadata(wheel: zipfile.ZipFile) -> str:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return wheel.read(name).decode()


def test_the_wheel_is_pfl_lightning_at_pfls_version_under_apache_2(wheel):
    meta = metadata(wheel)
    assert re.search(r"^Name: pfl-lightning$", meta, re.M)
    assert re.search(rf"^Version: {re.escape(pfl.__version__)}$", meta, re.M)
    assert re.search(r"^License-Expression: Apache-2\.0$", meta, re.M)
    (license_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_file) == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in wheel.read(license_file) and b"Version 2.0, January 2004" in wheel.read(license_file)
    entry_points = wheel.read(license_file.replace("licenses/LICENSE", "entry_points.txt")).decode()
    assert "pfl = pfl.cli:main" in entry_points


def test_the_wheel_carries_every_config_the_type_marker_the_help_index_and_every_module(wheel):
    names = set(wheel.namelist())
    configs = {f"pfl/conf/{p.relative_to(ROOT / 'conf').as_posix()}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert configs and configs <= names
    assert "pfl/py.typed" in names
    assert "pfl/runner/fit_help.json" in names  # what `pfl fit --help` renders a built-in method's help from
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "pfl").rglob("*.py")}
    assert modules <= names
    assert not [n for n in names if not n.startswith(("pfl/", "pfl_lightning-"))]  # nothing outside the package


def test_the_version_is_set_in_one_place_and_has_a_changelog_entry():
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = pyproject.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert 'dynamic = ["version"]' in project and not re.search(r"^version\s*=", project, re.M)
    assert 'version = { attr = "pfl.__version__" }' in pyproject
    assert f"## [{pfl.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def test_an_installed_pfl_runs_the_default_experiment_by_name_from_another_folder(built, tmp_path):
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip("install", "--target", str(target), str(built), cwd=elsewhere)
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    run = [sys.executable, "-m", "pfl", "fit", "--config", "default", "--trainer.rounds", "2"]
    small = ["--data.num_clients", "4", "--model.hidden", "[16]", "--trainer.progress", "false"]
    out = subprocess.run(
        [*run, *small, "--tracking.wandb", "false", "--tracking.name", "r"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads((elsewhere / "runs" / "r" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["dataset"] == "digits"

    def printed(code: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True
        ).stdout

    used = printed("import pfl.runner.config_files as c; print(c.conf_dir())")
    assert Path(used.strip()) == target / "pfl" / "conf"  # the installed copy's, not the checkout's
    indexed = printed("import pfl.runner.fit_help as h; print(h.INDEX, h.indexed_help('ditto') is not None)")
    assert indexed.split() == [str(target / "pfl" / "runner" / "fit_help.json"), "True"]  # its sources match
