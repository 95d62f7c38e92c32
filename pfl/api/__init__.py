"""pfl from Python (and Jupyter): ``fit`` an experiment, ``load`` a run folder, ``compare`` runs.

import pfl
a = pfl.fit("conf/default.yaml", method="ditto", trainer={"rounds": 20})
b = pfl.fit("conf/default.yaml", method="fedavg", trainer={"rounds": 20})
pfl.compare([a, b])            # the report's table (pandas)
a.metrics.plot(x="round", y="pm.l_acc.mean")
"""

from __future__ import annotations

from pfl.api.fit import fit, preserved_global_state
from pfl.api.runs import Run, compare, load

__all__ = ["Run", "compare", "fit", "load", "preserved_global_state"]
