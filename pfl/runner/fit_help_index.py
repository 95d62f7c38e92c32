"""Writes ``pfl/runner/fit_help.json``, the index ``pfl.runner.fit_help`` renders ``fit --help`` from:
``python -m pfl.runner.fit_help_index --write`` (without ``--write``: exit 1 while the committed one is stale).

Each built-in method's parser is built and its help formatted by jsonargparse's own formatter, which
records what it prints of every option; the options and groups the methods share are stored once.
Every method's help rendered from the new index is compared with the parser's before it is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pfl.runner.fit_help import INDEX, fingerprint, indexed_defaults, render
from pfl.safe_files import write_atomic

REGENERATE = "python -m pfl.runner.fit_help_index --write"


def _recorded(parser: Any) -> tuple[str, dict[int, str], dict[int, str], set[int]]:
    """``parser.format_help()`` and, by action, the help text and the arguments' text the formatter
    printed, and the actions the usage holds."""
    helps: dict[int, str] = {}
    args: dict[int, str] = {}
    used: set[int] = set()
    base = parser.formatter_class

    class UsageTap(argparse.HelpFormatter):  # below jsonargparse's formatter: sees the options it keeps
        def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
            used.update(id(a) for a in actions)
            return super()._format_usage(usage, actions, groups, prefix)

    class Recording(base, UsageTap):  # type: ignore[misc,valid-type]
        def _expand_help(self, action: argparse.Action) -> str:
            helps[id(action)] = text = super()._expand_help(action)  # the last expansion is the one shown
            return text

        def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
            text = super()._format_args(action, default_metavar)
            if args.setdefault(id(action), text) != text:
                raise RuntimeError(f"{action.dest}: its arguments are formatted two ways, the index keeps one")
            return text

    parser.formatter_class = Recording
    try:
        text = parser.format_help()
    finally:
        parser.formatter_class = base
    return text, helps, args, used


def _action_record(action: argparse.Action, helps: dict[int, str], args: dict[int, str], used: set[int]) -> dict:
    if not action.option_strings or hasattr(action, "_get_subactions"):
        raise RuntimeError(f"{action.dest}: the index holds options only (no positionals or subcommands)")
    return {
        "options": list(action.option_strings),
        "dest": action.dest,
        "nargs": action.nargs,
        "required": bool(action.required),
        "suppressed": action.help == argparse.SUPPRESS,
        "help": helps.get(id(action)),
        "args": args.get(id(action)),
        "usage": action.format_usage(),
        "in_usage": id(action) in used,
    }


class _Pool:
    """Records stored once, by index, however many parsers hold them."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self._at: dict[str, int] = {}

    def add(self, record: Any) -> int:
        key = json.dumps(record, sort_keys=True)
        if key not in self._at:
            self._at[key] = len(self.records)
            self.records.append(record)
        return self._at[key]


def build_index() -> dict[str, Any]:
    """The index of every built-in method's ``fit --help``, checked against the parsers' own."""
    from pfl.methods.registry import method_names
    from pfl.runner.args import build_fit_parser, recorded_defaults

    actions, groups, values, parsers, defaults, expected = _Pool(), _Pool(), _Pool(), {}, {}, {}
    for name in method_names():
        parser = build_fit_parser(name)
        if parser._mutually_exclusive_groups:
            raise RuntimeError(f"{name}: the index holds no mutually exclusive groups")
        expected[name], helps, args, used = _recorded(parser)
        at = {id(a): actions.add(_action_record(a, helps, args, used)) for a in parser._actions}
        parsers[name] = {
            "prog": parser.prog,
            "usage": parser.usage,
            "description": parser.description,
            "epilog": parser.epilog,
            "actions": [at[id(a)] for a in parser._actions],
            "groups": [
                groups.add(
                    {"title": g.title, "description": g.description, "actions": [at[id(a)] for a in g._group_actions]}
                )
                for g in parser._action_groups
            ],
        }
        defaults[name] = {key: values.add(value) for key, value in (recorded_defaults(name) or {}).items()}
    index = {
        "fingerprint": fingerprint(),
        "actions": actions.records,
        "groups": groups.records,
        "parsers": parsers,
        "values": values.records,
        "defaults": defaults,
    }
    for name, text in expected.items():
        if render(index, name) != text:
            raise RuntimeError(f"{name}: the help rendered from the index differs from the parser's")
        if indexed_defaults(index, name) != recorded_defaults(name):
            raise RuntimeError(f"{name}: the default config read from the index differs from the parser's")
    return index


def index_text() -> str:
    """The index file's content: one option or group a line, so that a change reads as a short diff."""
    index = build_index()
    lines = ["{", f' "fingerprint": {json.dumps(index["fingerprint"], sort_keys=True)},']
    for key in ("actions", "groups"):
        records = [f"  {json.dumps(r, ensure_ascii=False)}" for r in index[key]]
        lines += [f' "{key}": [', ",\n".join(records), " ],"]
    parsers = [f'  "{name}": {json.dumps(p, ensure_ascii=False)}' for name, p in index["parsers"].items()]
    lines += [' "parsers": {', ",\n".join(parsers), " },"]
    values = [f"  {json.dumps(v, ensure_ascii=False)}" for v in index["values"]]
    lines += [' "values": [', ",\n".join(values), " ],"]
    defaults = [f'  "{name}": {json.dumps(d)}' for name, d in index["defaults"].items()]
    lines += [' "defaults": {', ",\n".join(defaults), " }", "}"]
    return "\n".join(lines) + "\n"


def stale(path: Path, text: str) -> str | None:
    """Why ``path`` is not ``text`` (missing or out of date, with the command that fixes it), else None."""
    if not path.exists():
        return f"{path.name} is missing: run {REGENERATE}"
    if path.read_text(encoding="utf-8") != text:
        return f"{path.name} is stale: run {REGENERATE}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pfl.runner.fit_help_index", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {INDEX.name} (else only check it)")
    args = parser.parse_args(argv)
    text = index_text()
    if args.write:
        write_atomic(INDEX, text)
        print(f"wrote {INDEX}")
        return 0
    problem = stale(INDEX, text)
    print(problem or f"{INDEX.name} is up to date")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
