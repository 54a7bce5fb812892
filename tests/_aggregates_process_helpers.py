"""A child main for the aggregates process that fails on purpose (tests/dp/test_aggregates_process.py): importable
by name, as the ``spawn`` start method needs."""
from __future__ import annotations

POISON_FARE = 1777       # a valid fare that no event of the test slice has


def _failing_close(real):
    def close(self, index, carried, metrics):
        if index is not None and POISON_FARE in carried.get("full_fare_pence", ()):
            raise RuntimeError("aggregates bug")
        return real(self, index, carried, metrics)
    return close


def fail_in_this_process(monkeypatch) -> None:
    """The same failure for aggregates released in this process."""
    from stream_anon.worker import aggregates
    monkeypatch.setattr(aggregates.PartitionAggregates, "_close", _failing_close(aggregates.PartitionAggregates._close))


def serve_failing(requests, replies) -> None:
    """``serve_requests`` whose releases raise for any window holding an event whose fare is :data:`POISON_FARE`."""
    from stream_anon.worker import aggregates
    from stream_anon.worker.aggregates_process import serve_requests
    aggregates.PartitionAggregates._close = _failing_close(aggregates.PartitionAggregates._close)
    serve_requests(requests, replies)
