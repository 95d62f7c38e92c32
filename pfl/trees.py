"""Walking the nested containers methods exchange (tensors in dicts, lists, tuples and dataclasses
such as Upload), shared by the communication count and the divergence check."""

from __future__ import annotations

import functools
from dataclasses import fields


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, looked up once per class (``fields()`` costs microseconds a call,
    and the walks run for every client of every round)."""
    return tuple(f.name for f in fields(cls))
