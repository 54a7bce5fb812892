"""The faust worker end to end against a real broker (Tansu and Apache Kafka) (worker processes started as
subprocesses).

Accounting is done here directly from the output topics (independent of the audit module): after deduplicating
releases by release_id and dead letters by source offset, every input event is published, suppressed or
dead-lettered exactly once.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import (account, collect, committed_offsets, copy_hierarchies, read_all,  # noqa: E402
                            record_batch_codecs, setup_stream, state_offsets, synthetic_fares, wait_for,
                            write_stream_config)

from stream_anon import crypto  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.topics import ensure_topics  # noqa: E402
from stream_anon.worker.input_checks import check_payload  # noqa: E402
from _worker_harness import start_worker_process  # noqa: E402  (honours the kill-at-the-worst-moment variables)
from stream_anon.kafka.supervise import OutputReader, run_until_accounted, stop_worker_process  # noqa: E402


# ------------------------------------------------------------------------------------------------ tests
def test_check_payload_reasons(tmp_path):
    cfg = load_config(write_stream_config(tmp_path, "unit", "raw.unit"))
    good = synthetic_fares(1)[0]
    assert check_payload(json.dumps(good).encode(), cfg) == (None, good)
    cases = {
        b"{not json": "malformed JSON: ",
        b"[1, 2]": "malformed event: expected a JSON object, got list",
        json.dumps({**good, "event_type": "teleport"}).encode(): "schema: event_type: 'teleport' is not one of",
        json.dumps({k: v for k, v in good.items() if k != "journey_id"}).encode(): "schema: journey_id: missing",
        json.dumps({**good, "full_fare_pence": "lots"}).encode(): "schema: full_fare_pence: expected integer",
        json.dumps({**good, "kind": "vehicle"}).encode(): "wrong kind: 'vehicle' on a fare stream",
        json.dumps({**good, "station": "x" * 5000}).encode(): "oversized payload: ",
    }
    for raw, prefix in cases.items():
        reason, event = check_payload(raw, cfg)
        assert event is None and reason.startswith(prefix), (raw[:60], reason)


def oyster_slice_stream(tmp_path, bootstrap, name, n):
    """The committed Oyster slice (data/, first n events) under configs/oyster.toml, renamed to a test stream.
    No fallback: a slice that cannot be loaded fails the test."""
    from stream_anon.datasets import load_events

    root = Path(__file__).resolve().parents[2]
    events = load_events("oyster", limit=n)
    assert len(events) == n, f"the committed Oyster slice has {len(events)} events, the test needs {n}"
    assert all(e["kind"] == "fare" and e["event_id"] for e in events)
    text = (root / "configs" / "oyster.toml").read_text()
    text = text.replace('name = "oyster"', f'name = "{name}"')
    text = text.replace('input_topic = "raw.fare.oyster"', f'input_topic = "raw.test.{name}"')
    (tmp_path / "cfg").mkdir(exist_ok=True)
    copy_hierarchies(tmp_path / "cfg")
    path = tmp_path / "cfg" / f"{name}.toml"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.stream.name == name and cfg.stream.input_topic == f"raw.test.{name}"
    ensure_topics(bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records", "anon.releases",
                                    "anon.deadletter", "anon.metrics"],
                  default_partitions={cfg.stream.input_topic: 4, f"anon.{name}.records": 1})
    return path, cfg, events


def test_replay_and_worker_end_to_end(broker, tmp_path, secret_env):
    n = 4000
    path, cfg, events = oyster_slice_stream(tmp_path, broker.bootstrap, "e2e", n)
    assert len(events) == n
    rep = replay(broker.bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False)
    assert rep["events"] == n and sum(rep["partitions"].values()) == n and len(rep["partitions"]) == 4
    acc = run_until_accounted(path, broker.bootstrap, tmp_path / "state", n, timeout_s=90,
                              log_path=tmp_path / "worker.log")
    print("end-to-end (Oyster slice):", acc, "replay:", rep)
    assert acc["accounted"] == n
    manifests, copies, records, dead = collect(broker.bootstrap, "e2e")
    assert len(dead) == acc["dead_lettered"]
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) + len(dead) == n
    assert {m["partition"] for m in manifests.values()} == {0, 1, 2, 3}
    # the published records carry no identifier; new classes hold >= k distinct individuals
    journeys = {e["journey_id"] for e in events if len(e["journey_id"]) >= 5}
    event_ids = {e["event_id"] for e in events}
    for recs in records.values():
        for r in recs:
            assert "journey_id" not in r and "card_id" not in r and "event_id" not in r
            values = {v for v in json.dumps(r).split('"')}
            assert not (values & journeys) and not (values & event_ids)
    for m in manifests.values():
        for c in m["classes"]:
            if not c["reused"]:
                assert c["individuals"] >= cfg.anonymization.k
    # release metrics are there; throughput metrics label lag as approximate
    metrics = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.metrics", stream="e2e")]
    assert sum(1 for d in metrics if d["type"] == "release") >= len(manifests)
    assert all("approximate" in d["lag_note"] for d in metrics if d["type"] == "throughput")
    # the state committed in the state topic covers the last offset of every partition, and the consumer offsets
    # committed in the same transactions are exactly one past it
    states = state_offsets(broker.bootstrap, "stream-anon-e2e", "e2e")
    committed = committed_offsets(broker.bootstrap, "stream-anon-e2e", cfg.stream.input_topic)
    print("committed after clean stop:", committed, "states:", states)
    for p, count in rep["partitions"].items():
        assert states[p] == count - 1 and committed[p] == count
    # the worker writes lz4-compressed batches (its default --compression), output and state alike (librdkafka
    # sends a batch uncompressed when lz4 would not make it smaller: small state markers)
    from kafka.record.default_records import DefaultRecordBatch as B
    codecs = {topic: set(record_batch_codecs(broker.bootstrap, topic))
              for topic in ("anon.e2e.records", "stream-anon-e2e-state")}
    assert codecs["anon.e2e.records"] == {B.CODEC_LZ4}
    assert B.CODEC_LZ4 in codecs["stream-anon-e2e-state"] <= {B.CODEC_LZ4, B.CODEC_NONE}


@pytest.mark.one_broker
def test_bad_input_goes_to_deadletter(broker, tmp_path, secret_env):
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "bad")
    events = synthetic_fares(1500, seed=12)
    g = events[100]
    bad = {
        "malformed": b'{"event_id": "BAD-1", "kind": "fare", ',
        "missing": json.dumps({k: v for k, v in g.items() if k != "event_time"} | {"event_id": "BAD-2"}),
        "mistyped": json.dumps({**g, "event_id": "BAD-3", "full_fare_pence": "one pound"}),
        "unknown_type": json.dumps({**g, "event_id": "BAD-4", "event_type": "teleport"}),
        "oversized": json.dumps({"event_id": "BAD-5", **{k: v for k, v in g.items() if k != "event_id"},
                                 "fare_product": "x" * 6000}),
        "far_past": json.dumps({**g, "event_id": "BAD-6", "event_time": "1999-01-01T00:00:00+00:00"}),
        "far_future": json.dumps({**g, "event_id": "BAD-7", "event_time": "2031-01-01T00:00:00+00:00"}),
        "not_in_hierarchy": json.dumps({**g, "event_id": "BAD-8", "station": "Atlantis"}),
    }
    # bad payloads in the middle of the stream: good events keep flowing around them
    # keyed by g's unit as a producer keys them (an unkeyed one may land on a partition its unit does not belong
    # on, and is dead-lettered as wrong_partition first: tests/worker/test_placement.py)
    key = crypto.pseudonym(secret_env, g["journey_id"])
    first = replay(broker.bootstrap, cfg.stream.input_topic, events[:700], "journey_id", progress=False,
                   raw_payloads=[(key, v) for v in bad.values()])
    rest = replay(broker.bootstrap, cfg.stream.input_topic, events[700:], "journey_id", progress=False)
    assert first["raw"] == len(bad) and rest["events"] == 800
    acc = run_until_accounted(path, broker.bootstrap, tmp_path / "state", 1500 + len(bad), timeout_s=90,
                              log_path=tmp_path / "worker.log")
    assert acc["dead_lettered"] == len(bad)
    manifests, copies, records, dead = collect(broker.bootstrap, "bad")
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert len(dead) == len(bad)
    assert not missing
    by_id = {}
    token_of = {crypto.audit_token(secret_env, f"BAD-{i}"): i for i in range(1, 9)}
    for doc in dead.values():
        assert doc["stream"] == "bad" and doc["source"]["topic"] == cfg.stream.input_topic
        assert isinstance(doc["source"]["offset"], int) and doc["received_at"]
        # identifiers never leave in clear: the privacy unit is pseudonymized, dropped fields are gone
        assert g["journey_id"] not in json.dumps(doc) and "BAD-" not in json.dumps(doc), doc
        if "audit_token" in doc:
            by_id[token_of[doc["audit_token"]]] = doc["reason"]
            if not doc.get("payload_truncated"):
                # journey_id is the privacy unit and listed in identifiers.drop: removed
                assert "journey_id" not in json.loads(doc["payload"])
        else:        # not a JSON object: identifiers cannot be located, so the payload is withheld
            assert "payload" not in doc and doc["payload_bytes"] == len(bad["malformed"]), doc
            by_id[1] = doc["reason"]
    print("dead letter reasons:", by_id)
    assert set(by_id) == set(range(1, 9))
    # one specific reason per kind of bad input: the worker's own checks, then the engine's rejections
    expected = {
        1: "malformed JSON: ",
        2: "schema: event_time: missing",
        3: "schema: full_fare_pence: expected integer",
        4: "schema: event_type: <value> is not one of",
        5: f"oversized payload: {len(bad['oversized'])} bytes > limit {cfg.limits.max_event_bytes}",
        6: "time: event_time value outside configured domain",
        7: "time: event_time value outside configured domain",
        8: "location: value is not in hierarchy 'test_location'",
    }
    for i, prefix in expected.items():
        assert by_id[i].startswith(prefix), (i, by_id[i])


def test_two_workers_split_partitions(broker, tmp_path, secret_env):
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "split")
    state = tmp_path / "state"       # a partition that moves resumes from its state in the state topic
    events = synthetic_fares(6000, seed=13)
    extra = ["--metrics-interval", "1"]

    def latest_throughput():
        latest = {}
        for _, d, _, _ in read_all(broker.bootstrap, "anon.metrics", stream="split", idle_s=0.3, max_wait_s=3):
            if d["type"] == "throughput" and d["app_id"] == "split-app":
                latest[d["pid"]] = d
        return latest

    def checkpointed_total():
        return sum(v + 1 for v in state_offsets(broker.bootstrap, "split-app", "split").values())

    procs = [start_worker_process(path, broker.bootstrap, state, "split-app", 2.0, tmp_path / "w1.log", extra=extra)]
    try:
        # 1) one worker owns all four partitions and processes the first half
        rep1 = replay(broker.bootstrap, cfg.stream.input_topic, events[:3000], "journey_id", progress=False)
        wait_for(lambda: checkpointed_total() == 3000, 60, "first half processed by worker 1")
        # 2) a second worker with the same app id joins: the group rebalances, two partitions move to it and it
        #    resumes them from their state in the state topic
        procs.append(start_worker_process(path, broker.bootstrap, state, "split-app", 2.0, tmp_path / "w2.log",
                                          extra=extra))

        def split():
            latest = {pid: d for pid, d in latest_throughput().items() if pid == procs[1].pid or
                      (pid == procs[0].pid)}
            if len(latest) != 2:
                return None
            parts = [set(d["partitions"]) for d in latest.values()]
            return parts if all(parts) and not (parts[0] & parts[1]) and (parts[0] | parts[1]) == {0, 1, 2, 3} \
                else None
        wait_for(split, 40, "both workers assigned disjoint partitions")
        # 3) the second half is split between them
        rep2 = replay(broker.bootstrap, cfg.stream.input_topic, events[3000:], "journey_id", progress=False)
        reader = OutputReader(broker.bootstrap, "split")
        try:
            def done():
                reader.poll(300)
                a = reader.accounting()
                return a if a["accounted"] >= 6000 and a["deferred"] == 0 else None
            acc = wait_for(done, 90, "6000 events accounted by two workers")
        finally:
            reader.close()
        time.sleep(1.5)
        latest = latest_throughput()
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            stop_worker_process(p)
    print("two workers:", {pid: (d["events_in"], d["partitions"]) for pid, d in latest.items()}, acc, rep1, rep2)
    w1, w2 = latest[procs[0].pid], latest[procs[1].pid]
    assert w1["events_in"] > 3000 and w2["events_in"] > 0, "both workers processed events"
    assert w1["events_in"] + w2["events_in"] == 6000, "each event processed by exactly one worker"
    assert set(w1["partitions"]).isdisjoint(w2["partitions"])
    assert sorted(w1["partitions"] + w2["partitions"]) == [0, 1, 2, 3]
    manifests, copies, records, dead = collect(broker.bootstrap, "split")
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) == 6000


def test_kill9_and_restart_loses_and_duplicates_nothing(broker, tmp_path, secret_env):
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "crash")
    state = tmp_path / "state"
    app_id = "crash-app"
    topic = cfg.stream.input_topic
    events = synthetic_fares(8000, seed=14)
    replay(broker.bootstrap, topic, events[:4000], "journey_id", progress=False)

    def checkpoints():
        return state_offsets(broker.bootstrap, app_id, "crash")

    # 1) worst moment: the worker dies (SIGKILL) inside its 6th transaction, output and state sent, not committed
    env = {**os.environ, "STREAM_ANON_TEST_KILL_AFTER_BATCHES": "6"}
    p1 = start_worker_process(path, broker.bootstrap, state, app_id, 2.0, tmp_path / "w1.log", env=env,
                              extra=["--batch-max", "250", "--batch-within", "0.2"])
    p1.wait(timeout=60)
    assert p1.returncode == -signal.SIGKILL
    cps = checkpoints()
    committed = committed_offsets(broker.bootstrap, app_id, topic)
    print("after hook kill: checkpoints", cps, "committed", committed)
    assert any(v >= 0 for v in cps.values())
    for p, off in committed.items():          # offsets are committed with the state, never past it
        assert off == cps[p] + 1, (p, off, cps)

    # 2) kill -9 from outside while it is in the middle of the stream: the second half arrives while it runs
    p2 = start_worker_process(path, broker.bootstrap, state, app_id, 2.0, tmp_path / "w2.log",
                              extra=["--batch-max", "40", "--batch-within", "0.2"])
    try:
        wait_for(lambda: sum(v + 1 for v in checkpoints().values()) > sum(v + 1 for v in cps.values()),
                 60, "progress after restart")
        replay(broker.bootstrap, topic, events[4000:6000], "journey_id", progress=False)
    finally:
        os.kill(p2.pid, signal.SIGKILL)
        p2.wait(timeout=10)
    replay(broker.bootstrap, topic, events[6000:], "journey_id", progress=False)
    cps2 = checkpoints()
    committed2 = committed_offsets(broker.bootstrap, app_id, topic)
    print("after kill -9: checkpoints", cps2, "committed", committed2)
    assert sum(v + 1 for v in cps2.values()) < 8000, "the kill did not land mid-stream"
    for p, off in committed2.items():
        assert off == cps2[p] + 1, (p, off, cps2)

    # 3) restart and run to the end
    acc = run_until_accounted(path, broker.bootstrap, state, 8000, timeout_s=90, app_id=app_id,
                              log_path=tmp_path / "w3.log")
    assert acc["accounted"] == 8000
    # the killed worker's aborted releases too (read_uncommitted): the same content as the committed ones
    _, copies, _, _ = collect(broker.bootstrap, "crash", committed=False)
    print("re-produced releases:", sum(1 for c in copies.values() if c > 1), "of", len(copies))
    assert any(c > 1 for c in copies.values()), "the hook kill re-produced at least one release"
    manifests, _, records, dead = collect(broker.bootstrap, "crash")
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) == 8000


@pytest.mark.one_broker
def test_replay_file_keys_by_pseudonym(broker, tmp_path, secret_env):
    from kafka import KafkaConsumer, TopicPartition

    from stream_anon.kafka.replay import replay_file

    path, cfg = setup_stream(tmp_path, broker.bootstrap, "rfile")
    events = synthetic_fares(300, seed=15)
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = replay_file(jsonl, cfg.stream.input_topic, broker.bootstrap, key_fn="journey_id", progress=False)
    assert rep["events"] == 300 and sum(rep["partitions"].values()) == 300
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", consumer_timeout_ms=3000)
    tps = [TopicPartition(cfg.stream.input_topic, p) for p in range(4)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    partition_of = {}
    n = 0
    for m in c:
        e = json.loads(m.value)
        n += 1
        assert m.key.decode() == crypto.pseudonym(secret_env, e["journey_id"])     # key = keyed pseudonym
        assert partition_of.setdefault(e["journey_id"], m.partition) == m.partition  # one individual, one partition
    c.close()
    assert n == 300
