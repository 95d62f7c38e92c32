"""A comparison's figures in W&B: one run of job type ``report`` beside the runs it compares.

The compared runs are not changed: W&B cannot resume a run offline (it starts a second folder of the
same id at step 0, and ``wandb sync`` keeps one of the two), so adding a figure to them could replace
their history. The report run is new, in the runs' project and (when they share one) their group, and
names the runs it compares in its config.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pfl.errors import ConfigError
from pfl.runner.wandb_identity import IDENTITY_FILE, WandbIdentity, new_run_id, stored_identity, wandb_mode
from pfl.safe_files import ensure_folder

REPORT_GROUP = "report"  # the group of a report over runs of several groups
REPORT_JOB = "report"


def report_identity(run_dirs: list[Path]) -> tuple[WandbIdentity, list[str]]:
    """The report run's identity and the compared runs' W&B ids; a one-line error when none of the
    runs logged to W&B or they are in several projects (checked before anything is drawn)."""
    found = {d: stored_identity(d) for d in run_dirs}
    known = [i for i in found.values() if i is not None]
    if not known:
        raise ConfigError(
            "--wandb",
            f"none of the runs logged to W&B (no {IDENTITY_FILE} in {', '.join(map(str, run_dirs))})",
            "run them with --tracking.wandb true, or drop --wandb",
        )
    projects = sorted({i.project for i in known})
    if len(projects) > 1:
        raise ConfigError(
            "--wandb", f"the runs are in several W&B projects: {', '.join(projects)}", "report one project's runs"
        )
    groups = {i.group for i in known}
    group = groups.pop() if len(groups) == 1 else REPORT_GROUP
    name = f"report-{time.strftime('%Y%m%d-%H%M%S')}"
    identity = WandbIdentity(new_run_id(name), name, projects[0], group, ["report"], REPORT_JOB)
    return identity, [i.id for i in known]


def log_report(identity: WandbIdentity, runs: list[str], figures: dict[str, Path], folder: Path) -> str:
    """Log ``figures`` (key -> image file) to a new W&B run under ``folder``/wandb; returns the line
    that says where it is."""
    import wandb

    ensure_folder(folder / "wandb")
    mode = wandb_mode()
    run: Any = wandb.init(
        dir=str(folder),
        project=identity.project,
        id=identity.id,
        name=identity.name,
        group=identity.group,
        tags=identity.tags,
        job_type=identity.job_type,
        config={"runs": runs},
        mode=mode,
        settings=wandb.Settings(silent=True),
    )
    images = {f"plots/{key}": wandb.Image(str(path), caption=key) for key, path in figures.items()}
    run.log(images, step=0)  # committed by finish()
    offline, where = run.offline, (run.settings.sync_dir if run.offline else run.url)
    run.finish()
    if offline:
        return f"W&B report run {identity.id} (offline): {where}\n  upload it with: wandb sync {where}"
    return f"W&B report run {identity.id} ({mode}): {where}"
