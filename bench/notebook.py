"""docs/quickstart.ipynb executed top to bottom in a Jupyter kernel, from docs/ as Jupyter opens it.

The test suite checks its outputs (tests/docs/test_quickstart_notebook.py); ``make bench`` reports its
wall time, which docs/performance.md asks to stay well under a minute on the 2-core machine.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "quickstart.ipynb"


def execute_quickstart(run_dir: Path) -> tuple[nbformat.NotebookNode, float]:
    """The executed notebook and its wall seconds; its run folders go under ``run_dir`` (its TMPDIR)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),  # this checkout's pfl
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "TMPDIR": str(run_dir),
    }
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "docs")}}
    )
    start = time.perf_counter()
    client.execute(env=env)
    return nb, time.perf_counter() - start


def quickstart_seconds() -> float:
    with tempfile.TemporaryDirectory(prefix="pfl-bench-notebook-") as run_dir:
        return execute_quickstart(Path(run_dir))[1]
