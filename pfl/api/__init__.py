"""pfl from Python (and Jupyter): ``fit`` an experiment, ``load`` a run folder, ``compare`` runs.

import pfl
a = pfl.fit("conf/default.yaml", method="ditto", trainer={"rounds": 20})
b = pfl.fit("conf/default.yaml", method="fedavg", trainer={"rounds": 20})
pfl.compare([a, b])            # the report's table (pandas)
a.metrics.plot(x="round", y="pm.l_acc.mean")
"""

from __future__ import annotations

import random

# Importing Lightning draws from Python's global generator: the first ``pfl.fit`` (which imports this
# package) must leave the caller's random draws as they were, like the fit itself does.
_caller_random = random.getstate()
try:
    from pfl.api.fit import fit
    from pfl.api.runs import Run, compare, load
    from pfl.api.state import preserved_global_state
finally:
    random.setstate(_caller_random)

__all__ = ["Run", "compare", "fit", "load", "preserved_global_state"]
