"""``python -m pfl data export|stats``: write a federation in the npz layout, or describe it (a table,
or one JSON line with ``--json``).

Both take the same ``--config`` files and dotted overrides as ``fit`` (parsed by the fit parser), so
``--data.partition pathological --data.num_clients 50`` means the same everywhere.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from pfl.commands.data_usage import EXPORT_USAGE
from pfl.config import RunConfig
from pfl.data import FederatedData, build_data
from pfl.data.npz import export_npz
from pfl.data.stats import federation_stats, format_stats
from pfl.errors import ConfigError
from pfl.metrics.plots import data_setting, plot_heatmap
from pfl.runner.args import parse_fit_args

FORMATS = ("npz",)
MARKER = ".pfl-export"  # every export holds it: --overwrite replaces only a folder that does
EXPORT_FILES = ("config.json", "global_test.npz", MARKER)
SPLIT_DIRS = ("train", "test", "val")  # each holds <id>.npz files only


def _take(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """Remove ``flag VALUE`` (or ``flag=VALUE``) from argv."""
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv):
                raise ConfigError(flag, "needs a value", "see python -m pfl data --help")
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1 :]
    return None, argv


def _target(out_dir: Path, overwrite: bool) -> Path:
    """Where the export goes: ``out_dir`` (through a link, its target), refused if it already holds
    anything, unless ``--overwrite`` is given and it holds an earlier export and nothing else."""
    out_dir = Path(os.path.realpath(out_dir))
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("DIR", f"{out_dir} is not a folder", "choose a folder for the export")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return out_dir
    if not overwrite:
        raise ConfigError(
            "DIR",
            f"{out_dir} is not empty (it may hold another partition, and a mix of two trains silently)",
            "pass --overwrite to replace it whole, or export to a new folder",
        )
    if not (out_dir / MARKER).is_file():
        raise ConfigError(
            "DIR",
            f"--overwrite replaces only a folder an earlier `pfl data export` wrote (it holds {MARKER}); "
            f"{out_dir} has none, so it is left as it is",
            "export to a new folder, or move its files away first",
        )
    foreign = _foreign(out_dir)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(
            "DIR",
            f"{out_dir} holds an earlier export and files an export does not write ({shown}), so it is left as it is",
            "move those files away first, or export to a new folder",
        )
    return out_dir


def _is_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _shown(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder``, a folder with a trailing slash."""
    return str(path.relative_to(folder)) + ("/" if path.is_dir() and not path.is_symlink() else "")


def _foreign(folder: Path) -> list[str]:
    """The entries of ``folder`` that an export does not write: anything but ``EXPORT_FILES`` and
    ``<id>.npz`` files in ``SPLIT_DIRS`` (links included: replacing the folder would drop them)."""
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name in SPLIT_DIRS and entry.is_dir() and not entry.is_symlink():
            for file in sorted(entry.iterdir()):
                if not (file.suffix == ".npz" and file.stem.isdigit() and _is_file(file)):
                    found.append(_shown(file, folder))
        elif not (entry.name in EXPORT_FILES and _is_file(entry)):
            found.append(_shown(entry, folder))
    return found


def _sibling(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def write_whole(out_dir: Path, write: Callable[[Path], object]) -> None:
    """Run ``write`` into a temporary sibling of ``out_dir``, then swap it in whole by two renames:
    a reader never sees a mix of two partitions, and a failed export leaves the old folder as it was."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    fresh = _sibling(out_dir, "new")
    fresh.mkdir()
    try:
        write(fresh)
        if out_dir.exists():
            old = _sibling(out_dir, "old")
            os.rename(out_dir, old)
            os.rename(fresh, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(fresh, out_dir)
    finally:
        if fresh.exists():
            shutil.rmtree(fresh)


def export(argv: list[str]) -> Path:
    fmt, argv = _take(argv, "--format")
    overwrite, argv = _flag(argv, "--overwrite")
    fmt = fmt or "npz"
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r}", f"choose one of {', '.join(FORMATS)}")
    if not argv or argv[0].startswith("-"):
        raise ConfigError("DIR", "export needs an output directory", f"usage: {EXPORT_USAGE}")
    out_dir, rest = _target(Path(argv[0]), overwrite), argv[1:]
    cfg = _settings(rest, "export")
    data = build_data(cfg.data, cfg.seed)
    extra = {"seed": cfg.seed, "data": asdict(cfg.data)}
    write_whole(out_dir, lambda folder: _export_marked(data, folder, extra))
    print(json.dumps({"dir": str(out_dir), "clients": data.num_clients, "new_clients": len(data.new_clients)}))
    return out_dir


def _export_marked(data: FederatedData, folder: Path, extra: dict) -> None:
    """The export, then its marker: a later ``--overwrite`` may replace this folder (and only such a one)."""
    export_npz(data, folder, extra)
    (folder / MARKER).write_text(json.dumps({"written_by": "python -m pfl data export", "format": "npz"}) + "\n")


def _settings(argv: list[str], command: str) -> RunConfig:
    """The fit parser's reading of the data options; its refusal names the data command it came from."""
    try:
        cfg, *_ = parse_fit_args(argv)
    except ConfigError as err:
        raise ConfigError(f"data {command}: {err.field}", err.problem, err.fix) from None
    return cfg


def _flag(argv: list[str], flag: str) -> tuple[bool, list[str]]:
    """Remove a switch (no value) from argv."""
    return flag in argv, [a for a in argv if a != flag]


def stats(argv: list[str]) -> dict:
    """A table per client and a summary line (``--json``: the whole description as one JSON line)."""
    as_json, argv = _flag(argv, "--json")
    plot, rest = _take(argv, "--plot")
    cfg = _settings(rest, "stats")
    data = build_data(cfg.data, cfg.seed)
    report = federation_stats(data)
    if plot:
        plot_heatmap(data, Path(plot), data_setting(asdict(cfg.data)))
        report["plot"] = plot
    print(json.dumps(report) if as_json else format_stats(report), end="\n" if as_json else "")
    return report


def main(argv: list[str]) -> None:
    """``data export|stats``; the command line answers the usage (``data_usage.help_text``) before it
    imports this module."""
    command, rest = argv[0], argv[1:]
    if command == "export":
        export(rest)
    elif command == "stats":
        stats(rest)
    else:
        raise ConfigError("data", f"unknown data command {command!r}", "choose export or stats")
