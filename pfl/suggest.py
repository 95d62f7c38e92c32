"""Suggestions ("did you mean ...?") for a mistyped option, method, model, data source or choice.

One rule for every unknown name: the closest known name (difflib, case-insensitive) when one is
close; otherwise the options themselves (option keys and methods, too many for one line, point to
``--help`` and ``python -m pfl methods`` instead: ``pfl.runner.args``, ``pfl.methods.registry``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's similarity ratio below which a name is not offered (its own default)


def close_matches(word: str, options: Iterable[str], n: int = 1) -> list[str]:
    """Up to ``n`` of ``options`` closest to ``word``, best first; case is ignored."""
    by_lower: dict[str, str] = {}
    for option in options:
        by_lower.setdefault(str(option).lower(), str(option))
    found = difflib.get_close_matches(str(word).lower(), list(by_lower), n=n, cutoff=CUTOFF)
    return [by_lower[f] for f in found]


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """``"did you mean X?"`` (or ``"X or Y"``) for the options close to ``word``; "" when none is."""
    return offer(close_matches(word, options))


def offer(found: list[str]) -> str:
    """``"did you mean X or Y?"`` for ``found`` names; "" for none."""
    return f"did you mean {' or '.join(found)}?" if found else ""


def choice_fix(word: str, options: Iterable[str]) -> str:
    """The fix for an unknown ``word`` among a few ``options``: the close one, else every option."""
    options = [str(o) for o in options]
    return did_you_mean(word, options) or f"choose one of {', '.join(options)}"
