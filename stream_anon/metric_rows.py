"""The rows of the metrics topic (``anon.metrics``; topics/README.md, "Metrics"), made in this one place.

Every row has the same envelope: ``type``, ``stream``, ``partition`` (None: the whole worker, e.g. ``throughput``),
``ts`` (when the row was made: ISO 8601 in UTC), then its type's fields. An alert is a row of type ``alert`` with
the alert's name in ``alert``. A part that reports an event as a dict with its own ``type`` (a DP window's figures,
a ledger's ``budget_exhausted``) is put in the envelope by :func:`event_row`.

>>> row = alert_row("partition_halted", "oyster", 3, reason="state_lost")
>>> [row[f] for f in ("type", "stream", "partition", "alert", "reason")]
['alert', 'oyster', 3, 'partition_halted', 'state_lost']
>>> row_time({"ts": "2026-01-01T00:00:01+00:00"})
1767225601.0
"""
from __future__ import annotations

from datetime import datetime, timezone

ENVELOPE = ("type", "stream", "partition", "ts")


def now_iso() -> str:
    """The time now, as the rows' ``ts`` (and other output times) give it: ISO 8601 in UTC."""
    return datetime.now(timezone.utc).isoformat()


def metric_row(kind: str, stream: str, partition: int | None, **fields) -> dict:
    """A row of type ``kind``; ``fields`` may not set the envelope."""
    clash = sorted(set(fields) & set(ENVELOPE))
    if clash:
        raise ValueError(f"metric row fields {clash} are the envelope's")
    return {"type": kind, "stream": stream, "partition": partition, "ts": now_iso(), **fields}


def alert_row(alert: str, stream: str, partition: int | None, **fields) -> dict:
    """An alert (``type: alert``) named ``alert``."""
    return metric_row("alert", stream, partition, alert=alert, **fields)


def event_row(event: dict, stream: str, partition: int | None, **fields) -> dict:
    """An event a part reported as a dict with its ``type`` (its own envelope fields are replaced), plus
    ``fields``."""
    body = {k: v for k, v in event.items() if k not in ENVELOPE}
    return metric_row(event["type"], stream, partition, **body, **fields)


def row_time(row: dict) -> float:
    """A row's ``ts`` as seconds since the epoch."""
    return datetime.fromisoformat(row["ts"]).timestamp()
