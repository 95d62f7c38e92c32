"""``python -m pfl fit --help`` without building the parser: a built-in method's help is rendered from
``fit_help.json``, an index of what jsonargparse's formatter prints of each option (its final help text,
with the "(type: ..., default: ...)" it appends). Building the parser reads the method and config classes,
whose modules import torch and Lightning (seconds); this module imports only the standard library and
``pfl.runner.method_choice``.

The index is used only while its fingerprint matches this installation: the content of every
``pfl/**/*.py``, the Python version (typing's reprs differ between versions) and the packages that shape
the text. Otherwise (edited sources, a user's method class, no index) the help comes from the parser
itself, so the text is the same either way. ``python -m pfl.runner.fit_help_index --write`` regenerates
the index; the suite fails while it is stale.

The index also holds what each built-in method's runs ran with where their config.yaml lacks an option
(``method_defaults``), which ``pfl report`` uses to fill such options, again without importing torch.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

INDEX = Path(__file__).with_name("fit_help.json")
PACKAGE = Path(__file__).resolve().parents[1]
# jsonargparse formats the help; docstring-parser (when installed) gives it the fields' descriptions
HELP_PACKAGES = ("jsonargparse", "docstring-parser")


def fingerprint(package: Path = PACKAGE) -> dict[str, Any]:
    """What the help text depends on besides the method name: Python, the packages that render it and
    the sources of ``package`` (every ``*.py`` below it, by relative path and content)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py"), key=lambda p: p.relative_to(package).as_posix()):
        content = path.read_bytes()
        digest.update(f"{path.relative_to(package).as_posix()}\0{len(content)}\0".encode())
        digest.update(content)
    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "packages": {name: _version(name) for name in HELP_PACKAGES},
        "sources": digest.hexdigest(),
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def fit_help(argv: list[str]) -> str:
    """The help of the method ``argv`` chooses (its ``-h``/``--help`` removed), as
    ``build_fit_parser(name).format_help()`` writes it."""
    from pfl.runner.method_choice import method_from_argv

    name, _ = method_from_argv(argv)
    text = indexed_help(name)
    if text is None:
        from pfl.runner.args import build_fit_parser

        text = build_fit_parser(name).format_help()
    return text


def indexed_help(name: str, index_path: Path | None = None) -> str | None:
    """The help of built-in method ``name`` from the index (``INDEX`` unless given); None when the index
    has no such method, is missing or unreadable, or was made from other sources than these."""
    index = current_index(index_path or INDEX)
    if index is None or name not in index.get("parsers", {}):
        return None
    return render(index, name)


def current_index(path: Path) -> dict[str, Any] | None:
    """The index in ``path``; None when it is missing, unreadable or made from other sources than these."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or index.get("fingerprint") != fingerprint():
        return None
    return index


def method_defaults(name: str) -> dict[str, Any] | None:
    """What a run of method ``name`` whose config.yaml lacks an option ran with, as
    ``pfl.runner.args.recorded_defaults`` gives it (the defaults, except options whose default changed
    after runs were recorded): from the index for a built-in method, else from the method's parser (None
    for a name this pfl cannot build). A fresh copy at every call."""
    indexed = _indexed_defaults(INDEX)
    if name in indexed:
        return copy.deepcopy(indexed[name])
    from pfl.runner.args import recorded_defaults

    return recorded_defaults(name)


@functools.cache
def _indexed_defaults(path: Path) -> dict[str, dict[str, Any]]:
    """Every indexed method's defaults, read once per process ({} without a current index)."""
    index = current_index(path)
    return {} if index is None else {name: indexed_defaults(index, name) for name in index.get("defaults", {})}


def indexed_defaults(index: dict[str, Any], name: str) -> dict[str, Any]:
    """Method ``name``'s default config from ``index``: each top-level entry is stored once, by position."""
    return {key: index["values"][i] for key, i in index["defaults"][name].items()}


class IndexedAction(argparse.Action):
    """An option as the index records it: what the formatter prints of it, already rendered."""

    def __init__(self, record: dict[str, Any]) -> None:
        shown = argparse.SUPPRESS if record["suppressed"] else record["help"]
        super().__init__(record["options"], record["dest"], record["nargs"], required=record["required"], help=shown)
        self.args: str | None = record["args"]  # the metavar part, as in "--seed SEED"
        self.usage_text: str = record["usage"]  # what the usage shows of an option that takes no value
        self.in_usage: bool = record["in_usage"]  # jsonargparse leaves -h and --print_config out of it

    def format_usage(self) -> str:
        return self.usage_text


class IndexFormatter(argparse.HelpFormatter):
    """argparse's own layout (the wrapping, the widths from COLUMNS) of the recorded texts."""

    def add_usage(self, usage: str | None, actions: Iterable[argparse.Action], groups: Any, prefix: Any = None) -> None:
        super().add_usage(usage, [a for a in actions if isinstance(a, IndexedAction) and a.in_usage], groups, prefix)

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        return action.args if isinstance(action, IndexedAction) and action.args is not None else ""

    def _expand_help(self, action: argparse.Action) -> str:
        return action.help or ""


def render(index: dict[str, Any], name: str) -> str:
    """Method ``name``'s help from ``index``, laid out as ``argparse.ArgumentParser.format_help`` does."""
    parser = index["parsers"][name]
    actions: dict[int, IndexedAction] = {}

    def action(i: int) -> IndexedAction:
        if i not in actions:
            actions[i] = IndexedAction(index["actions"][i])
        return actions[i]

    formatter = IndexFormatter(prog=parser["prog"])
    formatter.add_usage(parser["usage"], [action(i) for i in parser["actions"]], [])
    formatter.add_text(parser["description"])
    for g in parser["groups"]:
        group = index["groups"][g]
        formatter.start_section(group["title"])
        formatter.add_text(group["description"])
        formatter.add_arguments([action(i) for i in group["actions"]])
        formatter.end_section()
    formatter.add_text(parser["epilog"])
    return formatter.format_help()
