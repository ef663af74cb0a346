"""Scenario builders; importing this package registers every scenario."""

from . import rotmnist  # noqa: F401
