"""``--help`` of the fields whose choices are registries: the registered names, read when the parser
is built (a user's entry registered in this process is listed too)."""

from __future__ import annotations

from jsonargparse import ArgumentParser

from pfl.config import AGGREGATORS, PROTOCOLS
from pfl.data.sources import SOURCES
from pfl.registry import Registry

REGISTRIES: dict[str, Registry] = {
    "server.aggregator": AGGREGATORS,
    "data.source": SOURCES,
    "eval.protocols": PROTOCOLS,
}


def registry_help(parser: ArgumentParser) -> None:
    """Put each registry's choices before the field's own help."""
    for action in parser._actions:
        registry = REGISTRIES.get(action.dest)
        if registry is not None:
            own = (action.help or "").strip()
            action.help = f"{registry.help()}. {own[:1].upper()}{own[1:]}" if own else registry.help()
