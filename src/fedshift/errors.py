"""Errors that carry a message meant for the person running the pipeline."""


class ConfigError(ValueError):
    """A bad name, key, type or file in the user's configuration or data.

    The message names the offending key/value and what would be valid; the CLI
    prints it as a single line and exits with status 2.
    """
