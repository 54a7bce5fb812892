"""Fail closed on a real broker (Tansu and Apache Kafka) (issue 10): the fast cases of the chaos benchmark.

Each test starts worker processes, provokes one fault and judges the outputs independently (accounting from the
output topics, release ids with one content, halted partitions): a poison-pill timestamp, a worker killed inside
an idle flush, an input topic re-created under the worker, and a worker whose machine (disk included) is lost.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import (account, collect, read_all, setup_stream, state_offsets,  # noqa: E402
                            synthetic_fares, wait_for)

from stream_anon.broker import free_port  # noqa: E402
from _worker_harness import start_worker_process  # noqa: E402  (honours the kill-at-the-worst-moment variables)
from stream_anon.kafka.supervise import OutputReader, run_until_accounted, stop_worker_process  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402


def _get(port: int, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            body = r.read().decode()
            return r.status, (json.loads(body) if path != "/metrics" else body)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())
    except urllib.error.URLError:           # not listening yet
        return 0, {}


@pytest.mark.one_broker
def test_poison_pill_timestamps_are_dead_lettered_and_the_stream_goes_on(broker, tmp_path, secret_env):
    """Schema-valid times whose UTC instant lies outside datetime's years 1-9999 used to crash-loop the worker."""
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "poison")
    events = synthetic_fares(1200, seed=21)
    g = events[10]
    pills = [json.dumps({**g, "event_id": "PILL-1", "event_time": "9999-12-31T23:59:59-23:59"}),
             json.dumps({**g, "event_id": "PILL-2", "event_time": "0001-01-01T00:00:00+23:59"})]
    replay(broker.bootstrap, cfg.stream.input_topic, events[:600], "journey_id", progress=False, raw_payloads=pills)
    replay(broker.bootstrap, cfg.stream.input_topic, events[600:], "journey_id", progress=False)
    acc = run_until_accounted(path, broker.bootstrap, tmp_path / "state", 1202, timeout_s=90,
                              log_path=tmp_path / "w.log")
    assert acc["dead_lettered"] == 2
    manifests, _, records, dead = collect(broker.bootstrap, "poison")
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) == 1200
    reasons = sorted(d["reason"] for d in dead.values())
    assert all("outside configured domain" in r for r in reasons), reasons


def test_a_kill_inside_an_idle_flush_never_publishes_a_release_id_twice_with_different_content(
        broker, tmp_path, secret_env):
    """The flush decision is committed before its output: the restarted worker re-does the same flush, so the
    release the dead worker sent (aborted: read here with read_uncommitted; Tansu shows it to read_committed readers
    too) and the committed one agree."""
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "flushrace")
    events = synthetic_fares(900, seed=22, span_s=1200)        # ends inside a window: the flush closes it
    replay(broker.bootstrap, cfg.stream.input_topic, events, "journey_id", progress=False)
    state, app_id = tmp_path / "state", "flushrace-app"
    env = {**os.environ, "STREAM_ANON_TEST_KILL_IN_FLUSH": "1"}
    p1 = start_worker_process(path, broker.bootstrap, state, app_id, 1.0, tmp_path / "w1.log", env=env)
    p1.wait(timeout=90)
    assert p1.returncode == -signal.SIGKILL, "the worker was not killed inside its flush"
    acc = run_until_accounted(path, broker.bootstrap, state, 900, timeout_s=90, app_id=app_id,
                              flush_when_idle_s=1.0, log_path=tmp_path / "w2.log")
    assert acc["accounted"] == 900
    _, copies, _, _ = collect(broker.bootstrap, "flushrace", committed=False)   # asserts one content per id
    assert any(c > 1 for c in copies.values()), "the flush's release was sent before the kill"
    manifests, _, records, dead = collect(broker.bootstrap, "flushrace")
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) == 900


def test_a_recreated_input_topic_halts_its_partitions_until_the_operator_accepts(broker, tmp_path, secret_env):
    """Offsets in the state refer to the old topic: the worker must not skip the new topic's events as 'already
    processed' (it did: 3,000 events silently committed). It halts the partitions (log, alert metric, /readyz
    503), and resumes them from offset 0 of the new topic only with --accept-input-reset."""
    from confluent_kafka.admin import AdminClient, NewTopic

    path, cfg = setup_stream(tmp_path, broker.bootstrap, "reset")
    state, app_id = tmp_path / "state", "reset-app"
    first = synthetic_fares(800, seed=23)
    replay(broker.bootstrap, cfg.stream.input_topic, first, "journey_id", progress=False)
    acc = run_until_accounted(path, broker.bootstrap, state, 800, timeout_s=90, app_id=app_id,
                              log_path=tmp_path / "w1.log")
    assert acc["accounted"] == 800
    before = state_offsets(broker.bootstrap, app_id, "reset")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "logger": logging.getLogger("stream_anon.kafka.client")})
    admin.delete_topics([cfg.stream.input_topic])[cfg.stream.input_topic].result(30)
    wait_for(lambda: cfg.stream.input_topic not in admin.list_topics(timeout=10).topics, 20, "topic deleted")
    admin.create_topics([NewTopic(cfg.stream.input_topic, 4, 1)])[cfg.stream.input_topic].result(30)
    second = [{**e, "event_id": "N" + e["event_id"], "journey_id": "N" + e["journey_id"]}
              for e in synthetic_fares(600, seed=24)]
    replay(broker.bootstrap, cfg.stream.input_topic, second, "journey_id", progress=False)

    port = free_port()
    w = start_worker_process(path, broker.bootstrap, state, app_id, 1.0, tmp_path / "w2.log",
                             extra=["--web-port", str(port), "--metrics-interval", "1"])
    try:
        def halted():
            code, body = _get(port, "/readyz")
            return body if code == 503 and len(body.get("halted", {})) == 4 else None
        body = wait_for(halted, 60, "four halted partitions on /readyz")
        assert {h["reason"] for h in body["halted"].values()} <= {"input_topic_recreated",
                                                                  "state_without_committed_marker"}, body
        time.sleep(2)
        assert _get(port, "/livez")[0] == 200
        alerts = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.metrics", stream="reset")
                  if d.get("alert") == "partition_halted"]
        assert len({a["partition"] for a in alerts}) == 4
        assert "stream_anon_partition_halted" in _get(port, "/metrics")[1]
    finally:
        stop_worker_process(w)
    # nothing of the new topic was processed or skipped while halted
    assert state_offsets(broker.bootstrap, app_id, "reset") == before
    # the operator accepts: the state (and its DP ledger, signatures) carries on with the new topic
    acc = run_until_accounted(path, broker.bootstrap, state, 800 + 600, timeout_s=90, app_id=app_id,
                              log_path=tmp_path / "w3.log", extra=["--accept-input-reset"])
    assert acc["accounted"] == 1400
    manifests, _, records, dead = collect(broker.bootstrap, "reset")
    resolved, missing = account(first + second, secret_env, manifests, records, dead)
    assert not missing and len(resolved) == 1400


def test_losing_a_workers_machine_loses_no_event_and_reuses_no_release_id(broker, tmp_path, secret_env):
    """Two workers with separate state directories (two machines, no shared volume); one dies for good. The
    survivor recovers its partitions from the state topic: deferred events, release sequences and DP ledgers
    carry on (before, it restarted them: 157 release ids reused with other content, epsilon 95 of 50)."""
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "lostdisk")
    events = synthetic_fares(6000, seed=25)
    app_id = "lostdisk-app"
    small = ["--batch-max", "300", "--batch-within", "0.2"]
    w1 = start_worker_process(path, broker.bootstrap, tmp_path / "m1", app_id, 2.0, tmp_path / "w1.log", extra=small)
    w2 = start_worker_process(path, broker.bootstrap, tmp_path / "m2", app_id, 2.0, tmp_path / "w2.log", extra=small)
    try:
        replay(broker.bootstrap, cfg.stream.input_topic, events[:3000], "journey_id", progress=False)
        wait_for(lambda: sum(v + 1 for v in state_offsets(broker.bootstrap, app_id, "lostdisk").values()) >= 3000,
                 90, "first half processed by two workers")
        os.kill(w2.pid, signal.SIGKILL)          # machine 2 is gone, with its disk
        w2.wait(timeout=10)
        replay(broker.bootstrap, cfg.stream.input_topic, events[3000:], "journey_id", progress=False)
        reader = OutputReader(broker.bootstrap, "lostdisk")
        try:
            def done():
                reader.poll(300)
                a = reader.accounting()
                return a if a["accounted"] >= 6000 and a["deferred"] == 0 else None
            wait_for(done, 120, "6000 events accounted by the survivor")
        finally:
            reader.close()
        assert w1.poll() is None
    finally:
        stop_worker_process(w1)
        stop_worker_process(w2)                   # already gone unless the test failed before its kill
    manifests, copies, records, dead = collect(broker.bootstrap, "lostdisk")   # one content per release id
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) == 6000
    for p in range(4):                            # release sequences carried on: no gap, no restart at 0
        seqs = sorted(m["seq"] for m in manifests.values() if m["partition"] == p)
        assert seqs == list(range(len(seqs))), (p, seqs)
