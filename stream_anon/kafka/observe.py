"""The worker's figures in Prometheus text format (``/metrics``), read at scrape time from the same counters that
feed the ``anon.metrics`` topic (one source), plus liveness and readiness.

Readiness: every partition assigned to the worker has its state recovered and none is halted (a halted partition
needs an operator: the worker is alive but not ready).
"""
from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "stream_anon"


class WorkerCollector:
    def __init__(self, core, loop):
        self.core, self.loop = core, loop

    def collect(self):
        core, loop = self.core, self.loop
        stream = core.stream
        s = core.stats.totals

        def counter(name, doc, value, **labels):
            m = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["stream", *labels])
            m.add_metric([stream, *labels.values()], value)
            return m

        yield counter("events_in", "Input messages processed", s["events_in"])
        yield counter("published", "Real records published", s["published"])
        yield counter("releases", "Releases published", s["releases"])
        yield counter("aggregate_rows", "DP aggregate rows published", s["aggregate_rows"])
        m = CounterMetricFamily(f"{PREFIX}_suppressed", "Records suppressed, by reason", labels=["stream", "reason"])
        for reason, n in sorted(core.stats.by_reason["suppressed"].items()):
            m.add_metric([stream, reason], n)
        yield m
        m = CounterMetricFamily(f"{PREFIX}_dead_letters", "Input messages dead-lettered, by reason",
                                labels=["stream", "reason"])
        for reason, n in sorted(core.stats.by_reason["dead_letters"].items()):
            m.add_metric([stream, reason], n)
        yield m
        per = {name: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["stream", "partition"]) for name, doc in (
            ("partition_events_in", "Input messages processed per partition"),
            ("deferred", "Records deferred (waiting for a class) per partition"),
            ("consumer_lag", "Approximate consumer lag per partition (the broker's end offset minus the committed "
                             "position; the Tansu broker under-reports end offsets)"),
            ("release_ncp_mean", "Mean NCP of the partition's latest release"),
            ("release_counterfeit_records", "Counterfeit records in the partition's latest release"),
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
                per["release_counterfeit_records"].add_metric(lab, last["counterfeit_records"])
            per["state_transactions"].add_metric(lab, ps.seq)
        yield from per.values()
        eps_spent = GaugeMetricFamily(f"{PREFIX}_epsilon_spent", "DP epsilon spent per aggregate (worst case per "
                                      "individual, ledger of the partition)", labels=["stream", "partition", "aggregate"])
        eps_left = GaugeMetricFamily(f"{PREFIX}_epsilon_left", "DP budget left (ledger of the partition)",
                                     labels=["stream", "partition"])
        for p, ps in sorted(core.parts.items()):
            if ps.dp is None:
                continue
            for spec in ps.dp.dp.aggregates:
                eps_spent.add_metric([stream, str(p), spec.name], ps.dp.ledger.spent_by(spec.name))
            eps_left.add_metric([stream, str(p)], ps.dp.ledger.remaining)
        yield eps_spent
        yield eps_left
        alerts = CounterMetricFamily(f"{PREFIX}_alerts", "Alerts raised", labels=["stream", "alert"])
        alerts.add_metric([stream, "suppression_limit_exceeded"], core.stats.alerts.get("suppression_limit_exceeded", 0))
        if loop is not None:
            alerts.add_metric([stream, "partition_halted"], loop.counters["halts"])
            alerts.add_metric([stream, "broker_lost"], loop.counters["broker_lost"])
        yield alerts
        if loop is None:
            return
        lat = np.array(core.stats.release_latency_s or [0.0])
        g = GaugeMetricFamily(f"{PREFIX}_release_latency_seconds", "Wall time from a window's end (event time) to "
                              "its release, over the last 1,000 releases", labels=["stream", "quantile"])
        for q in (0.5, 0.99):
            g.add_metric([stream, str(q)], float(np.quantile(lat, q)))
        yield g
        yield GaugeMetricFamily(f"{PREFIX}_broker_connected", "1 while the broker is reachable",
                                value=1.0 if loop.connected else 0.0)
        h = GaugeMetricFamily(f"{PREFIX}_partition_halted", "1 for a partition halted until an operator decides",
                              labels=["stream", "partition", "reason"])
        for p, info in sorted(loop.halted.items()):
            h.add_metric([stream, str(p), info["reason"]], 1.0)
        yield h
        yield counter("transactions", "Committed transactions", loop.counters["transactions"])
        yield counter("transactions_aborted", "Aborted transactions", loop.counters["aborted"])


def prometheus_text(core, loop) -> bytes:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(core, loop))
    return generate_latest(registry)


def readiness(loop) -> tuple[bool, dict]:
    """(ready, details): partitions assigned and recovered, none halted, the loop running."""
    detail = {"assigned": sorted(loop.assigned), "halted": {str(p): h for p, h in loop.halted.items()},
              "recovered": loop.ready, "running": not loop.stopped.is_set(), "broker_connected": loop.connected}
    ok = loop.ready and not loop.halted and not loop.stopped.is_set() and bool(loop.assigned)
    return ok, detail
