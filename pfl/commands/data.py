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

from pfl.data import build_data
from pfl.data.npz import export_npz
from pfl.data.stats import federation_stats, format_stats
from pfl.errors import ConfigError
from pfl.metrics.plots import data_setting, plot_heatmap
from pfl.runner.args import parse_fit_args

EXPORT_USAGE = (
    "python -m pfl data export --format npz DIR [--overwrite] [--config FILE ...] [--data.KEY VALUE ...] [--seed N]"
)
STATS_USAGE = (
    "python -m pfl data stats [--json] [--plot FILE.png] [--config FILE ...] [--data.KEY VALUE ...] [--seed N]"
)
NOTES = (
    "  export: DIR must be new or empty; --overwrite replaces a non-empty DIR whole (never a mix of two partitions)\n"
    "  --config FILE and --data.KEY VALUE: as for `python -m pfl fit` (see `python -m pfl fit --help`)"
)
USAGE = f"usage: python -m pfl data {{export,stats}} [options]\n  {EXPORT_USAGE}\n  {STATS_USAGE}\n{NOTES}\n"
FORMATS = ("npz",)


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
    anything and ``--overwrite`` is not given."""
    out_dir = Path(os.path.realpath(out_dir))
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("DIR", f"{out_dir} is not a folder", "choose a folder for the export")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ConfigError(
            "DIR",
            f"{out_dir} is not empty (it may hold another partition, and a mix of two trains silently)",
            "pass --overwrite to replace it whole, or export to a new folder",
        )
    return out_dir


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
    cfg, *_ = parse_fit_args(rest)
    data = build_data(cfg.data, cfg.seed)
    write_whole(out_dir, lambda folder: export_npz(data, folder, {"seed": cfg.seed, "data": asdict(cfg.data)}))
    print(json.dumps({"dir": str(out_dir), "clients": data.num_clients, "new_clients": len(data.new_clients)}))
    return out_dir


def _flag(argv: list[str], flag: str) -> tuple[bool, list[str]]:
    """Remove a switch (no value) from argv."""
    return flag in argv, [a for a in argv if a != flag]


def stats(argv: list[str]) -> dict:
    """A table per client and a summary line (``--json``: the whole description as one JSON line)."""
    as_json, argv = _flag(argv, "--json")
    plot, rest = _take(argv, "--plot")
    cfg, *_ = parse_fit_args(rest)
    data = build_data(cfg.data, cfg.seed)
    report = federation_stats(data)
    if plot:
        plot_heatmap(data, Path(plot), data_setting(asdict(cfg.data)))
        report["plot"] = plot
    print(json.dumps(report) if as_json else format_stats(report), end="\n" if as_json else "")
    return report


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command in ("export", "stats") and {"-h", "--help"} & set(rest):
        print("usage: " + (EXPORT_USAGE if command == "export" else STATS_USAGE))
        print(NOTES if command == "export" else NOTES.splitlines()[-1])
        return
    if command == "export":
        export(rest)
    elif command == "stats":
        stats(rest)
    else:
        raise ConfigError("data", f"unknown data command {command!r}", "choose export or stats")
