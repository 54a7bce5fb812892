"""Errors shared by every layer (kept here so that no module imports a higher one just for an exception)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message starts with its dotted key."""
