"""The worker's counters: totals of what it processed and produced, counts by reason, each partition's latest
release figures and the alerts raised (read by ``/metrics``, :mod:`stream_anon.kafka.observe`, and by the
throughput metric on ``anon.metrics``)."""
from __future__ import annotations

import bisect
import os
import time

from stream_anon.metric_rows import metric_row, row_time

LAG_NOTE = ("approximate: computed from the consumed position and the broker's reported end offset, which the "
            "Tansu broker under-reports for multi-record batches")
# upper bounds (seconds) of the processing-latency histogram's buckets; the last one catches the rest
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))
BATCH_COUNTS = ("skipped", "events_in", "dead_letters", "releases", "published", "suppressed", "aggregate_rows")


def reason_kind(reason: str) -> str:
    """A dead letter's reason as counted (the ``reason`` label of ``stream_anon_dead_letters_total``): its text
    before the first ':', which names the check and the field, never a value.

    >>> reason_kind("sensitive full_fare_pence: number outside its domain [0, 2000]")
    'sensitive full_fare_pence'
    """
    return reason.split(":", 1)[0]


def batch_counts() -> dict:
    """A batch's counters, all zero."""
    return dict.fromkeys(BATCH_COUNTS, 0)


class WorkerStats:
    def __init__(self):
        self.totals = {**batch_counts(), "batches": 0, "started": time.time()}
        self.by_reason = {"suppressed": {}, "dead_letters": {}}   # counters by reason
        self.last_release: dict[int, dict] = {}                  # partition -> figures of its latest release
        self.alerts: dict[str, int] = {}                         # alert name -> times raised
        self.alert_last: dict[str, float] = {}                   # alert name -> wall time last sent to anon.metrics
        self._last_metric = (time.monotonic(), 0)
        # processing latency: seconds from a partition batch's arrival at the worker to its transaction's commit
        self.processing = {"buckets": [0] * len(LATENCY_BUCKETS), "sum": 0.0, "count": 0}
        self.event_time_lag_s: dict[int, float] = {}             # partition -> commit time minus its window's end
        self.last_release_at: float | None = None                # wall time of the latest committed release

    def release(self, rel, alerts: list[str]) -> None:
        for name in alerts:
            self.alerts[name] = self.alerts.get(name, 0) + 1
        for reason, n in rel.suppressed.items():
            self.by_reason["suppressed"][reason] = self.by_reason["suppressed"].get(reason, 0) + n
        self.last_release[rel.partition] = {"ncp_mean": rel.ncp_mean, "deferred": len(rel.deferred_tokens),
                                            "suppression_ratio": rel.suppression_ratio,
                                            "counterfeit_records": rel.counterfeit_records,
                                            "window_end": rel.window_end}

    def raised(self, name: str) -> None:
        """A one-off alert raised by the core (its count and time)."""
        self.alerts[name] = self.alerts.get(name, 0) + 1
        self.alert_last[name] = time.time()

    def note_alert(self, metric: dict) -> None:
        """A message for anon.metrics: an alert's time is kept (``stream_anon_alert_last_timestamp_seconds``)."""
        if metric.get("type") == "alert":
            self.alert_last[str(metric.get("alert"))] = row_time(metric)

    def note_commit(self, releases, arrived: float | None = None, at: float | None = None) -> None:
        """A partition batch committed at ``at`` (wall time; None: now) (``arrived``: wall time its messages reached
        the worker; None for an idle flush, which has no arrival) with ``releases``: their event-time lag (commit
        time minus the window's end) per partition and the time of the latest release."""
        now = time.time() if at is None else at
        if arrived is not None:
            d = max(0.0, now - arrived)
            self.processing["buckets"][bisect.bisect_left(LATENCY_BUCKETS, d)] += 1
            self.processing["sum"] += d
            self.processing["count"] += 1
        for rel in releases:
            if rel.window_end:
                self.event_time_lag_s[rel.partition] = now - rel.window_end
            self.last_release_at = now

    def deadletter(self, reason: str) -> None:
        key = reason_kind(reason)
        self.by_reason["dead_letters"][key] = self.by_reason["dead_letters"].get(key, 0) + 1

    def batch(self, counts: dict, sign: int = 1) -> None:
        """Add a batch's counters (``sign=-1``: take back a batch that runs again)."""
        for k, v in counts.items():
            self.totals[k] += sign * v
        self.totals["batches"] += sign

    def throughput_metric(self, stream: str, app_id: str, parts: dict, positions: dict, highwaters: dict) -> dict:
        now = time.monotonic()
        t0, n0 = self._last_metric
        n = self.totals["events_in"]
        rate = (n - n0) / (now - t0) if now > t0 else 0.0
        self._last_metric = (now, n)
        lag = {}
        for p, hw in highwaters.items():
            pos = positions.get(p)
            if hw is not None and pos is not None:
                lag[str(p)] = max(0, hw - pos)
        return metric_row("throughput", stream, None, app_id=app_id, pid=os.getpid(), partitions=sorted(parts),
                          events_per_s=round(rate, 1), **{k: v for k, v in self.totals.items() if k != "started"},
                          committed={str(p): ps.offset for p, ps in parts.items()}, lag_approx=lag,
                          lag_note=LAG_NOTE)
