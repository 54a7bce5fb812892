"""The shape of a partition's pipeline: the stages and what each promises the next (``typing.Protocol``).

::

    raw messages --(worker: size, JSON, schema or [input] decoding)--> events
    events --Reader--> Records (+ rejections: dead letters)
    Records --WindowCore--> releases and closed windows
        at a close: WindowCore --WindowView--> Former --Plan--> (every Criterion re-checked) --> Release
    Release --Renderer--> records, manifest, metric, alerts (Kafka messages)
    ClosedWindow --WindowConsumer--> DP aggregate rows

One object per partition holds the stages (:class:`stream_anon.worker.partition.PartitionState`); every stateful
stage is a :class:`stream_anon.checkpoint.Checkpointable`. Implementations: :class:`stream_anon.engine.RecordReader`,
:class:`stream_anon.engine.Engine`, :class:`stream_anon.formers.base.Former` (k-anonymous and m-invariant),
:mod:`stream_anon.criteria`, :class:`stream_anon.render.Renderer`,
:class:`stream_anon.worker.aggregates.PartitionAggregates`. The stages call each other only through these methods
(``tests/engine/test_pipeline.py`` checks every implementation against its protocol).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Reader(Protocol):
    """Events (dicts, or a DataFrame with dotted columns) -> typed records and ``(position, reason)`` rejections.
    ``largest``: the largest event time accepted before the batch (duplicates and ``max_future_s`` are judged
    against it). Never raises for an event's content."""

    def read(self, events, largest: float) -> tuple[Any, list[tuple[int, str]]]: ...


@runtime_checkable
class WindowCore(Protocol):
    """Records in arrival order -> releases of the windows that close and the closed windows' carried fields."""

    def read(self, events) -> tuple[Any, list[tuple[int, str]]]: ...

    def process_records(self, records) -> Any: ...

    def flush(self) -> Any: ...


@runtime_checkable
class Renderer(Protocol):
    """A release -> (messages ``(topic, key, value)``, counters, alert names); a rejected input -> its dead
    letter."""

    def release(self, release) -> tuple[list, dict, list[str]]: ...

    def deadletter(self, reason: str, partition: int, offset: int, raw: bytes | None = None,
                   event: dict | None = None, index: int | None = None, opaque: bool = False) -> tuple: ...


@runtime_checkable
class WindowConsumer(Protocol):
    """Closed windows -> output rows (the DP aggregates of one partition, in the worker's process or in the
    aggregates process: both implement this). ``carried``: the event fields it needs the window core to hand over
    with each closed window; ``released_through``: the last window released."""

    carried: tuple[str, ...]

    @property
    def released_through(self) -> int | None: ...

    def messages(self, windows, dumps, metrics_topic: str, through: int | None = None) -> Any:
        """Release ``windows`` and the empty ones up to ``through``: a ``Pending`` of (messages, rows)."""

    def state_core(self) -> dict: ...

    def record_state(self) -> tuple[dict, dict | None, int]:
        """(state core, table changes since the last call or None when unknown, table rows)."""

    def full_tables(self) -> dict: ...

    def budget_view(self) -> tuple: ...

    def prefetch_record_state(self) -> None:
        """Ask ahead for what the next :meth:`record_state` returns (a no-op where it is at hand)."""

    def close(self) -> None: ...
