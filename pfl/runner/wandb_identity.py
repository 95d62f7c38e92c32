"""Who a run is in W&B: its id (readable name plus a random suffix), stored in the run folder
(``wandb_run.json``) so that ``--resume`` continues the same W&B run, and whether W&B runs online.
Standard library only: ``pfl report --wandb`` reads identities without importing torch."""

from __future__ import annotations

import json
import netrc
import os
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pfl.safe_files import write_atomic

IDENTITY_FILE = "wandb_run.json"
ID_NAME_CHARS = 48  # the readable part of an id; W&B ids must stay short


def wandb_mode() -> str:
    """'online' when the user is logged in (API key in the environment or ~/.netrc), else 'offline'.
    An explicit WANDB_MODE always wins."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    return "offline"


def new_run_id(name: str) -> str:
    """``name`` reduced to W&B's id alphabet (letters, digits, - and _), plus 8 random hex digits:
    unique across sweeps and reruns, still readable."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:ID_NAME_CHARS] or "run"
    return f"{readable}-{secrets.token_hex(4)}"


@dataclass
class WandbIdentity:
    """Who the run is in W&B; ``id`` is stored in the run folder and reused on resume."""

    id: str
    name: str
    project: str
    group: str
    tags: list[str] = field(default_factory=list)
    job_type: str = "fit"

    def save(self, run_dir: Path) -> None:
        write_atomic(run_dir / IDENTITY_FILE, json.dumps(asdict(self), indent=2) + "\n")


def stored_identity(run_dir: Path) -> WandbIdentity | None:
    """The W&B identity recorded in ``run_dir`` (None when the run never logged to W&B, or the file
    is not one pfl wrote)."""
    path = run_dir / IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        fields = json.loads(path.read_text())
        return WandbIdentity(**{k: fields[k] for k in ("id", "name", "project", "group", "tags", "job_type")})
    except (ValueError, KeyError, TypeError):
        return None


def stored_id(run_dir: Path) -> str | None:
    """The W&B id recorded in ``run_dir`` (None when the run never logged to W&B)."""
    identity = stored_identity(run_dir)
    return None if identity is None else str(identity.id)
