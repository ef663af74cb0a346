"""Errors that carry a message meant for the person running the pipeline."""


class ConfigError(ValueError):
    """A bad name, key, type or file in the user's configuration or data.

    The message names the offending key/value and what would be valid; the CLI
    prints it as a single line and exits with status 2.
    """


class RunError(RuntimeError):
    """A job stopped for a reason meant for the person running it (a diverged loss, corrupt data).

    The CLI prints it as a single line and exits with status 1.
    """


class NonFiniteError(RunError):
    """A loss or weight became NaN/inf (``engine.on_nonfinite: fail``)."""
