"""The W&B side of a run, as one loop callback (``WandbRun``), under the identity ``wandb_identity`` keeps.

What W&B keeps must be what pfl reports:

- Identity: a run's W&B id is its readable name plus a random suffix (``fedavg-digits-s0-…-3f9a1c2e``),
  stored in the run folder (``wandb_run.json``) so that ``--resume`` continues the same W&B run and a
  new run that reuses a ``--tracking.name`` (or every local sweep's ``run000``) gets a new one.
  ``tracking.group`` (default: the sweep, or the experiment: dataset, clients, partition),
  ``tracking.tags`` (the method and dataset are always tagged) and ``tracking.job_type`` sort hundreds
  of synced runs in the W&B UI.
- History: every evaluated round is logged at ``step = round`` and committed at once; the transaction
  log is flushed every ``FLUSH_SECONDS``, so a killed run loses at most its last round in W&B.
- Resume: online, W&B's own resume (``resume="allow"`` with the stored id) and the rounds the server
  did not get are logged again. Offline, the SDK cannot resume (it ignores ``resume`` and starts a
  second offline folder at step 0), so the resumed process starts the same id afresh, logs the
  checkpoint's whole history first, and deletes the superseded offline folders of that id: one run,
  complete, for ``wandb sync``.
- Summary: at the end the W&B summary is set to summary.json's metrics (the reported round's under
  ``eval.select``, and run-level ones such as ``rounds_to_target`` and ``new.*``) plus
  ``selected_round``, written once after every logged row has reached W&B's service (see
  ``write_summary``); per-round keys that pfl does not report (the last round's values under
  ``eval.select: best_test``) are removed. A sweep therefore optimises the number pfl reports.
- Platform: where the run computes its numbers (``pfl.numeric_platform``, summary.json's ``platform``)
  goes into the run's config as it starts, as ``platform``: its one-line ``label`` and its fields
  (``platform_config``), so runs of a sweep across machines can be grouped and filtered by machine.
  It is config, not summary: the summary stays the reported numbers.
- Console: W&B starts silently; one line at the end says where the run is (and how to upload it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pfl import numeric_platform
from pfl.config import RunConfig
from pfl.data.ecosystem import dataset_label
from pfl.data.sources import is_natural
from pfl.errors import ConfigError
from pfl.federation.loop import Callback, FederatedLoop
from pfl.runner.wandb_identity import WandbIdentity, new_run_id, stored_id, wandb_mode
from pfl.safe_files import ensure_folder, remove_tree

FLUSH_SECONDS = 0.1  # how often W&B writes its transaction log (W&B's default: 15 s)
MEDIA_KEYS = ("clients", "plots/")  # summary entries besides the metrics: the client table, the plots


def experiment_name(cfg: RunConfig) -> str:
    """The data setting a run belongs to, independent of method and seed (the default W&B group):
    ``<dataset>-<clients>c[-iid|-dir<alpha>|-pat<k>]``."""
    d = cfg.data
    name = f"{dataset_label(d.source)}-{d.num_clients}c"
    if is_natural(d.source):
        return name
    return name + {"iid": "-iid", "dirichlet": f"-dir{d.alpha:g}"}.get(d.partition, f"-pat{d.classes_per_client}")


def run_identity(cfg: RunConfig, run_dir: Path, resume: bool) -> WandbIdentity:
    """A resumed run keeps its stored id; any other run gets a new one."""
    t = cfg.tracking
    name = run_dir.name
    run_id = (stored_id(run_dir) if resume else None) or new_run_id(name)
    tags = list(dict.fromkeys([cfg.method.name, dataset_label(cfg.data.source), *t.tags]))
    return WandbIdentity(run_id, name, t.project, t.group or experiment_name(cfg), tags, t.job_type)


class WandbRun(Callback):
    """Per-round metrics, the client table, the plots and the reported summary, to one W&B run."""

    def __init__(self, identity: WandbIdentity, run_dir: Path, config: dict[str, Any], resume: bool = False):
        self.identity, self.run_dir, self.config, self.resume = identity, run_dir, config, resume
        self.run: Any = None
        self.mode = "offline"
        self.next_step = 0  # W&B refuses steps below the run's current one

    # -- start ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the W&B run (once). A start that fails (a setting W&B refuses, no network, no login)
        is one line, and the ``wandb`` folder it made is removed again: the run folder is left as it
        was, so a rerun under the same name is not blocked by a half-made run."""
        if self.run is not None:
            return
        self.mode = wandb_mode()
        if self.mode != "disabled":
            print(f"W&B: starting {self.mode} run {self.identity.id} ({self.run_dir / 'wandb'})", flush=True)
        made = not (self.run_dir / "wandb").exists()
        try:
            self.run = self._init(self.mode)
        except Exception as err:  # pydantic, network and login errors: each stops the run before it trains
            if made:
                remove_tree(self.run_dir / "wandb")
            detail = " ".join(str(err).split())[:300]
            raise ConfigError(
                "tracking.wandb",
                f"W&B could not start run {self.identity.id} ({type(err).__name__}: {detail})",
                "fix what it names (tracking.tags, tracking.project, tracking.group, the method's name), "
                "or run with --tracking.wandb false",
            ) from None
        self.identity.id = self.run.id  # a sweep agent chooses the id itself
        self.identity.save(self.run_dir)
        self.next_step = int(self.run.step)

    def on_fit_start(self, loop: FederatedLoop) -> None:
        self.start()
        # At the start, so a run killed before its end has it too; a resume on another machine replaces
        # the platform the run's earlier process recorded (W&B refuses a changed config value unless allowed).
        platform = platform_config(numeric_platform.record(loop.device))
        self.run.config.update({"platform": platform}, allow_val_change=True)
        for row in loop.history:  # a resumed run: the rounds W&B does not hold yet
            self._log(row)
        if self.run.offline:
            self._drop_superseded_offline_runs()

    def _init(self, mode: str) -> Any:
        import wandb

        ident = self.identity
        settings: dict[str, Any] = {"silent": True}
        # An experimental setting of recent wandb versions (older ones flush every 15 s).
        if "x_transaction_log_flush_interval" in getattr(wandb.Settings, "model_fields", {}):
            settings["x_transaction_log_flush_interval"] = FLUSH_SECONDS
        where: dict[str, Any] = {"project": ident.project, "id": ident.id}
        if os.environ.get("WANDB_SWEEP_ID"):
            where = {}  # the agent has chosen project and id; W&B ignores (and warns about) others
        ensure_folder(self.run_dir / "wandb")  # W&B writes below it: a real folder, never a link
        return wandb.init(
            dir=str(self.run_dir),
            name=ident.name,
            group=ident.group,
            tags=ident.tags,
            job_type=ident.job_type,
            config=self.config,
            mode=mode,
            resume="allow" if self.resume and mode == "online" else None,
            settings=wandb.Settings(**settings),
            **where,
        )

    def _drop_superseded_offline_runs(self) -> None:
        """Earlier offline folders of this id hold a prefix of the history just logged again. An
        entry that is a link (pfl and W&B make none) is removed itself, never what it points to."""
        current = Path(self.run.settings.sync_dir).resolve()
        pattern = re.compile(rf"^offline-run-\d{{8}}_\d{{6}}-{re.escape(self.identity.id)}(-.*)?$")
        for folder in (self.run_dir / "wandb").glob("offline-run-*"):
            superseded = folder.is_symlink() or (folder.is_dir() and folder.resolve() != current)
            if superseded and pattern.match(folder.name):
                remove_tree(folder)

    # -- rounds ---------------------------------------------------------------------------------------
    def on_evaluation(self, loop: FederatedLoop, metrics: dict[str, Any]) -> None:
        self._log(metrics)

    def _log(self, row: dict[str, Any]) -> None:
        step = int(row["round"])
        if step < self.next_step:
            return  # already in W&B (logged before a kill that came before the checkpoint)
        self.run.log({k: v for k, v in row.items() if k != "round"}, step=step, commit=True)
        self.next_step = step + 1

    # -- end ------------------------------------------------------------------------------------------
    def on_fit_end(self, loop: FederatedLoop, summary: dict[str, Any]) -> None:
        import wandb

        rows = loop.selected_rows
        media: dict[str, Any] = {}
        if rows:
            columns = list(rows[0])
            media["clients"] = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        for plot in sorted(self.run_dir.glob("*.png")):  # written by FileOutputs, which runs first
            media[f"plots/{plot.stem}"] = wandb.Image(str(plot), caption=plot.stem)
        write_summary(self.run.summary, summary, media, loop.history)
        offline = self.run.offline
        where = self.run.settings.sync_dir if offline else self.run.url
        self.run.finish()
        if self.mode == "disabled":
            return
        if offline:
            print(f"W&B run {self.identity.id} (offline): {where}\n  upload it with: wandb sync {where}", flush=True)
        else:
            print(f"W&B run {self.identity.id} (online): {where}", flush=True)


def platform_config(rec: dict[str, Any]) -> dict[str, Any]:
    """summary.json's ``platform`` as the W&B config's ``platform``: ``label`` (``numeric_platform.label``,
    one value to group runs by) and the recorded fields (``torch``, ``cpu``, ``cpu_kernels``, ...)."""
    return {"label": numeric_platform.label(rec), **rec}


def reported_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """What the W&B summary must hold: summary.json's metrics and the reported round."""
    return {**summary["metrics"], "selected_round": summary["selected_round"]}


def write_summary(target: Any, summary: dict[str, Any], media: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """Make the W&B run summary (``target``) exactly the reported numbers and the end-of-run objects.

    W&B's service derives summary entries from each logged history row when it processes that row,
    which can be after calls made later in this process. Reading the summary is a round trip through
    the same service queue: once it returns, every logged row has been processed, so nothing derived
    from the history can land after what is written here."""
    current = set(target.keys())  # the round trip (empty if W&B timed out: then the logged keys)
    current |= {k for row in history for k in row if k != "round"}
    final = {**reported_summary(summary), **media}
    target.update(final)
    for key in sorted(current - set(final)):
        if not key.startswith("_"):  # W&B's own entries (_step, _runtime, _wandb, ...)
            del target[key]


def wandb_callback(cfg: RunConfig, run_dir: Path, config: dict[str, Any], resume: bool) -> WandbRun:
    """The W&B callback of a run in ``run_dir`` (a resumed run continues its stored W&B id)."""
    return WandbRun(run_identity(cfg, run_dir, resume), run_dir, config, resume)
