"""Exceptions shared across modules (no imports: any module may import this one)."""


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the dotted key at fault (``dp.period: ...``)."""
