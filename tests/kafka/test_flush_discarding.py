"""A leaving or fenced partition's producer is flushed by ``flush_discarding``: its fatal error is returned, not
raised, also in the shape confluent-kafka sometimes gives it (a SystemError from the logger callback caused by the
KafkaException: the failure of ``test_a_worker_stopped_past_its_timeouts_is_fenced...[apache]`` in CI, where the
worker exited 70 while dropping a fenced partition); any other error still stops the loop."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from stream_anon.kafka.transactions import flush_discarding

FENCED = KafkaException(KafkaError(KafkaError._FENCED, "This instance has been fenced by a newer instance",
                                   fatal=True))


class RaisingOnFlush:
    """Stands in for a producer whose flush raises ``exc`` (the library's shapes are what is tested here)."""

    def __init__(self, exc: BaseException | None):
        self.exc = exc

    def flush(self, timeout: float) -> int:
        if self.exc is not None:
            raise self.exc
        return 0


def system_error_caused_by(cause: BaseException) -> SystemError:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise SystemError("<class 'logging.LogRecord'> returned a result with an exception set") from inner
    except SystemError as exc:
        return exc


def test_the_fatal_error_is_returned_in_both_shapes():
    assert flush_discarding(RaisingOnFlush(FENCED), 1) is FENCED
    assert flush_discarding(RaisingOnFlush(system_error_caused_by(FENCED)), 1) is FENCED
    assert flush_discarding(RaisingOnFlush(None), 1) is None


def test_any_other_error_is_raised():
    with pytest.raises(SystemError):
        flush_discarding(RaisingOnFlush(system_error_caused_by(ValueError("not the producer's"))), 1)
    with pytest.raises(SystemError):
        flush_discarding(RaisingOnFlush(SystemError("no cause")), 1)
