"""The one error type for bad input: raised before any training starts, caught by the CLI."""


class ConfigError(ValueError):
    """A configuration, data file or hyper-parameter is invalid. The message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str = ""):
        self.field = field
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


def require(condition: bool, field: str, problem: str, fix: str = "") -> None:
    if not condition:
        raise ConfigError(field, problem, fix)
