"""A method object from its configured arguments, with a user's refusal of them as a one-line error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pfl.errors import ConfigError

if TYPE_CHECKING:  # no torch import for the command line's parsing
    from pfl.methods.base import Method


def build_method(cls: type[Method], args: dict[str, Any]) -> Method:
    """``cls(**args)``. A ValueError, TypeError or AssertionError from the constructor of a method of one's
    own (how an ``__init__`` refuses its arguments) is a one-line ConfigError naming the class; the
    original stays chained (``__cause__``) for the Python API's traceback. Anything else, and any error
    of pfl's own methods (which refuse bad arguments with ConfigError), keeps its traceback: a bug."""
    try:
        return cls(**args)
    except (ValueError, TypeError, AssertionError) as err:
        if isinstance(err, ConfigError) or cls.__module__.split(".")[0] == "pfl":
            raise
        problem = (
            f"{cls.__module__}.{cls.__qualname__}.__init__ raised {type(err).__name__}: {' '.join(str(err).split())}"
        )
        raise ConfigError("method", problem, "fix the method's arguments in the config, or its check") from err
