"""Per-event code never kills the worker (issue 10 item 1): in-process fuzz of ``WorkerCore`` (no broker).

20,000 messages mutated from real Oyster events (byte flips, field deletions, type swaps, extreme times and numbers,
deep nesting, lone surrogates, huge strings) go through ``WorkerCore.handle`` (the worker without Kafka) with a stub
``send``: no exception may leave it, and every message must be accounted for: dead-lettered (by source offset) or,
by its audit token, published, suppressed or still deferred. The two poison-pill timestamps are explicit cases,
and a batch whose engine call raises is bisected to its culprit.
"""
from __future__ import annotations

from pathlib import Path
import random
from collections import Counter

import orjson
import pytest

from stream_anon import crypto
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.engine import Engine
from stream_anon.worker.core import WorkerCore
from stream_anon.render import TOPICS
from _worker_harness import POISON_TIMES, mutate

# this checkout's bundled config (an installed stream_anon.configs may belong to another checkout)
OYSTER = Path(__file__).resolve().parents[2] / "configs" / "oyster.toml"
SECRET = b"fuzz-secret-6f1d0c9a8b7e2d4c3b5a69788f0e1d2c"


def oyster_config():
    return load_config(OYSTER)


class Sink:
    """The output messages of a run."""

    def __init__(self):
        self.messages: list[tuple[str, bytes, bytes]] = []

    def docs(self, topic) -> list[dict]:
        return [orjson.loads(v) for t, _, v in self.messages if t == topic]


def run_worker(config, state_dir, messages, batch=500, flush=True) -> tuple[WorkerCore, Sink]:
    """Feed (partition, offset, bytes) messages in batches, then flush every partition (end of input)."""
    sink = Sink()
    core = WorkerCore(config, "fuzz", SECRET, flush_when_idle_s=1e-9 if flush else None)
    for i in range(0, len(messages), batch):
        sink.messages.extend(core.handle(messages[i:i + batch]))
    if flush:
        sink.messages.extend(core.flush_all())
    return core, sink


def accounted(core: WorkerCore, sink: Sink, messages) -> dict:
    """Where every input message went; asserts each is in exactly one place."""
    dead = Counter((d["source"]["partition"], d["source"]["offset"]) for d in sink.docs(TOPICS.deadletter))
    assert all(n == 1 for n in dead.values()), "a message dead-lettered twice"
    placed = Counter(r["audit_token"] for r in sink.docs(TOPICS.records(core.stream)))
    manifests = sink.docs(TOPICS.releases)
    for m in manifests:
        for toks in m["suppressed_tokens"].values():
            placed.update(toks)
    latest = {}
    for m in manifests:
        latest[m["partition"]] = m
    for m in latest.values():
        placed.update(m["deferred_tokens"])
    expected = Counter()
    for p, off, raw in messages:
        if (p, off) not in dead:
            eid = orjson.loads(raw)["event_id"]    # accepted by the reader: a JSON object with a text event id
            expected[crypto.audit_token(SECRET, eid)] += 1
    assert placed == expected
    published = sum(m["published"] for m in manifests)
    suppressed = sum(sum(m["suppressed"].values()) for m in manifests)
    deferred = sum(m["deferred"] for m in latest.values())
    assert published + suppressed + deferred + len(dead) == len(messages)
    return {"dead_letters": len(dead), "published": published, "suppressed": suppressed, "deferred": deferred}


def fuzzed_messages(n: int, seed: int, share: float = 0.5) -> list[tuple[int, int, bytes]]:
    rng = random.Random(seed)
    events = load_events("oyster", limit=n)
    out, offsets = [], [0, 0]
    for e in events:
        p = int(e["journey_id"]) % 2 if str(e.get("journey_id", "")).isdigit() else 0
        raw = mutate(e, rng) if rng.random() < share else orjson.dumps(e)
        out.append((p, offsets[p], raw))
        offsets[p] += 1
    return out


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("when", POISON_TIMES)
def test_poison_pill_times_are_dead_lettered_with_a_reason(tmp_path, when):
    events = load_events("oyster", limit=60)
    poison = dict(events[30], event_id="poison-1", event_time=when)
    msgs = [(0, i, orjson.dumps(e)) for i, e in enumerate(events[:30] + [poison] + events[30:])]
    core, sink = run_worker(oyster_config(), tmp_path, msgs)
    dead = sink.docs(TOPICS.deadletter)
    assert [d["source"]["offset"] for d in dead] == [30]
    assert dead[0]["reason"].startswith("time: event_time value") and "outside configured domain" in dead[0]["reason"]
    assert dead[0]["audit_token"] == crypto.audit_token(SECRET, "poison-1")
    assert accounted(core, sink, msgs)["published"] == 60


def test_reader_rejects_instead_of_raising_and_names_the_exception(monkeypatch, caplog):
    engine = Engine(oyster_config(), secret=SECRET)
    events = load_events("oyster", limit=20)
    real = engine.space.encode

    def encode(columns):     # an encoder bug triggered by one value
        if any(v == "Bank" for v in columns["station"]):
            raise ZeroDivisionError("boom")
        return real(columns)
    monkeypatch.setattr(engine.space, "encode", encode)
    bad = [i for i, e in enumerate(events) if e.get("station") == "Bank"]
    events = events if bad else events[:10] + [dict(events[10], station="Bank")] + events[11:]
    bad = [i for i, e in enumerate(events) if e.get("station") == "Bank"]
    with caplog.at_level("WARNING", logger="stream_anon.engine.records"):
        records, rejected = engine.reader.read(events)
    assert rejected == [(i, "unreadable event: ZeroDivisionError") for i in bad]
    # the fallback is said (the class name only: an exception's text may quote an event's value)
    assert [r.getMessage() for r in caplog.records] == [
        f"reader: a batch of {len(events)} events raised ZeroDivisionError; reading them one by one"]
    assert records.index.tolist() == [i for i in range(len(events)) if i not in bad]


@pytest.mark.parametrize("fails_after_its_work", [False, True])
def test_a_failing_batch_is_bisected_to_its_culprit_and_the_rest_is_unchanged(tmp_path, monkeypatch,
                                                                              fails_after_its_work):
    """``fails_after_its_work``: the engine raises after it buffered the batch (open windows, deferred records):
    the partition must go back to the state as committed, not as the failed attempt left it."""
    events = load_events("oyster", limit=3000)
    culprits = {"x-culprit-1", "x-culprit-2"}
    poisoned = list(events)
    poisoned.insert(1200, dict(events[1199], event_id="x-culprit-1"))
    poisoned.insert(2500, dict(events[2499], event_id="x-culprit-2"))
    bad_tokens = {crypto.audit_token(SECRET, c) for c in culprits}
    real = Engine.process_records

    def process_records(self, rec):     # an engine bug triggered by two events
        if not fails_after_its_work and bad_tokens & set(rec.tokens):
            raise RuntimeError("engine bug")
        result = real(self, rec)
        if bad_tokens & set(rec.tokens):
            raise RuntimeError("engine bug")
        return result
    monkeypatch.setattr(Engine, "process_records", process_records)
    msgs = [(0, i, orjson.dumps(e)) for i, e in enumerate(poisoned)]
    core, sink = run_worker(oyster_config(), tmp_path / "a", msgs)
    dead = sink.docs(TOPICS.deadletter)
    assert sorted(d["source"]["offset"] for d in dead) == [1200, 2500]
    assert {d["reason"] for d in dead} == {"processing error: RuntimeError"}
    assert {d["audit_token"] for d in dead} == bad_tokens
    accounted(core, sink, msgs)
    # the same stream without the culprits gives the same releases (ids, classes, records, DP rows)
    clean = [(0, i, orjson.dumps(e)) for i, e in enumerate(events)]
    _, sink_clean = run_worker(oyster_config(), tmp_path / "b", clean)

    def content(s):
        out = Counter()
        for topic, _, value in s.messages:
            if topic == TOPICS.deadletter:
                continue
            doc = orjson.loads(value)
            for volatile in ("created_at", "ts", "received_at"):
                doc.pop(volatile, None)
            out[(topic, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))] += 1
        return out
    assert content(sink) == content(sink_clean)


def test_fuzz_20000_messages_no_exception_every_message_accounted(tmp_path, caplog):
    msgs = fuzzed_messages(20_000, seed=10)
    core, sink = run_worker(oyster_config(), tmp_path, msgs)     # raises if anything escapes the worker
    counts = accounted(core, sink, msgs)
    # the good half is published, or suppressed as late when a mutated but valid time moved event time ahead
    # (event-time windows: one far-ahead time makes the events after it late; see the lateness section)
    assert counts["dead_letters"] > 5000 and counts["published"] + counts["suppressed"] > 9000
    reasons = Counter(d["reason"].split(":")[0] for d in sink.docs(TOPICS.deadletter))
    assert "processing error" not in reasons, reasons      # the reader, not the bisection, catches bad input
    assert not any("isolating" in r.message for r in caplog.records)
    # nothing hostile is published: every sensitive value is inside its declared domain
    domains = {d.field: d for d in core.config.domains}
    for r in sink.docs(TOPICS.records(core.stream)):
        for f, v in r["sensitive"].items():
            assert domains[f].check(v) == (v, None), (f, v)


def test_idle_flush_waits_for_a_broker_that_answers_and_for_the_backlog_after_an_outage():
    """A broker paused for 30 s looked like a quiet stream: the idle flush closed the open windows and the backlog
    that followed the pause was suppressed as late (879 events). Quiet time counts only once the broker answers."""
    import time

    core = WorkerCore(oyster_config(), "fuzz", SECRET, flush_when_idle_s=2.0)
    core.handle([(0, i, orjson.dumps(e)) for i, e in enumerate(load_events("oyster", limit=50))])
    ps = core.parts[0]
    now = time.monotonic()
    ps.last_input = now - 10.0                    # no input for 10 s
    assert core.idle_partitions() == [ps]        # without a broker (in-process): wall time alone
    # the last answered probe was sent 1 s after the last input: the broker never confirmed 2 s of quiet
    assert core.idle_partitions(answered_at=now - 9.0) == []
    # answered now, but the outage ended 1 s ago: the backlog may still be on its way
    assert core.idle_partitions(answered_at=now, not_before=now - 1.0) == []
    assert core.idle_partitions(answered_at=now, not_before=now - 3.0) == [ps]
