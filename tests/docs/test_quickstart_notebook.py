"""docs/quickstart.ipynb runs top to bottom in a Jupyter kernel (from docs/, as Jupyter opens it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "quickstart.ipynb"


def outputs(cell) -> str:
    """A cell's text outputs (stream text and plain-text results)."""
    parts = [o.get("text", "") for o in cell.outputs]
    parts += [o.get("data", {}).get("text/plain", "") for o in cell.outputs]
    return "\n".join(parts)


def test_quickstart_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs for c in code), "commit the notebook without outputs"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),  # this checkout's pfl
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "TMPDIR": str(tmp_path),  # the notebook's run folders
    }
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "docs")}}
    )
    start = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    assert seconds < 60, f"the quickstart took {seconds:.0f} s; keep it well under a minute"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    runs, curves, table = code[1], code[-1], code[-2]
    assert "Run(" in outputs(runs) and "fedavg on digits" in outputs(runs) and "ditto on digits" in outputs(runs)
    assert "fedavg" in outputs(table) and "ditto" in outputs(table) and "pm.l_acc" in outputs(table)
    assert any("image/png" in o.get("data", {}) for o in curves.outputs)  # the accuracy curves
    assert len(list(tmp_path.glob("pfl-quickstart-*/*/summary.json"))) == 2
