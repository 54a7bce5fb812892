"""The worker's figures in Prometheus text format (``/metrics``), read at scrape time from the same counters that
feed the ``anon.metrics`` topic (one source: :func:`throughput_metric`), plus liveness and readiness; and
:class:`MetricSender`, which sends the worker's own messages on that topic. Every series is described in
docs/operations.md (Metrics reference); tests/report/test_metrics_reference.py holds the two to each other.

Readiness: every partition assigned to the worker has its state recovered and none is halted (a halted partition
needs an operator: the worker is alive but not ready). The retention guard's verdict is in ``/readyz``'s detail
(``raw_retention``) but never makes the worker unready: the worker cannot shorten what the raw topic keeps.
"""
from __future__ import annotations

import logging

from confluent_kafka import KafkaException, Producer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from stream_anon import crypto
from stream_anon.metric_rows import alert_row
from stream_anon.render import TOPICS, json_bytes
from stream_anon.version import __version__
from stream_anon.worker.stats import LATENCY_BUCKETS

client_log = logging.getLogger("stream_anon.kafka.client")

PREFIX = "stream_anon"
# alerts raised once at an event (a lineage declared, an operator's step taken), not while a condition lasts
EVENT_ALERTS = ("lineage_started", "config_change_accepted", "key_rotated")


def _gauge(name: str, doc: str, labels=()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["stream", *labels])


def _counter(name: str, doc: str, labels=()) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["stream", *labels])


def stream_series(core):
    """Counters of the whole worker, by stream (and reason), and the stream's configuration figures."""
    stream, s = core.stream, core.stats.totals
    for name, doc, key in (("events_in", "Input messages processed", "events_in"),
                           ("published", "Real records published", "published"),
                           ("releases", "Releases published", "releases"),
                           ("aggregate_rows", "DP aggregate rows published", "aggregate_rows")):
        m = _counter(name, doc)
        m.add_metric([stream], s[key])
        yield m
    for name, doc in (("suppressed", "Records suppressed, by reason"),
                      ("dead_letters", "Input messages dead-lettered, by reason")):
        m = _counter(name, doc, ["reason"])
        for reason, n in sorted(core.stats.by_reason[name].items()):
            m.add_metric([stream, reason], n)
        yield m
    m = _gauge("suppression_limit", "Largest share of a release's records that may be suppressed "
               "(anonymization.max_suppression_ratio)")
    m.add_metric([stream], float(core.config.anonymization.max_suppression_ratio))
    yield m
    m = _gauge("window_seconds", "Event-time length of a window (anonymization.window_s)")
    m.add_metric([stream], float(core.config.anonymization.window_s))
    yield m
    m = _gauge("info", "1, labelled with the version, the input topic and the secret's key id",
               ["version", "input_topic", "key_id"])
    m.add_metric([stream, __version__, core.topic, crypto.key_id(core.secret)], 1.0)
    yield m


def partition_series(core, loop):
    """Per assigned partition: progress, lag, the latest release's figures."""
    stream = core.stream
    per = {name: _gauge(name, doc, ["partition"]) for name, doc in (
        ("partition_events_in", "Input messages processed per partition"),
        ("deferred", "Records deferred (waiting for a class) per partition"),
        ("consumer_lag", "Consumer lag per partition in messages: the broker's end offset minus the next offset "
                         "to process, read every --metrics-interval (the Tansu broker under-reports end offsets)"),
        ("release_ncp_mean", "Mean NCP (information loss, 0..1) of the partition's latest release"),
        ("release_suppression_ratio", "Share of the records of the partition's latest release that were "
                                      "suppressed"),
        ("release_counterfeit_records", "Counterfeit records in the partition's latest release"),
        ("event_time_lag_seconds", "Wall time at the commit of the partition's latest release minus the end "
                                   "(event time) of its window: how far the output trails the clock"),
        ("state_transactions", "Committed state transactions per partition"))}
    for p, ps in sorted(core.parts.items()):
        lab = [stream, str(p)]
        per["partition_events_in"].add_metric(lab, ps.events_in)
        per["deferred"].add_metric(lab, ps.engine.deferred)
        hw = loop.highwater.get(p) if loop is not None else None
        if hw is not None:
            per["consumer_lag"].add_metric(lab, max(0, hw - (ps.offset + 1)))
        last = core.stats.last_release.get(p)
        if last:
            per["release_ncp_mean"].add_metric(lab, last["ncp_mean"])
            per["release_suppression_ratio"].add_metric(lab, last["suppression_ratio"])
            per["release_counterfeit_records"].add_metric(lab, last["counterfeit_records"])
        if p in core.stats.event_time_lag_s:
            per["event_time_lag_seconds"].add_metric(lab, core.stats.event_time_lag_s[p])
        per["state_transactions"].add_metric(lab, ps.seq)
    yield from per.values()


def budget_series(core):
    """The DP budget per partition ledger (as of its last state record), charged to the worst-case unit of
    privacy (:mod:`stream_anon.dp.outlook`): in the current period (the whole stream without ``[dp] period``) by
    each aggregate and in all, the budget and what is left of it; with a period also how far the period has run
    by event time, what its scheduled releases will have charged by its end, and the last closed period's charge
    (in all and by aggregate), which the current period's figures no longer show once the next period starts."""
    stream = core.stream
    g = {name: _gauge(name, doc, labels) for name, doc, labels in BUDGET_GAUGES}
    for p, ps in sorted(core.parts.items()):
        if ps.dp is None:
            continue
        # here: stream_anon.dp imports diffprivlib and scikit-learn (~2 s of a worker's start without [dp])
        from stream_anon.dp.outlook import budget_outlook
        ledger, position = ps.dp.budget_view()
        o = budget_outlook(ps.dp.dp, ledger, position)
        part, label = [stream, str(p)], o.period or ""
        for spec in ps.dp.dp.aggregates:
            g["epsilon_spent"].add_metric([*part, spec.name, label], o.charges.get(spec.name, 0.0))
        g["epsilon_period_spent"].add_metric([*part, label], o.spent)
        g["epsilon_budget"].add_metric(part, ledger.epsilon_budget)
        g["epsilon_left"].add_metric(part, max(0.0, ledger.epsilon_budget - o.spent))
        if o.elapsed is not None:
            g["period_elapsed_ratio"].add_metric([*part, label], o.elapsed[0] / o.elapsed[1])
            g["epsilon_period_projected"].add_metric([*part, label], o.projected)
        if o.closed is not None:
            g["epsilon_closed_period_spent"].add_metric([*part, o.closed], o.closed_spent)
            for name, charge in sorted(o.closed_charges.items()):
                g["epsilon_closed_period_aggregate_spent"].add_metric([*part, name, o.closed], charge)
    yield from g.values()


# name, help, labels beside ``stream`` (docs/operations.md, Metrics reference, says more of each)
BUDGET_GAUGES = (
    ("epsilon_spent", "Epsilon charged to the worst-case unit of privacy in the current period by each aggregate "
     "(whole stream without [dp] period), per partition ledger", ("partition", "aggregate", "period")),
    ("epsilon_period_spent", "Epsilon charged to the worst-case unit of privacy in the current period, all "
     "aggregates (the ledger_epsilon_spent of the period's rows)", ("partition", "period")),
    ("epsilon_budget", "Epsilon budget per unit of privacy and period in force ([dp] epsilon_per_period; "
     "epsilon_budget, over the stream, without a period)", ("partition",)),
    ("epsilon_left", "Epsilon budget left to the worst-case unit in the current period (0 for most of every period "
     "where the aggregates spend the whole budget by design: not a warning)", ("partition",)),
    ("period_elapsed_ratio", "Share of the current period's windows released (the stream's event-time clock; "
     "1 once its last window is)", ("partition", "period")),
    ("epsilon_period_projected", "Epsilon the current period's scheduled releases will have charged the worst-case "
     "unit by its end (what is charged, plus the releases due, each aggregate at most its share, plus those "
     "refused); above the budget when the ledger stops an aggregate before the period ends", ("partition", "period")),
    ("epsilon_closed_period_spent", "Epsilon charged to the worst-case unit in the last closed period (its last "
     "window released), all aggregates", ("partition", "period")),
    ("epsilon_closed_period_aggregate_spent", "Epsilon charged to the worst-case unit in the last closed period by "
     "each aggregate", ("partition", "aggregate", "period")),
)


def loop_series(core, loop):
    """The Kafka loop's figures: alerts, broker, halts, transactions, processing latency, the latest release."""
    stream = core.stream
    alerts = _counter("alerts", "Alerts raised", ["alert"])
    alerts.add_metric([stream, "suppression_limit_exceeded"], core.stats.alerts.get("suppression_limit_exceeded", 0))
    alerts.add_metric([stream, "wrong_partition"], core.stats.alerts.get("wrong_partition", 0))
    alerts.add_metric([stream, "partition_halted"], loop.counters["halts"])
    alerts.add_metric([stream, "broker_lost"], loop.counters["broker_lost"])
    alerts.add_metric([stream, "lineage_started"], loop.counters["lineages_started"])
    alerts.add_metric([stream, "config_change_accepted"], loop.counters["config_changes_accepted"])
    alerts.add_metric([stream, "key_rotated"], loop.counters["keys_rotated"])
    alerts.add_metric([stream, "raw_retention_exceeded"], int(loop.retention is not None and loop.retention.exceeded))
    yield alerts
    # an event's alert is a moment, not a state: its time, which a restart does not hide (a counter restarts at 0,
    # and one that is already 1 at the first scrape shows Prometheus no increase)
    last = _gauge("alert_last_timestamp_seconds", "Wall time (Unix seconds) this worker last raised the alert, for "
                  "the alerts of a one-off event; 0 while it has not", ["alert"])
    for name in EVENT_ALERTS:
        last.add_metric([stream, name], core.stats.alert_last.get(name, 0.0))
    yield last
    yield from retention_series(stream, loop.retention)
    g = _gauge("broker_connected", "1 while the broker is reachable, else 0")
    g.add_metric([stream], 1.0 if loop.watch.connected else 0.0)
    yield g
    g = _gauge("ready", "1 while /readyz answers 200 (partitions assigned and recovered, none halted, broker "
                        "connected), else 0")
    g.add_metric([stream], 1.0 if readiness(loop)[0] else 0.0)
    yield g
    h = _gauge("partition_halted", "1 for a partition halted until an operator decides (label reason), 0 for an "
               "assigned partition that runs", ["partition", "reason"])
    for p in sorted(set(loop.assigned) | set(loop.halted)):
        info = loop.halted.get(p)
        h.add_metric([stream, str(p), info["reason"] if info else ""], 1.0 if info else 0.0)
    yield h
    for name, doc, key in (("transactions", "Committed transactions", "transactions"),
                           ("transactions_aborted", "Aborted transactions", "aborted")):
        m = _counter(name, doc)
        m.add_metric([stream], loop.counters[key])
        yield m
    proc = core.stats.processing
    cum, buckets = 0, []
    for bound, n in zip(LATENCY_BUCKETS, proc["buckets"]):
        cum += n
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cum))
    lat = HistogramMetricFamily(f"{PREFIX}_processing_latency_seconds", "Seconds from a partition batch's arrival "
                                "at the worker to the commit of its transaction", labels=["stream"])
    lat.add_metric([stream], buckets, proc["sum"])
    yield lat
    g = _gauge("last_release_timestamp_seconds", "Wall time (Unix seconds) of the latest committed release; the "
               "worker's start while it has committed none")
    g.add_metric([stream], core.stats.last_release_at or core.stats.totals["started"])
    yield g


def retention_series(stream: str, check):
    """The retention guard's figures (stream_anon.kafka.retention), when the stream declares input_retention_s."""
    if check is None:
        return
    g = _gauge("raw_retention_exceeded", "1 when the raw input topic keeps data longer than [stream] "
               "input_retention_s (or its retention.ms is not stated or unreadable), checked at start; else 0",
               ["topic"])
    g.add_metric([stream, check.topic], 1.0 if check.exceeded else 0.0)
    yield g
    g = _gauge("raw_retention_declared_seconds", "The longest the raw input topic may keep data ([stream] "
               "input_retention_s)", ["topic"])
    g.add_metric([stream, check.topic], check.declared_ms / 1000)
    yield g
    g = _gauge("raw_retention_seconds", "The raw input topic's retention.ms as the broker states it, in seconds "
               "(-1: forever; absent when not stated)", ["topic"])
    if check.retention_ms is not None:
        g.add_metric([stream, check.topic], check.retention_ms / 1000 if check.retention_ms >= 0 else -1.0)
    yield g


class WorkerCollector:
    def __init__(self, core, loop):
        self.core, self.loop = core, loop

    def collect(self):
        yield from stream_series(self.core)
        yield from partition_series(self.core, self.loop)
        yield from budget_series(self.core)
        if self.loop is not None:
            yield from loop_series(self.core, self.loop)


def prometheus_text(core, loop) -> bytes:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(core, loop))
    return generate_latest(registry)


def readiness(loop) -> tuple[bool, dict]:
    """(ready, details): partitions assigned and recovered, none halted, the loop running, the broker answering (a
    worker cut off from the brokers processes nothing: not ready, though the group has not yet moved its
    partitions)."""
    detail = {"assigned": sorted(loop.assigned), "halted": {str(p): h for p, h in loop.halted.items()},
              "recovered": loop.ready, "running": not loop.stopped.is_set(), "broker_connected": loop.watch.connected}
    if loop.retention is not None:       # an alert, not a readiness condition (stream_anon.kafka.retention)
        detail["raw_retention"] = loop.retention.as_dict()
    ok = loop.ready and not loop.halted and not loop.stopped.is_set() and bool(loop.assigned) and loop.watch.connected
    return ok, detail


def throughput_metric(loop, highwaters: dict) -> dict:
    """The loop's periodic message on ``anon.metrics``: the engines' throughput with the partitions' positions
    against ``highwaters`` (end offsets), the broker connection, the halted partitions and the loop's counters."""
    core = loop.core
    doc = core.stats.throughput_metric(core.stream, core.app_id, core.parts,
                                       {p: ps.offset + 1 for p, ps in core.parts.items()}, highwaters)
    return {**doc, "connected": loop.watch.connected,
            "halted": {str(p): h["reason"] for p, h in loop.halted.items()}, **loop.counters}


class MetricSender:
    """The worker's own messages on ``anon.metrics`` (throughput, partition alerts, the retention guard's, the
    lineage's and the operator's steps'), through a plain producer; each is shown to ``note`` first (the worker's
    stats keep an alert's time); a metric that cannot be sent is logged: metrics never stop processing."""

    def __init__(self, stream: str, note=None):
        self.stream, self.note = stream, note
        self.producer: Producer | None = None       # made by start()

    def start(self, client_config: dict, compression: str) -> None:
        self.producer = Producer({**client_config, "logger": client_log, "linger.ms": 20,
                                  "compression.type": compression})

    def alert(self, name: str, partition: int | None, **fields) -> None:
        """Send the alert ``name`` (stream_anon.metric_rows.alert_row)."""
        self.send(alert_row(name, self.stream, partition, **fields))

    def send(self, row: dict) -> None:
        """Send a row made by stream_anon.metric_rows."""
        if self.note is not None:
            self.note(row)
        assert self.producer is not None, "MetricSender.send before start()"    # the loop starts it in _setup
        try:
            self.producer.produce(TOPICS.metrics, json_bytes(row), self.stream.encode())
            self.producer.poll(0)
        except (BufferError, KafkaException) as exc:
            client_log.warning("metric not sent: %s", exc)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(5)
