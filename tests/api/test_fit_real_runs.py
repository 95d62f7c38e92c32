"""pfl.fit takes the command line's path: two fits in one process give what two `python -m pfl fit` runs give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pfl.api.overrides import to_argv
from pfl.federation.loop import comparable_metrics
from tests.api.helpers import CONFIG, ROOT, TINY, tiny_fit


def test_two_fits_in_one_process_equal_two_command_line_runs(tmp_path):
    ditto = tiny_fit(tmp_path, "a", method="ditto", **{"method.lam": 0.5})
    fedavg = tiny_fit(tmp_path, "b", method={"class_path": "pfl.methods.fedavg.FedAvg"}, seed=3)
    argv = [sys.executable, "-m", "pfl", "fit", *to_argv(CONFIG, TINY)]
    for run, extra in ((ditto, ["--method", "ditto", "--method.lam", "0.5"]), (fedavg, ["--seed", "3"])):
        name = f"cli-{run.path.name}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
        out = subprocess.run(
            [*argv, *extra, "--tracking.root", str(tmp_path), "--tracking.name", name],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        cli = json.loads((tmp_path / name / "summary.json").read_text())
        assert comparable_metrics(run.summary) == comparable_metrics(cli)
        assert (run.path / "config.yaml").read_text() == (tmp_path / name / "config.yaml").read_text().replace(
            f"name: {name}", f"name: {run.path.name}"
        )
