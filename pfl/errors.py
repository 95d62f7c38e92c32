"""The error types a user can act on, each caught by the CLI with its own exit code:
``ConfigError`` (bad input, raised before any training starts; exit 2) and ``TrainingDiverged``
(a client's training produced NaN/inf; exit 3)."""

import argparse
from typing import Any, NoReturn

EXIT_BAD_INPUT = 2  # a ConfigError: nothing was trained
EXIT_DIVERGED = 3  # a TrainingDiverged: the run stopped in the round that produced NaN/inf


class ConfigError(ValueError):
    """A configuration, data file or hyper-parameter is invalid. The message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field, self.problem, self.fix = field, problem, fix
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)

    def __reduce__(self):  # pickles with its three parts (multi-process runs send it between ranks)
        return type(self), (self.field, self.problem, self.fix)


def require(condition: bool, field: str, problem: str, fix: str = "") -> None:
    if not condition:
        raise ConfigError(field, problem, fix)


class CommandParser(argparse.ArgumentParser):
    """A command's argparse parser whose refusal (an unknown or missing argument, a value of the wrong
    type) is a one-line ConfigError naming the command, its usage as the fix, instead of argparse's
    usage block; ``usage_line``: that fix, when the command words its usage itself."""

    def __init__(self, *args: Any, usage_line: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.usage_line = usage_line

    def error(self, message: str) -> NoReturn:
        usage = self.usage_line or " ".join(self.format_usage().split())
        raise ConfigError(self.prog.rsplit(" ", 1)[-1], message, usage)


def yaml_problem(err: Exception) -> str:
    """A YAML parser's (multi-line) error as one line's end: `` at line L, column C: <problem>``."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    return f"{where}: {problem}"


class TrainingDiverged(RuntimeError):
    """A local update (or the server step after it) produced a non-finite loss or model: the run
    stops in that round, before anything of it is checkpointed or reported."""

    def __init__(self, round_idx: int, client: int | None, what: str):
        self.round, self.client, self.what = round_idx, client, what
        where = f"round {round_idx}" + (f", client {client}" if client is not None else "")
        super().__init__(
            f"training diverged in {where}: {what} (lower client.lr, or server.lr for an adaptive server "
            "optimizer; nothing of this round was checkpointed or reported)"
        )

    def __reduce__(self):
        return type(self), (self.round, self.client, self.what)
