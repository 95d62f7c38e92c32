"""import pfl stays light (no torch) and exports the API: fit, load, compare, Run."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pfl
from tests.api.helpers import ROOT


def test_import_pfl_stays_light_and_exports_the_api():
    code = "import sys, pfl; assert 'torch' not in sys.modules; print(sorted(pfl.__all__))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['Run',", "'compare',", "'fit',", "'load']"]
    from pfl.api import Run, compare, fit, load

    assert (pfl.fit, pfl.load, pfl.compare, pfl.Run) == (fit, load, compare, Run)
    assert {"fit", "load", "compare", "Run"} <= set(dir(pfl))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = pfl.nope
