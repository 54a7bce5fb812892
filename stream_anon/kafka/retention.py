"""The retention guard: how long the raw input topic keeps events, against what the stream declares
(``[stream] input_retention_s``).

``stream-anon topics apply --config`` sets the raw topic's ``retention.ms`` to the declared time (a missing topic is
created with it, an existing one altered: :func:`set_topic_retention`); the worker reads the topic's
``retention.ms`` once at start (:func:`check_raw_retention`) and, when the topic keeps data longer than declared,
raises the ``raw_retention_exceeded`` alert (log WARNING, ``anon.metrics``, ``/metrics``, ``/readyz`` detail). The
worker itself never alters an existing topic (it may lack the right to, and the operator's ``topics apply`` is the
one place that decides topic settings); nor does it halt: halting anonymization would not shorten what the raw topic
keeps, only let it grow.

What counts as longer (fail closed): a ``retention.ms`` above the declared time, ``-1`` (unlimited), or a retention
the broker does not state (the Tansu broker reports only settings given when the topic was created or altered, so
a topic created without one has a retention nobody can show to be within the declared time) or that could not be
read. Only ``retention.ms`` is judged: a ``retention.bytes`` limit may delete sooner, never later.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger("stream_anon.worker")

RAW_RETENTION_EXCEEDED = "raw_retention_exceeded"
RETENTION_KEY = "retention.ms"
TIMEOUT_S = 15.0

# why a raw topic's retention is not within the declared time
LONGER, UNLIMITED, NOT_STATED, UNREADABLE = "longer", "unlimited", "not_stated", "unreadable"


def declared_ms(input_retention_s: float | None) -> int | None:
    """``[stream] input_retention_s`` as ``retention.ms`` (whole milliseconds, rounded down: never longer)."""
    return None if input_retention_s is None else max(1, int(input_retention_s * 1000))


@dataclass(frozen=True)
class RetentionCheck:
    """The raw topic's retention (``retention_ms`` as the broker states it, -1 unlimited, None not stated) against
    the declared time (``declared_ms``); ``error``: why it could not be read."""

    topic: str
    declared_ms: int
    retention_ms: int | None
    error: str | None = None

    @property
    def cause(self) -> str | None:
        """None when the topic keeps data at most the declared time, else :data:`LONGER`, :data:`UNLIMITED`,
        :data:`NOT_STATED` or :data:`UNREADABLE`.

        >>> RetentionCheck("raw", 1000, 1000).cause, RetentionCheck("raw", 1000, 2000).cause
        (None, 'longer')
        >>> RetentionCheck("raw", 1000, -1).cause, RetentionCheck("raw", 1000, None).cause
        ('unlimited', 'not_stated')
        """
        if self.error is not None:
            return UNREADABLE
        if self.retention_ms is None:
            return NOT_STATED
        if self.retention_ms < 0:
            return UNLIMITED
        return LONGER if self.retention_ms > self.declared_ms else None

    @property
    def exceeded(self) -> bool:
        return self.cause is not None

    def detail(self) -> str:
        """One line for the log and the alert (topic, both times, the cause)."""
        declared = f"the declared {self.declared_ms / 1000:g} s ([stream] input_retention_s)"
        kept = f"topic {self.topic} keeps data {(self.retention_ms or 0) / 1000:g} s"
        cause = self.cause
        if cause is None:
            return f"{kept}, within {declared}"
        if cause == LONGER:
            return f"{kept}, longer than {declared}"
        if cause == UNLIMITED:
            return f"topic {self.topic} keeps data forever (retention.ms = -1), longer than {declared}"
        if cause == NOT_STATED:
            return f"the broker states no retention.ms for topic {self.topic}: not shown to be within {declared}"
        return f"retention.ms of topic {self.topic} could not be read ({self.error}): not shown to be within {declared}"

    def as_dict(self) -> dict:
        return {"topic": self.topic, "declared_ms": self.declared_ms, "retention_ms": self.retention_ms,
                "exceeded": self.exceeded, "cause": self.cause, "detail": self.detail()}


def topic_retention_ms(admin, topic: str, timeout_s: float = TIMEOUT_S) -> int | None:
    """The topic's ``retention.ms`` as the broker states it (None: not stated); ``admin``: a confluent-kafka
    ``AdminClient``. Raises ``KafkaException`` when the broker does not answer."""
    from confluent_kafka.admin import ConfigResource

    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)],
                                     request_timeout=timeout_s)
    entries = next(iter(futures.values())).result(timeout_s)
    entry = entries.get(RETENTION_KEY)
    if entry is None or entry.value is None:
        return None
    return int(entry.value)


def stated_retention_ms(admin, topic: str, expected_ms: int, timeout_s: float = TIMEOUT_S) -> int | None:
    """The topic's ``retention.ms`` once the broker states ``expected_ms``, or what it states after ``timeout_s``.
    An altered config is read back with a deadline: Apache Kafka (KRaft) acknowledges the alteration once its
    controller has committed it, and the broker answering DescribeConfigs applies that record a moment later."""
    deadline = time.monotonic() + timeout_s
    while True:
        stated = topic_retention_ms(admin, topic, timeout_s)
        if stated == expected_ms or time.monotonic() >= deadline:
            return stated
        time.sleep(0.2)


def check_raw_retention(admin, topic: str, input_retention_s: float | None) -> RetentionCheck | None:
    """The raw topic's retention against ``input_retention_s`` (None: nothing declared, nothing checked)."""
    from confluent_kafka import KafkaException

    declared = declared_ms(input_retention_s)
    if declared is None:
        return None
    try:
        return RetentionCheck(topic, declared, topic_retention_ms(admin, topic))
    except (KafkaException, ValueError) as exc:      # ValueError: a value that is not a number of milliseconds
        return RetentionCheck(topic, declared, None, error=str(exc))


def guard_raw_retention(admin, topic: str, stream_section, raise_alert) -> RetentionCheck | None:
    """The worker's check at start: the raw topic's retention against the one its ``[stream]`` section declares;
    when longer, the ``raw_retention_exceeded`` alert: a WARNING line and ``raise_alert(name, partition, **fields)`` (to anon.metrics).
    Never halts."""
    check = check_raw_retention(admin, topic, stream_section.input_retention_s)
    if check is not None and check.exceeded:
        log.warning("alert %s: %s (set it with `stream-anon topics apply --config`)", RAW_RETENTION_EXCEEDED,
                    check.detail())
        raise_alert(RAW_RETENTION_EXCEEDED, None, topic=check.topic, retention_ms=check.retention_ms,
                    declared_ms=check.declared_ms, cause=check.cause, detail=check.detail())
    return check


def set_topic_retention(admin, topic: str, retention_ms: int, timeout_s: float = TIMEOUT_S) -> None:
    """Set the topic's ``retention.ms`` (IncrementalAlterConfigs: only this key changes; Tansu implements it, not
    the older AlterConfigs, which replaces every setting of the topic)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(RETENTION_KEY, str(int(retention_ms)), incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource], request_timeout=timeout_s).values():
        future.result(timeout_s)


def confluent_admin(bootstrap):
    """A confluent-kafka ``AdminClient`` for ``bootstrap`` ('HOST:PORT' or a KafkaConnection)."""
    from confluent_kafka.admin import AdminClient

    from stream_anon.connection import as_connection
    client_log = logging.getLogger("stream_anon.kafka.client")
    return AdminClient({**as_connection(bootstrap).confluent(), "logger": client_log})
