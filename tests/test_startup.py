"""Start-up stays cheap: a command imports only what it uses (docs/performance.md, "Start-up", has the
measured CPU seconds). Checked by what a fresh interpreter has imported, never by a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli_runs import child_env
from tests.helpers.report_plots import runs  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "lightning", "torchvision", "torchmetrics", "jsonargparse", "wandb", "pandas", "matplotlib", "timm")
PROBE = """
import contextlib, io, json, sys
from pfl.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def imported_by(*argv: str) -> set[str]:
    """The modules a fresh interpreter holds after ``python -m pfl ARGV`` (its output discarded)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ["methods"],
        [],
        ["--help"],
        ["mthods"],
        ["sweep", "--help"],
        ["sweep"],
        ["data"],
        ["data", "stats", "--help"],
        ["reproduce", "--help"],
        ["reproduce", "--only", "fedora_rotatd"],
        ["reproduce", "--workers", "0"],
        ["reproduce", "--only", "pgfed_table", "--runs", "pfedmee"],
    ],
    ids=" ".join,
)
def test_listing_methods_usage_a_mistyped_command_and_the_usage_of_sweep_data_and_reproduce_import_no_torch(argv):
    loaded = imported_by(*argv)
    assert "pfl.cli" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


@pytest.mark.parametrize(
    "argv", [["--method", "ditto"], [], ["--config", str(ROOT / "conf" / "method" / "pgfed.yaml")]], ids=str
)
def test_a_built_in_methods_fit_help_builds_no_parser_and_imports_no_torch(argv):
    loaded = imported_by("fit", *argv, "--help")
    assert "pfl.runner.fit_help" in loaded  # rendered from its index (pfl/runner/fit_help.json)
    assert not loaded & {*HEAVY, "pfl.config", "pfl.runner.args"}, sorted(loaded & {*HEAVY, "pfl.config"})


def test_a_class_paths_fit_help_imports_only_that_method_and_no_tracking_or_tables():
    loaded = imported_by("fit", "--method", "pfl.methods.ditto.Ditto", "--help")  # as a user's class is named
    assert {"pfl.methods.ditto", "pfl.methods.fedavg"} <= loaded  # ditto and the class it extends
    assert not {"pfl.methods.fedprox", "pfl.methods.page", "pfl.methods.pfedhn"} & loaded
    assert not {"wandb", "pandas", "timm"} & loaded


def imported_after(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules``."""
    probe = f"import json, sys, {', '.join(modules)}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout))


def test_import_pfl_imports_no_torch():
    assert not imported_after("pfl") & set(HEAVY)


def test_the_precisions_written_out_are_fabrics_own():
    from typing import get_args

    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    from pfl.config import PRECISIONS

    assert get_args(_PRECISION_INPUT_STR) + get_args(_PRECISION_INPUT_STR_ALIAS) == PRECISIONS


def test_reading_a_config_imports_no_lightning():
    assert not {"lightning", "lightning.fabric"} & imported_after("pfl.config")


def test_importing_a_method_imports_no_lightning():
    # (a method with an objective of its own, a ClientModule, does: Ditto, LG-FedAvg, PLGU)
    loaded = imported_after("pfl.methods.fedavg", "pfl.methods.pgfed", "pfl.methods.page")
    assert not {"lightning", "lightning.fabric"} & loaded


def test_a_table_and_the_figures_of_finished_runs_import_no_torch(runs, tmp_path):  # noqa: F811
    """``pfl report`` reads JSON, CSV and YAML. The defaults that fill the options an older run's config.yaml
    lacks come from the method index: a parser built for them would import jsonargparse, torch and Lightning."""
    figures = [tmp_path / "curves.png", tmp_path / "clients.png"]
    loaded = imported_by("report", *map(str, runs), "--plot", str(figures[0]), "--plot-clients", str(figures[1]))
    assert all(f.read_bytes().startswith(b"\x89PNG") for f in figures)  # the command ran to its end
    assert "pfl.runner.fit_help" in loaded and "matplotlib" in loaded
    heavy = {*HEAVY, "pfl.runner.args", "pfl.data.federated"} - {"matplotlib"}
    assert not loaded & heavy, sorted(loaded & heavy)


@pytest.mark.parametrize("package", ["pfl.metrics", "pfl.data"])
def test_a_packages_names_load_on_first_use_from_their_modules(package):
    """``pfl.metrics`` and ``pfl.data`` import no submodule until one of their names is read; each name is
    the object of the module that defines it, and an unknown one is an AttributeError naming it."""
    import importlib

    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert value is getattr(importlib.import_module(f"{package}.{module._MODULE_OF[name]}"), name)
        assert module.__dict__[name] is value  # kept: the next read is a plain attribute
    assert sorted(module.__all__) == sorted(module._MODULE_OF)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'nope'"):
        _ = module.nope
    assert not {m for m in imported_after(package) if m.startswith(f"{package}.")}
