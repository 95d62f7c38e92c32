"""The configs that ship with pfl (``conf/``), found by name from any working directory."""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def shipped_config(given: str | Path) -> Path | None:
    """The shipped config that ``given`` names: ``conf/default.yaml``, ``default.yaml`` or ``default``,
    ``method/ditto``; None when there is none (or ``given`` is absolute)."""
    given = Path(given)
    if given.is_absolute():
        return None
    for candidate in (CONF_DIR.parent / given, CONF_DIR / given):
        for file in (candidate, candidate.with_name(candidate.name + ".yaml")):
            if file.is_file():
                return file
    return None
