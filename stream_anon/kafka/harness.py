"""Test and benchmark harness of the worker (not used by the worker itself): worker subprocess control, an
output reader with the accounting equation, run-until-accounted, the DP figures of the demo report, and a
crashing wrapper that kills a worker between delivering a batch and checkpointing it (the worst moment).
"""
from __future__ import annotations

import argparse
import json
import random
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from stream_anon.audit.kafka_source import read_topic
from stream_anon.connection import as_connection, secret_env, to_args
from stream_anon.config import load_config
from stream_anon.dp.merge import merge_rows
from stream_anon.dp.report import (aggregate_rmse, membership_auc, release_relative_errors, running_count_errors,
                                   true_window_values)
from stream_anon.engine import event_windows, get_path
from stream_anon.engine.space import parse_time
from stream_anon.kafka.render import TOPICS

KILL_AFTER_ENV = "STREAM_ANON_TEST_KILL_AFTER_BATCHES"
KILL_IN_FLUSH_ENV = "STREAM_ANON_TEST_KILL_IN_FLUSH"


class OutputReader:
    """Incrementally reads anon.releases and anon.deadletter (from the beginning; no reliance on end offsets)."""

    def __init__(self, bootstrap, stream: str):
        """``bootstrap``: 'HOST:PORT' or a :class:`stream_anon.connection.KafkaConnection`."""
        from kafka import KafkaConsumer, TopicPartition

        self.stream = stream
        self.consumer = KafkaConsumer(**as_connection(bootstrap).kafka_python(), enable_auto_commit=False,
                                      group_id=None, auto_offset_reset="earliest", client_id="stream-anon-accounting")
        tps = []
        for topic in (TOPICS.releases, TOPICS.deadletter):
            parts = self.consumer.partitions_for_topic(topic) or {0}
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        self.consumer.seek_to_beginning(*tps)
        self.manifests: dict[str, dict] = {}
        self.deadletters: dict[tuple, dict] = {}

    def poll(self, timeout_ms: int = 500) -> None:
        batch = self.consumer.poll(timeout_ms=timeout_ms, max_records=10000)
        for tp, recs in batch.items():
            for r in recs:
                try:
                    doc = json.loads(r.value)
                except ValueError:
                    continue
                if doc.get("stream") != self.stream:
                    continue
                if tp.topic == TOPICS.releases:
                    self.manifests.setdefault(doc["release_id"], doc)
                else:
                    src = doc.get("source") or {}
                    # one message of a multi-event format (gtfs-realtime) may dead-letter several events: the
                    # event's index in it is part of its source
                    key = (src.get("topic"), src.get("partition"), src.get("offset"), src.get("index"))
                    if src.get("offset") is None:
                        key = key + (doc.get("reason"), doc.get("payload"))
                    self.deadletters.setdefault(key, doc)

    def accounting(self) -> dict:
        published = sum(m.get("published", 0) for m in self.manifests.values())
        suppressed = sum(sum((m.get("suppressed") or {}).values()) for m in self.manifests.values())
        latest: dict[int, dict] = {}
        for m in self.manifests.values():
            p = m.get("partition")
            if p not in latest or m.get("seq", -1) > latest[p].get("seq", -1):
                latest[p] = m
        deferred = sum(m.get("deferred", 0) for m in latest.values())
        dead = len(self.deadletters)
        return {"releases": len(self.manifests), "published": published, "suppressed": suppressed,
                "deferred": deferred, "dead_lettered": dead,
                "accounted": published + suppressed + deferred + dead}

    def close(self) -> None:
        self.consumer.close()


def worker_command(config_path, bootstrap: str, state_dir, app_id: str | None = None,
                   flush_when_idle_s: float | None = None, extra: list[str] | None = None,
                   kill_after_batches: int | None = None, kill_in_flush: bool = False) -> list[str]:
    """``python -m stream_anon.kafka.app ...``, or this module's crashing wrapper (:func:`crash_main`)."""
    entry = ["-m", "stream_anon.kafka.app"]
    if kill_after_batches or kill_in_flush:
        entry = ["-m", "stream_anon.kafka.harness"] + (["--kill-in-flush"] if kill_in_flush else []) + \
            (["--kill-after-batches", str(kill_after_batches)] if kill_after_batches else [])
    cmd = [sys.executable, *entry, "--config", str(config_path), *to_args(as_connection(bootstrap)),
           "--state-dir", str(state_dir)]
    if app_id:
        cmd += ["--app-id", app_id]
    if flush_when_idle_s:
        cmd += ["--flush-when-idle", str(flush_when_idle_s)]
    return cmd + list(extra or [])


def start_worker_process(config_path, bootstrap: str, state_dir, app_id: str | None = None,
                         flush_when_idle_s: float | None = None, log_path=None, env=None, extra=None):
    """Start a worker subprocess (own process group). ``STREAM_ANON_TEST_KILL_AFTER_BATCHES=N`` in ``env`` starts
    the crashing wrapper instead (:func:`crash_main`)."""
    env = {**(env or os.environ.copy()), **secret_env(as_connection(bootstrap))}
    kill_after = int(env.get(KILL_AFTER_ENV, "0") or 0)
    cmd = worker_command(config_path, bootstrap, state_dir, app_id, flush_when_idle_s, extra, kill_after,
                         env.get(KILL_IN_FLUSH_ENV) == "1")
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    if log_path:
        out.close()
    return proc


def stop_worker_process(proc, timeout_s: float = 20.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


def run_until_accounted(config, bootstrap: str, state_dir, expected_events: int, timeout_s: float = 120.0,
                        app_id: str | None = None, flush_when_idle_s: float = 2.0, log_path=None,
                        progress: bool = False, extra: list[str] | None = None) -> dict:
    """Run a worker subprocess until every input event is accounted for, then stop it.

    ``config`` is the path of the stream's TOML (or a StreamConfig with ``.source``). Accounted = published +
    suppressed (over manifests deduped by release_id) + deferred (latest manifest per partition) + dead-lettered
    (deduped by source offset), read back from ``anon.releases`` and ``anon.deadletter``. The worker flushes a
    partition's engine after ``flush_when_idle_s`` without input (end of a replay). Returns the accounting plus
    ``seconds`` and ``events_per_s``; raises TimeoutError (with the accounting) when not reached in time.
    """
    config_path = getattr(config, "source", None) or config
    cfg = config if hasattr(config, "stream") else load_config(config_path)
    t0 = time.monotonic()
    proc = start_worker_process(config_path, bootstrap, state_dir, app_id, flush_when_idle_s, log_path, extra=extra)
    reader = OutputReader(bootstrap, cfg.stream.name)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=expected_events, desc=f"accounted {cfg.stream.name}", unit="ev",
                   disable=not sys.stderr.isatty())     # a bar only on a terminal, never in a log file
    try:
        acc = reader.accounting()
        while time.monotonic() - t0 < timeout_s:
            reader.poll(500)
            acc = reader.accounting()
            if bar is not None:
                bar.n = min(acc["accounted"], expected_events)
                bar.refresh()
            if acc["accounted"] >= expected_events and acc["deferred"] == 0:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with code {proc.returncode} before all events were accounted "
                                   f"for: {acc}" + (f" (log: {log_path})" if log_path else ""))
        else:
            raise TimeoutError(f"not all {expected_events} events accounted for within {timeout_s}s: {acc}")
        acc["seconds"] = round(time.monotonic() - t0, 3)
        acc["events_per_s"] = round(expected_events / acc["seconds"], 1) if acc["seconds"] else None
        acc["expected"] = expected_events
        return acc
    finally:
        if bar is not None:
            bar.close()
        reader.close()
        stop_worker_process(proc)





# the count whose relative error the demo reports (issue 14's target: hourly tap-ins per zone, oyster-cards)
RELATIVE_ERROR_AGGREGATE = "tap_ins_zone_hour"


def read_dp_report(bootstrap: str, config, idle_s: float = 1.0, attack: bool = True) -> dict:
    """The ``dp`` section of the demo report, from what is on the broker: ``anon.aggregates`` (the analyst's view:
    :func:`stream_anon.kafka.aggregates_view.read_rows`) and ``anon.metrics`` (deduplicated by (partition,
    window) / (partition, aggregate)), and the raw input topic, read partition by partition in offset order
    (dead-lettered offsets left out) for the true values.

    Headline error figures: the first count aggregate with both outputs (else the first running count);
    ``running_counts`` has every running count aggregate; ``aggregates_rmse`` every aggregate's merged releases
    against the unbounded truth; ``membership_inference`` (``attack``) the attack of
    :func:`stream_anon.dp.report.membership_auc` on the raw events of the first period.
    """
    from stream_anon.kafka.aggregates_view import ledger_charge_by_period, read_rows

    stream, dp = config.stream.name, config.dp

    def docs(topic):
        for src, value in read_topic(bootstrap, topic, idle_s=idle_s):
            try:
                yield src, json.loads(value)
            except ValueError:
                continue

    rows = read_rows(bootstrap, stream, idle_s=idle_s)
    windows_m, exhausted = {}, {}
    for _, d in docs(TOPICS.metrics):
        if d.get("stream") != stream:
            continue
        if d.get("type") == "dp_window":
            windows_m[(d["partition"], d["window"])] = d
        elif d.get("type") == "budget_exhausted":
            exhausted[(d["partition"], d["aggregate"])] = d
    dead = {(d["source"]["partition"], d["source"]["offset"]) for _, d in docs(TOPICS.deadletter)
            if d.get("stream") == stream and d.get("source")}
    raw: dict[int, list] = {}
    for (_, p, off), d in sorted(docs(config.stream.input_topic), key=lambda x: x[0]):
        if (p, off) not in dead:
            raw.setdefault(p, []).append(d)

    by_partition = {p: windows_by_event_time(evs, config) for p, evs in raw.items()}
    running = []
    for spec in dp.aggregates:
        if spec.kind != "count" or spec.output == "per_window":
            continue
        truth = {(p, w): x["count"] for p, ws in by_partition.items()
                 for w, x in true_window_values(dp, spec.name, ws).items()}
        running.append(running_count_errors([r for r in rows.values() if r["aggregate"] == spec.name], truth, spec))
    head = next((e for e in running if "naive_count_rmse" in e), running[0] if running else {})
    spent = [d["epsilon_spent"] for d in windows_m.values()]
    per_period = {p: v for p, v in ledger_charge_by_period(rows.values()).items() if p is not None}
    merged = merge_rows(rows.values())
    stream_windows = dict(windows_by_event_time([e for evs in raw.values() for e in evs], config))
    relative = release_relative_errors(dp, merged, stream_windows, RELATIVE_ERROR_AGGREGATE)
    attack_result = membership_auc(dp, stream_windows) if attack else None
    cut: dict[str, int] = {}
    for d in windows_m.values():
        for a, n in d["contributions_cut"].items():
            cut[a] = cut.get(a, 0) + n
    return {
        "epsilon_budget": dp.epsilon_budget,
        "privacy_unit": dp.privacy_unit if dp.unit == "individual" else dp.unit,
        "period": dp.period,
        "epsilon_spent_max_individual": max(spent, default=0.0),
        "epsilon_spent_max_individual_by_period": per_period,
        "aggregates_published": len(rows),
        "merged_rows": len(merged),
        "membership_inference_auc": attack_result and attack_result["auc_default_budget"],
        "membership_inference_auc_no_noise": attack_result and attack_result["auc_no_noise"],
        "membership_inference": attack_result,
        "relative_error": relative,
        "aggregates_rmse": aggregate_rmse(dp, merged, stream_windows),
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
            "aggregates_published": "distinct rows (row_id) on anon.aggregates, every partition, output and key; "
                                    "merged_rows: one per window and key (stream-anon aggregates)",
            "epsilon_spent_max_individual_by_period": "per period (e.g. day): the largest ledger charge of a "
                                                      "partition through its last release of the period",
            "membership_inference_auc": "likelihood-ratio membership test (Pyrgelis et al., NDSS 2018) on the count "
                                        "aggregates of the first period: AUC of telling whether a known card is in a "
                                        "group of cards from the group's releases at the configured budget (0.5: "
                                        "guessing); _no_noise: the same on the noise-free bounded counts",
            "relative_error": "|released - true| / true of the merged hourly releases of tap_ins_zone_hour per zone "
                              "against the unbounded true count, over the zone-hours with at least min_true_count "
                              "taps (the bundled slice is a sample: few or no zone-hours reach 500)",
            "aggregates_rmse": "RMSE of each aggregate's merged releases against the unbounded truth (counts in "
                               "events, means in pence, ratios as shares)",
        },
    }


def committed_offsets(bootstrap: str, group: str, topic: str, partitions) -> dict[int, int | None]:
    """The group's committed offsets of ``topic`` (None where nothing is committed)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
    finally:
        c.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}


def committed_states(bootstrap: str, app_id: str, stream: str, partitions, idle_s: float = 1.0) -> dict[int, dict]:
    """Each partition's committed state: its core with its tables (name -> (keys, rows)) under ``tables`` (read
    back as a recovering worker would, for tests and benchmarks of a stopped worker: the state topic is read until
    idle rather than to a barrier)."""
    from stream_anon.kafka import state as st

    topic = st.state_topic(app_id)
    markers = committed_offsets(bootstrap, app_id, topic, partitions)
    logs: dict[int, st.StateLog] = {}
    for (_, p, _), value in read_topic(bootstrap, topic, idle_s=idle_s):
        logs.setdefault(p, st.StateLog()).add(value)
    out = {}
    for p in partitions:
        rec = st.choose_state(logs.get(p, st.StateLog()), markers.get(p), None)
        if rec.doc is not None:
            out[p] = {**rec.doc, "tables": rec.tables}
    return out


def windows_by_event_time(events: list, config) -> list[tuple[int, list]]:
    """One partition's events grouped by the engine's window rule (the window of their event time), in order."""
    times = [parse_time(get_path(e, config.stream.event_time)) for e in events]
    kept = [(t, e) for t, e in zip(times, events) if t is not None]
    if not kept:
        return []
    marks = event_windows(np.array([t for t, _ in kept]), config.anonymization.window_s).tolist()
    by_window: dict[int, list] = {}
    for w, (_, e) in zip(marks, kept):
        by_window.setdefault(w, []).append(e)
    return sorted(by_window.items())


# --------------------------------------------------------------------------------- hostile input (fuzz, chaos)
POISON_TIMES = ("9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59")   # schema-valid; year 10000 / 0 in UTC


def _deep(depth: int) -> bytes:
    """JSON text nested ``depth`` levels (objects or arrays), built as text: encoders refuse such depths."""
    return (b'{"a":' * depth + b'"x"' + b"}" * depth) if depth % 2 else (b"[" * depth + b'"x"' + b"]" * depth)


EXTREME_TIMES = [*POISON_TIMES, "0001-01-01T00:00:00+00:00", "9999-12-31T23:59:59+00:00", "2009-11-09T07:00:00",
                 "2009-13-45T99:99:99+00:00", "", "2009-11-09T07:00:00+99:00", 1e308, -1e308, 10 ** 30, 2 ** 63,
                 -(2 ** 63), 0, 1257750000, 1.5e9, True, "NaN", "\ud800", "2009-11-09T07:00:00.123456789+00:00"]
EXTREME_VALUES = [1e308, -1e308, 10 ** 18, 2 ** 63 - 1, -(2 ** 63), -1, 0.5, 1e-308, 5e-324, True, False, None, "",
                  "<script>alert(1)</script>", "'; DROP TABLE fares; --", "a\x00b", "\ud800", "\udfff\ud800",
                  "x" * 10_000, "\u202e\u0000", [], {}, [1, [2, [3]]], {"$ne": None}, "LUL Travelcard-7 Day"]


def mutate(event: dict, rng: random.Random) -> bytes:
    """One hostile message derived from a real event."""
    e = json.loads(json.dumps(event))
    kind = rng.randrange(9)
    keys = list(e)
    if kind == 0:       # random byte flips in the serialized message
        raw = bytearray(orjson.dumps(e))
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 1:       # field deletions
        for k in rng.sample(keys, rng.randint(1, 3)):
            del e[k]
    elif kind == 2:     # type swaps
        for k in rng.sample(keys, rng.randint(1, 3)):
            e[k] = rng.choice([[e[k]], {"v": e[k]}, 7, "7", 7.5, True, None, str(e[k])])
    elif kind == 3:     # extreme times
        e["event_time"] = rng.choice(EXTREME_TIMES)
    elif kind == 4:     # extreme numbers and hostile values in any field
        for k in rng.sample(keys, rng.randint(1, 2)):
            e[k] = rng.choice(EXTREME_VALUES)
    elif kind == 5:     # deep nesting
        e[rng.choice(keys + ["extra"])] = "__deep__"
        return orjson.dumps(e).replace(b'"__deep__"', _deep(rng.choice([10, 201, 254, 300, 999, 1000, 1100])))
    elif kind == 6:     # lone surrogates (JSON escapes: valid JSON, not valid Unicode text)
        k = rng.choice(["event_id", "journey_id", "station", "fare_product", "bus_route", "event_type"])
        e[k] = f"{e.get(k) or ''}\ud800"
        return json.dumps(e, ensure_ascii=True).encode()
    elif kind == 7:     # huge strings (some over the size limit)
        e[rng.choice(keys)] = "A" * rng.choice([1000, 60_000, 70_000])
    else:               # structural: not an object, duplicate keys, trailing garbage
        return rng.choice([b"[]", b"null", b"1e999", b'{"a":NaN}', orjson.dumps(e) + b"}", b"",
                           orjson.dumps(e)[:-1], b'{"event_id":"x","event_id":"y"}', b"\xff\xfe",
                           orjson.dumps([e])])
    try:
        return orjson.dumps(e)
    except orjson.JSONEncodeError:    # lone surrogates, integers beyond 64 bits
        return json.dumps(e).encode()



def crash_main(argv=None) -> int:
    """A worker that SIGKILLs itself at the worst moments (tests of restarts), then the usual worker options:

    ``--kill-after-batches N``: inside its N-th transaction, after the output and state records reached the
    broker and before the commit (the transaction stays open until the restarted worker fences it);
    ``--kill-in-flush``: inside the transaction that carries an idle flush's output, after the decision to flush
    was committed."""
    from stream_anon.kafka import app
    from stream_anon.kafka.loop import KafkaLoop

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--kill-after-batches", type=int, default=0)
    ap.add_argument("--kill-in-flush", action="store_true")
    args, rest = ap.parse_known_args(argv)
    end, flush = KafkaLoop._end_transaction, KafkaLoop._flush

    def end_or_die(self, prod, offsets):
        due = (args.kill_after_batches and self.counters["transactions"] + 1 >= args.kill_after_batches) or \
            (args.kill_in_flush and getattr(self, "_flushing", False) and not self._flush_decided_now)
        if due:
            prod.flush(10)
            os.kill(os.getpid(), signal.SIGKILL)
        self._flush_decided_now = False
        return end(self, prod, offsets)

    def flush_marked(self, ps):
        self._flushing, self._flush_decided_now = True, not ps.flush_pending
        try:
            return flush(self, ps)
        finally:
            self._flushing = False

    KafkaLoop._end_transaction, KafkaLoop._flush = end_or_die, flush_marked
    return app.worker_main(rest)


if __name__ == "__main__":
    sys.exit(crash_main(sys.argv[1:]))
