""" "Did you mean ...?" for a mistyped option, method, model, data source or choice.

One rule for every unknown name: the closest known names (difflib, case-insensitive) when one is
close; otherwise the options themselves, or where they are listed when there are too many for one line.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's similarity ratio below which a name is not offered (its own default)
MAX_LISTED = 12  # longer lists of options are pointed to (e.g. --help) instead of printed in the error


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


def choice_fix(word: str, options: Iterable[str], listing: str = "") -> str:
    """The fix for an unknown ``word``: the close options, else every option when they fit on one line,
    else ``listing`` (where they are listed, e.g. "python -m pfl methods lists them")."""
    options = [str(o) for o in options]
    close = did_you_mean(word, options)
    if close:
        return close
    if listing and len(options) > MAX_LISTED:
        return listing
    return f"choose one of {', '.join(options)}"
