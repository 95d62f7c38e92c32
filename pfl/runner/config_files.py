"""Where ``--config`` files come from: a path, else a config shipped with pfl, named from anywhere.

The experiment configs live in the checkout's ``conf/``; an installed pfl carries the same files as
package data in ``pfl/conf/`` (setup.py maps one onto the other). ``--config default``,
``--config method/ditto`` and ``--config conf/method/ditto.yaml`` all name a shipped file, so the
commands in the docs work from any folder; an existing path always wins.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from pfl.errors import ConfigError
from pfl.suggest import did_you_mean

PACKAGE = Path(__file__).resolve().parents[1]  # the pfl package folder
SUFFIXES = (".yaml", ".yml")


def conf_dir() -> Path:
    """The shipped configs: ``pfl/conf`` in an installed pfl, the checkout's ``conf/`` beside ``pfl/``."""
    installed = PACKAGE / "conf"
    return installed if installed.is_dir() else PACKAGE.parent / "conf"


def shipped_configs() -> list[str]:
    """The names of the shipped configs, as ``--config`` takes them (``default``, ``method/ditto``), sorted."""
    root = conf_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*") if p.suffix in SUFFIXES)


def _name(value: str | PathLike) -> str:
    return str(value).replace("\\", "/").removeprefix("./").removeprefix("conf/")


def shipped_config(value: str | PathLike) -> Path | None:
    """The shipped config that ``value`` names (a leading ``conf/`` and the ``.yaml`` suffix optional:
    ``default``, ``method/ditto``, ``conf/default.yaml``); None when there is none."""
    name, root = _name(value), conf_dir().resolve()
    for candidate in (root / name, *(root / f"{name}{suffix}" for suffix in SUFFIXES)):
        # a name never reaches outside the shipped folder (e.g. ../../somewhere, an absolute path)
        if candidate.resolve().is_relative_to(root) and candidate.is_file():
            return candidate
    return None


def resolve_config(value: str) -> Path:
    """The file ``--config value`` reads: ``value`` when that path exists, else the shipped config it names
    (a leading ``conf/`` and the ``.yaml`` suffix optional). Neither: a one-line ConfigError."""
    path = Path(value).expanduser()
    if path.exists():
        return path
    found = shipped_config(value)
    if found is not None:
        return found
    stem = _name(value).removesuffix(".yaml").removesuffix(".yml")
    raise ConfigError(
        "--config",
        f"file not found: {value}",
        did_you_mean(stem, shipped_configs())
        or "give the path of a YAML file, or the name of a config shipped with pfl such as default or method/ditto",
    )
