"""docs/quickstart.ipynb runs top to bottom in a Jupyter kernel (from docs/, as Jupyter opens it)."""

from __future__ import annotations

import nbformat

from bench.notebook import NOTEBOOK, execute_quickstart


def outputs(cell) -> str:
    """A cell's text outputs (stream text and plain-text results)."""
    parts = [o.get("text", "") for o in cell.outputs]
    parts += [o.get("data", {}).get("text/plain", "") for o in cell.outputs]
    return "\n".join(parts)


def test_quickstart_notebook_runs(tmp_path):
    committed = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.outputs for c in committed.cells if c.cell_type == "code"), "commit the notebook without outputs"
    nb, _ = execute_quickstart(tmp_path)  # its run time is make bench's (bench/notebook.py)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    runs, curves, table = code[1], code[-1], code[-2]
    assert "Run(" in outputs(runs) and "fedavg on digits" in outputs(runs) and "ditto on digits" in outputs(runs)
    assert "fedavg" in outputs(table) and "ditto" in outputs(table) and "pm.l_acc" in outputs(table)
    assert any("image/png" in o.get("data", {}) for o in curves.outputs)  # the accuracy curves
    assert len(list(tmp_path.glob("pfl-quickstart-*/*/summary.json"))) == 2
