"""What ``python -m pfl data`` and ``data export|stats --help`` print: standard library only, so the
command line answers them without importing torch (``pfl.commands.data`` does the work)."""

from __future__ import annotations

EXPORT_USAGE = (
    "python -m pfl data export --format npz DIR [--overwrite] [--config FILE ...] [--data.KEY VALUE ...] [--seed N]"
)
STATS_USAGE = (
    "python -m pfl data stats [--json] [--plot FILE.png] [--config FILE ...] [--data.KEY VALUE ...] [--seed N]"
)
NOTES = (
    "  export: DIR must be new or empty; --overwrite replaces an earlier export whole (never a mix of two\n"
    "    partitions) and refuses a folder that no export wrote or that holds other files\n"
    "  --config FILE and --data.KEY VALUE: as for `python -m pfl fit` (see `python -m pfl fit --help`)"
)
USAGE = f"usage: python -m pfl data {{export,stats}} [options]\n  {EXPORT_USAGE}\n  {STATS_USAGE}\n{NOTES}\n"


def help_text(argv: list[str]) -> str | None:
    """The usage ``argv`` (the words after ``data``) asks for: none given, ``-h``/``--help``, or
    ``export|stats ... --help``; None when it asks for the work itself."""
    if not argv or argv[0] in ("-h", "--help"):
        return USAGE
    command, rest = argv[0], argv[1:]
    if command in ("export", "stats") and {"-h", "--help"} & set(rest):
        usage = EXPORT_USAGE if command == "export" else STATS_USAGE
        return "usage: " + usage + "\n" + (NOTES if command == "export" else NOTES.splitlines()[-1])
    return None
