"""Differentially private aggregates in the worker: the per-partition glue between the Kafka worker and
:class:`stream_anon.dp.DPAggregator` (issue 4). No noise, accounting or bounding logic lives here.

Per input partition (one individual -> one partition, so the partitions hold disjoint sets of individuals and
their budgets compose in parallel: McSherry, PINQ, SIGMOD 2009, Theorem 4):

- **Windows** are the engine's: an event belongs to the window of the event-time watermark (largest event time
  seen on the partition) at its arrival, ``floor(watermark / window_s)``, never to an already closed window
  (a late event joins the open window, as in :meth:`stream_anon.engine.Engine.process`). So every accepted event
  is counted once, and batch boundaries do not matter. When the watermark enters a new window the open window
  closes and the aggregator releases it (and every skipped window, empty: publication never depends on data).
- **Ledger**: ``<state_dir>/<app_id>/<stream>-p<partition>.ledger.json`` (beside the partition checkpoint), written
  durably by :meth:`BudgetLedger.reserve_many` inside ``process`` -- i.e. **before** the worker delivers the
  rows that spend it. The counters, the open window's projected events and the watermark go into the partition
  checkpoint (``state["dp"]``) that the worker writes after delivery.
- **Restarts**: the worker re-processes input after its checkpoint. The re-closed windows find their
  reservations in the ledger (idempotent: nothing is spent twice) and get the same noise, because the noise
  seed is ``HMAC(stream secret, stream, partition)`` and each window's generator ``HMAC(seed, aggregate,
  component, output, window)`` (:func:`stream_anon.crypto.dp_noise_seed`). A re-produced row is identical to the
  first copy (same ``row_id``); consumers dedupe by ``row_id``.

Outputs: rows for ``anon.aggregates`` (see :func:`aggregate_row`), and for ``anon.metrics`` one ``dp_window``
event per closed window (contribution cuts, out-of-domain and missing events, epsilon spent) plus a
``budget_exhausted`` event when the ledger stops an aggregate.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from stream_anon import crypto

AGGREGATES_TOPIC = "anon.aggregates"


def ledger_path(state_dir, app_id: str, stream: str, partition: int) -> Path:
    return Path(state_dir) / app_id / f"{stream}-p{partition}.ledger.json"


def needed_fields(dp, event_time: str) -> tuple[str, ...]:
    """Every field the aggregates read: the buffered copy of an event keeps only these."""
    fields = [dp.privacy_unit, event_time]
    for s in dp.aggregates:
        for g in s.group_by:
            fields.extend(g.fields)
        if s.value_field:
            fields.append(s.value_field)
        fields.extend(k for k, _ in s.where)
    return tuple(dict.fromkeys(fields))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


class PartitionAggregates:
    """The DP aggregates of one input partition (see the module docstring).

    Parameters
    ----------
    config : StreamConfig
        With a ``dp`` section (``config.dp``); windows are ``config.anonymization.window_s``.
    partition : int
    secret : bytes
        The stream secret; the noise seed is derived from it and never stored.
    ledger_file : str or Path or None
        The partition's budget ledger (``None``: in memory, tests only).
    state : dict, optional
        ``state_dict()`` of a checkpoint to resume from.
    """

    def __init__(self, config, partition: int, secret: bytes, ledger_file, state: dict | None = None):
        if config.dp is None:
            raise ValueError("config.dp: the stream configuration has no [dp] / [[aggregates]] tables")
        if not secret:
            raise ValueError("secret: required (the noise seed is derived from it)")
        # imported here: the worker module stays light for streams without aggregates (diffprivlib pulls sklearn)
        from stream_anon.dp import BudgetLedger, DPAggregator
        from stream_anon.engine.engine import get_path
        from stream_anon.engine.space import parse_time

        self._get_path, self._parse_time = get_path, parse_time
        self.dp = config.dp
        self.stream = config.stream.name
        self.partition = int(partition)
        self.window_s = float(config.anonymization.window_s)
        self.time_field = config.stream.event_time
        self.fields = needed_fields(self.dp, self.time_field)
        self.ledger = BudgetLedger(ledger_file, self.dp.epsilon_budget)
        seed = crypto.dp_noise_seed(secret, self.stream, self.partition)
        if state is None:
            self.aggregator = DPAggregator(self.dp, self.ledger, seed, stream=self.stream)
            self.watermark, self.open_window = -np.inf, None
            self.buffer = {f: [] for f in self.fields}     # open window's events, column by column (compact JSON)
        else:
            self.aggregator = DPAggregator.from_state(self.dp, self.ledger, seed, state["aggregator"],
                                                      stream=self.stream)
            self.watermark = -np.inf if state["watermark"] is None else float(state["watermark"])
            self.open_window = state["open_window"]
            self.buffer = {f: list(state["buffer"][f]) for f in self.fields}

    # -- processing --------------------------------------------------------------------------------------------
    def process(self, events) -> tuple[list[dict], list[dict]]:
        """Feed accepted events (dicts, arrival order); returns (aggregate rows, metric events) of the windows
        that closed. The ledger is on disk before this returns."""
        rows: list[dict] = []
        metrics: list[dict] = []
        tf, ws = self.time_field, self.window_s
        get_path, parse_time = self._get_path, self._parse_time
        pending: list = []            # events of the open window in this call, copied into the buffer in bulk
        for e in events:
            t = parse_time(get_path(e, tf))
            if t is None:           # the engine rejects such events before they get here; never guess a window
                continue
            if t > self.watermark:
                self.watermark = t
            mark = int(self.watermark // ws)
            if self.open_window is None:
                self.open_window = mark
            elif mark > self.open_window:
                self._extend(pending)
                pending = []
                self._close(rows, metrics)
                self.open_window = mark
            pending.append(e)
        self._extend(pending)
        return rows, metrics

    def _extend(self, events: list) -> None:
        get_path = self._get_path
        for f, column in self.buffer.items():
            if "." in f:
                column.extend([get_path(e, f) for e in events])
            else:                   # a top-level field (get_path would find it the same way, one call slower)
                column.extend([e.get(f) for e in events])

    def flush(self) -> tuple[list[dict], list[dict]]:
        """Close the open window now (end of a replay / idle input; mirrors :meth:`Engine.flush`). Later events
        whose watermark still lies in it go to the next window."""
        rows: list[dict] = []
        metrics: list[dict] = []
        if self.open_window is not None and self.buffer[self.time_field]:
            self._close(rows, metrics)
            self.open_window += 1
        return rows, metrics

    def messages(self, events, rejected, flush: bool, dumps, metrics_topic: str) -> tuple[list, int]:
        """The worker's entry point for one partition batch: ``(topic, key, value)`` messages and the number of
        aggregate rows. ``events`` are the batch's schema-valid events, ``rejected`` the engine's rejections of
        them (not counted, as they are dead-lettered); ``flush`` closes the open window (idle input)."""
        if events:
            bad = {id(r.event) for r in rejected}
            rows, metrics = self.process([e for e in events if id(e) not in bad])
        elif flush:
            rows, metrics = self.flush()
        else:
            return [], 0
        key = self.stream.encode()
        out = [(AGGREGATES_TOPIC, key, dumps(r)) for r in rows]
        out.extend((metrics_topic, key, dumps(m)) for m in metrics)
        return out, len(rows)

    def _close(self, rows: list, metrics: list) -> None:
        w = self.open_window
        names = list(self.buffer)
        flats = [dict(zip(names, vals)) for vals in zip(*self.buffer.values())]
        out = self.aggregator.process_window(w, flats, flat=True)     # reserves (writes) the ledger first
        self.buffer = {f: [] for f in self.fields}
        now = _now_iso()
        spent = {}                 # window -> ledger total through it (gap windows are released here too)
        for r in out:
            if r["type"] == "aggregate":
                if r["window"] not in spent:
                    spent[r["window"]] = self.ledger.spent_through(r["window"])
                rows.append(self.aggregate_row(r, spent[r["window"]]))
            else:                                              # budget_exhausted
                metrics.append({**r, "partition": self.partition, "ts": now})
        wm = self.aggregator.window_metrics
        metrics.append({**wm, "partition": self.partition, "ts": now,
                        "window_start": _iso(w * self.window_s), "window_end": _iso((w + 1) * self.window_s),
                        "epsilon_spent": self.ledger.spent, "epsilon_budget": self.ledger.epsilon_budget})

    def aggregate_row(self, r: dict, spent_through: float) -> dict:
        """One ``anon.aggregates`` value: the aggregator's row plus partition, window bounds, the ledger's total
        through this window, and ``row_id`` (dedupe key: a re-produced row is identical)."""
        w = r["window"]
        row = {**r, "partition": self.partition, "window_start": _iso(w * self.window_s),
               "window_end": _iso((w + 1) * self.window_s), "ledger_epsilon_spent": spent_through,
               "ledger_epsilon_budget": self.ledger.epsilon_budget}
        # release: "<window>", or "<window>~<n>" for a paid re-release of a window re-closed with other content
        row["row_id"] = (f"{self.stream}/p{self.partition}/{r['aggregate']}/{r['output']}/w{r['release']}/"
                         f"{r['group_key']}")
        return row

    # -- checkpoint --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"aggregator": self.aggregator.state_dict(),
                "watermark": None if not np.isfinite(self.watermark) else float(self.watermark),
                "open_window": self.open_window, "buffer": self.buffer}


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def for_partition(config, state_dir, app_id: str, partition: int, secret: bytes,
                  checkpoint_state: dict | None) -> PartitionAggregates | None:
    """The partition's aggregates (resumed from ``checkpoint_state["dp"]`` when present), or None when the
    stream has no aggregates."""
    if config.dp is None or not config.dp.aggregates:
        return None
    dp_state = (checkpoint_state or {}).get("dp")
    return PartitionAggregates(config, partition, secret,
                               ledger_path(state_dir, app_id, config.stream.name, partition), dp_state)


def read_dp_report(bootstrap: str, config, idle_s: float = 1.0) -> dict:
    """The ``dp`` section of the demo report, from what is on the broker: ``anon.aggregates`` and ``anon.metrics``
    (deduplicated by ``row_id`` and by (partition, window) / (partition, aggregate)), and the raw input topic,
    read partition by partition in offset order (dead-lettered offsets left out) for the true running counts.

    Headline error figures: the first count aggregate with both outputs (else the first running count);
    ``running_counts`` has every running count aggregate.
    """
    import json

    from stream_anon.audit.kafka_source import read_topic
    from stream_anon.dp.report import running_count_errors, true_window_values, watermark_windows
    from stream_anon.engine.engine import get_path
    from stream_anon.engine.space import parse_time
    from stream_anon.kafka.worker import DEADLETTER_TOPIC, METRICS_TOPIC

    stream, dp = config.stream.name, config.dp

    def docs(topic):
        for src, value in read_topic(bootstrap, topic, idle_s=idle_s):
            try:
                yield src, json.loads(value)
            except ValueError:
                continue

    rows = {d["row_id"]: d for _, d in docs(AGGREGATES_TOPIC) if d.get("stream") == stream}
    windows_m, exhausted = {}, {}
    for _, d in docs(METRICS_TOPIC):
        if d.get("stream") != stream:
            continue
        if d.get("type") == "dp_window":
            windows_m[(d["partition"], d["window"])] = d
        elif d.get("type") == "budget_exhausted":
            exhausted[(d["partition"], d["aggregate"])] = d
    dead = {(d["source"]["partition"], d["source"]["offset"]) for _, d in docs(DEADLETTER_TOPIC)
            if d.get("stream") == stream and d.get("source")}
    raw: dict[int, list] = {}
    for (_, p, off), d in sorted(docs(config.stream.input_topic), key=lambda x: x[0]):
        if (p, off) not in dead:
            raw.setdefault(p, []).append(d)

    def time_of(e):
        return parse_time(get_path(e, config.stream.event_time))

    by_partition = {p: watermark_windows(evs, time_of, config.anonymization.window_s) for p, evs in raw.items()}
    running = []
    for spec in dp.aggregates:
        if spec.kind != "count" or spec.output == "per_window":
            continue
        truth = {(p, w): x["count"] for p, ws in by_partition.items()
                 for w, x in true_window_values(dp, spec.name, ws).items()}
        running.append(running_count_errors([r for r in rows.values() if r["aggregate"] == spec.name], truth, spec))
    head = next((e for e in running if "naive_count_rmse" in e), running[0] if running else {})
    spent = [d["epsilon_spent"] for d in windows_m.values()]
    cut: dict[str, int] = {}
    for d in windows_m.values():
        for a, n in d["contributions_cut"].items():
            cut[a] = cut.get(a, 0) + n
    return {
        "epsilon_budget": dp.epsilon_budget,
        "epsilon_spent_max_individual": max(spent, default=0.0),
        "aggregates_published": len(rows),
        "budget_exhausted_events": len(exhausted),
        "continual_count_rmse": head.get("continual_count_rmse"),
        "continual_count_rmse_theory": head.get("continual_count_rmse_theory"),
        "naive_count_rmse": head.get("naive_count_rmse"),
        "windows": head.get("windows"),
        "error_aggregate": head.get("aggregate"),
        "mechanism": head.get("mechanism"),
        "contributions_cut": cut,
        "budget_exhausted": sorted(f"{a} (partition {p}, window {d['window']})" for (p, a), d in exhausted.items()),
        "running_counts": running,
        "notes": {
            "epsilon_spent_max_individual": "largest ledger total of a partition: every release is charged to "
                                            "every individual of the partition (worst case), and an individual "
                                            "lives in one partition",
            "error": "stream-wide running counts (sum over partitions) against the true bounded counts of the "
                     "same windows, over the windows every partition published; theory = root mean of the noise "
                     "variances stated on the rows; naive = prefix sums of the per-window rows (identical to the "
                     "continual figure when the configured horizon selects per-window noising, e.g. 96 windows)",
            "aggregates_published": "distinct rows (row_id) on anon.aggregates, every partition, output and key",
        },
    }
