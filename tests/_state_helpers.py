"""Restoring parts through their encoded state, as the worker does (tests only)."""
from __future__ import annotations

from stream_anon import checkpoint
from stream_anon.engine import Engine


def reopened(engine: Engine, config=None, secret: bytes | None = None) -> Engine:
    """A new engine restored from ``engine``'s state written as a full state record and read back (``config``,
    ``secret``: another configuration or secret to restore under)."""
    core, tables = checkpoint.roundtrip(*checkpoint.full_state(engine))
    return Engine.restore(config or engine.config, engine.partition, secret or engine.secret, core, tables,
                          engine.reader.carried)
