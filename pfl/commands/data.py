"""``python -m pfl data export|stats``: write a federation in the npz layout, or describe it (a table,
or one JSON line with ``--json``).

Both take the same ``--config`` files and dotted overrides as ``fit`` (parsed by the fit parser), so
``--data.partition pathological --data.num_clients 50`` means the same everywhere.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from pfl.data import build_data
from pfl.data.npz import export_npz
from pfl.data.stats import federation_stats, format_stats
from pfl.errors import ConfigError
from pfl.metrics.plots import plot_heatmap
from pfl.runner.args import parse_fit_args

USAGE = """usage:
  python -m pfl data export --format npz DIR [--config FILE ...] [--data.KEY VALUE ...] [--seed N]
  python -m pfl data stats [--json] [--plot FILE.png] [--config FILE ...] [--data.KEY VALUE ...] [--seed N]
"""
FORMATS = ("npz",)


def _take(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """Remove ``flag VALUE`` (or ``flag=VALUE``) from argv."""
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv):
                raise ConfigError(flag, "needs a value", USAGE.strip())
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1 :]
    return None, argv


def export(argv: list[str]) -> Path:
    fmt, argv = _take(argv, "--format")
    fmt = fmt or "npz"
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r}", f"choose one of {', '.join(FORMATS)}")
    if not argv or argv[0].startswith("-"):
        raise ConfigError("DIR", "export needs an output directory", USAGE.strip())
    out_dir, rest = Path(argv[0]), argv[1:]
    cfg, *_ = parse_fit_args(rest)
    data = build_data(cfg.data, cfg.seed)
    export_npz(data, out_dir, {"seed": cfg.seed, "data": asdict(cfg.data)})
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
        plot_heatmap(data, Path(plot))
        report["plot"] = plot
    print(json.dumps(report) if as_json else format_stats(report), end="\n" if as_json else "")
    return report


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command == "export":
        export(rest)
    elif command == "stats":
        stats(rest)
    else:
        raise ConfigError("data", f"unknown data command {command!r}", "choose export or stats")
