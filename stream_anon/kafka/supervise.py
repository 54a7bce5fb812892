"""Run and watch a worker from outside (the demo, tests and benchmarks): worker subprocess control, an output reader
with the accounting equation, run-until-accounted, and the committed state of a stopped worker's partitions.
Nothing here is used by the worker itself; the test-only crash wrapper and the fuzzer live in
``tests/_worker_harness.py``.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stream_anon.audit.kafka_source import read_topic
from stream_anon.config import load_config
from stream_anon.connection import as_connection, secret_env, seek_to_first, to_args
from stream_anon.render import TOPICS, release_accounting

WORKER = ("-m", "stream_anon.kafka.app")

class OutputReader:
    """Incrementally reads anon.releases and anon.deadletter (from the beginning; no reliance on end offsets)."""

    def __init__(self, bootstrap, stream: str):
        """``bootstrap``: 'HOST:PORT' or a :class:`stream_anon.connection.KafkaConnection`."""
        from kafka import KafkaConsumer, TopicPartition

        self.stream = stream
        self.consumer = KafkaConsumer(**as_connection(bootstrap).kafka_python(), enable_auto_commit=False,
                                      group_id=None, auto_offset_reset="earliest", client_id="stream-anon-accounting",
                                      isolation_level="read_committed")
        tps = []
        for topic in (TOPICS.releases, TOPICS.deadletter):
            parts = self.consumer.partitions_for_topic(topic) or {0}
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        seek_to_first(self.consumer, tps)
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
                    key: tuple = (src.get("topic"), src.get("partition"), src.get("offset"), src.get("index"))
                    if src.get("offset") is None:
                        key = key + (doc.get("reason"), doc.get("payload"))
                    self.deadletters.setdefault(key, doc)

    def accounting(self) -> dict:
        """:func:`stream_anon.render.release_accounting` of what was read so far."""
        return release_accounting(list(self.manifests.values()), list(self.deadletters.values()))

    def close(self) -> None:
        self.consumer.close()


def worker_command(config_path, bootstrap: str, state_dir, app_id: str | None = None,
                   flush_when_idle_s: float | None = None, extra: list[str] | None = None,
                   entry: tuple[str, ...] = WORKER) -> list[str]:
    """``python -m stream_anon.kafka.app ...`` (``entry``: what ``python`` runs instead, taking the worker's
    options, e.g. a test's wrapper)."""
    cmd = [sys.executable, *entry, "--config", str(config_path), *to_args(as_connection(bootstrap)),
           "--state-dir", str(state_dir)]
    if app_id:
        cmd += ["--app-id", app_id]
    if flush_when_idle_s:
        cmd += ["--flush-when-idle", str(flush_when_idle_s)]
    return cmd + list(extra or [])


def start_worker_process(config_path, bootstrap: str, state_dir, app_id: str | None = None,
                         flush_when_idle_s: float | None = None, log_path=None, env=None, extra=None,
                         entry: tuple[str, ...] = WORKER):
    """Start a worker subprocess (own process group; ``entry`` as in :func:`worker_command`)."""
    env = {**(env or os.environ.copy()), **secret_env(as_connection(bootstrap))}
    cmd = worker_command(config_path, bootstrap, state_dir, app_id, flush_when_idle_s, extra, entry)
    log_file = open(log_path, "ab") if log_path else None
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL if log_file is None else log_file,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    if log_file is not None:
        log_file.close()
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


def committed_offsets(bootstrap: str, group: str, topic: str, partitions) -> dict[int, int | None]:
    """The group's committed offsets of ``topic`` (None where nothing is committed): the last committed ones, also
    while a killed worker's transaction holds offsets pending (read_committed would wait for it to time out, KIP-447's
    require_stable, up to the transaction timeout)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    # the group's coordinator moving or still loading (a new offsets topic, a broker restarted): asked again
    moving = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
              KafkaError.COORDINATOR_NOT_AVAILABLE}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted",
                  "logger": logging.getLogger("stream_anon.kafka.client")})
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                got = c.committed([TopicPartition(topic, p) for p in partitions],
                                  timeout=max(1.0, deadline - time.monotonic()))
                break
            except KafkaException as exc:
                if exc.args[0].code() not in moving or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        c.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}


def committed_states(bootstrap: str, app_id: str, stream: str, partitions, idle_s: float = 1.0) -> dict[int, dict]:
    """Each partition's committed state: its core with its tables (name -> (keys, rows)) under ``tables`` (read
    back as a recovering worker would, for tests and benchmarks of a stopped worker: the state topic is read until
    idle rather than to a barrier)."""
    from stream_anon.worker import state as st

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
