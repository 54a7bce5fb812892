"""Helpers shared by the Kafka tests (not collected by pytest): a synthetic fare stream, a small stream
configuration, and reading a topic back from the broker."""
from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

from stream_anon.connection import seek_to_first

ZONES = {
    "Zone 1": ["Aldgate", "Bank", "Barbican", "Holborn", "Liverpool Street", "Moorgate", "Oxford Circus",
               "Victoria", "Waterloo", "Euston"],
    "Zone 2": ["Angel", "Brixton", "Camden Town", "Clapham North", "Finsbury Park", "Hammersmith",
               "Kilburn", "Mile End", "Shepherd's Bush", "Stratford"],
}
ROUTES = [str(r) for r in range(1, 21)]
START = datetime(2009, 11, 9, 6, 0, tzinfo=timezone.utc)


def write_stream_config(directory: Path, name: str, input_topic: str, k: int = 5, window_s: int = 900,
                        max_delay_s: int = 1800) -> Path:
    directory = Path(directory)
    (directory / "hierarchies").mkdir(parents=True, exist_ok=True)
    loc = {"name": "test_location", "levels": ["value", "zone", "mode", "*"],
           "tree": {"*": {"Rail": ZONES, "Bus": {"Routes 1-20": ROUTES}}}}
    (directory / "hierarchies" / "test_location.json").write_text(json.dumps(loc))
    et = {"name": "fare_event_type", "levels": ["value", "mode", "*"],
          "tree": {"*": {"rail": ["tap_in", "tap_out"], "bus": ["bus_boarding"]}}}
    (directory / "hierarchies" / "fare_event_type.json").write_text(json.dumps(et))
    path = directory / f"{name}.toml"
    path.write_text(f'''
[stream]
name = "{name}"
kind = "fare"
input_topic = "{input_topic}"
privacy_unit = "journey_id"
event_time = "event_time"
event_types = ["tap_in", "tap_out", "bus_boarding"]

[anonymization]
k = {k}
window_s = {window_s}
max_delay_s = {max_delay_s}
strategy = "mondrian"
seed = 0
reuse = "deadline"

[[quasi_identifiers]]
name = "time"
field = "event_time"
kind = "timestamp"
lower = "2009-11-09T00:00:00+00:00"
upper = "2009-11-10T06:00:00+00:00"

[[quasi_identifiers]]
name = "location"
field = ["station", "bus_route"]
kind = "station"
hierarchy = "hierarchies/test_location.json"

[[quasi_identifiers]]
name = "event_type"
field = "event_type"
kind = "categorical"
hierarchy = "hierarchies/fare_event_type.json"

[sensitive]
fields = ["fare_product", "full_fare_pence"]

[identifiers]
drop = ["journey_id", "card_id", "event_id"]

[limits]
max_event_bytes = 4096
''')
    return path


def synthetic_fares(n: int, seed: int = 1, start: datetime = START, span_s: int = 4 * 3600) -> list[dict]:
    """~n fare events in event-time order: rail journeys (tap_in + tap_out) and bus boardings."""
    rng = random.Random(seed)
    stations = [s for z in ZONES.values() for s in z]
    events = []
    j = 0
    while len(events) < n:
        j += 1
        t = start + timedelta(seconds=rng.randrange(span_s))
        base = {"kind": "fare", "journey_id": f"J{seed}-{j:06d}", "card_id": None, "fare_product": "PAYG",
                "product_category": "payg", "discounted_fare_pence": None, "daily_capping": False}
        if rng.random() < 0.25:
            events.append({**base, "event_id": f"E{seed}-{j:06d}-b", "event_type": "bus_boarding",
                           "event_time": t.isoformat(), "subsystem": "LTB", "station": None,
                           "bus_route": rng.choice(ROUTES), "full_fare_pence": 90})
        else:
            fare = rng.choice([150, 180, 240, 400])
            events.append({**base, "event_id": f"E{seed}-{j:06d}-i", "event_type": "tap_in",
                           "event_time": t.isoformat(), "subsystem": "LUL", "station": rng.choice(stations),
                           "bus_route": None, "full_fare_pence": fare})
            t2 = t + timedelta(seconds=rng.randrange(300, 2400))
            events.append({**base, "event_id": f"E{seed}-{j:06d}-o", "event_type": "tap_out",
                           "event_time": t2.isoformat(), "subsystem": "LUL", "station": rng.choice(stations),
                           "bus_route": None, "full_fare_pence": fare})
    events = events[:n]
    events.sort(key=lambda e: e["event_time"])
    return events


def copy_hierarchies(directory: Path) -> None:
    """The bundled hierarchies into ``directory/hierarchies``: a copy of a bundled config written there names
    them as the original does (a config's files lie in its directory tree)."""
    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "configs" / "hierarchies", Path(directory) / "hierarchies", dirs_exist_ok=True)


def write_cards_config(directory: Path, name: str, input_topic: str, m: int = 3, k: int | None = None) -> Path:
    """configs/oyster-cards.toml (persistent cards, m-invariance) renamed to a test stream, its hierarchies copied
    beside it; ``m``/``k`` override the file's."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "configs" / "oyster-cards.toml").read_text()
    text = text.replace('name = "oyster-cards"', f'name = "{name}"')
    text = text.replace('input_topic = "raw.fare.oyster-cards"', f'input_topic = "{input_topic}"')
    copy_hierarchies(directory)
    lines = []
    for line in text.splitlines():
        if line.startswith("m = "):
            line = f"m = {m}"
        elif k is not None and line.startswith("k = "):
            line = f"k = {k}"
        lines.append(line)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


END_GRACE_S = 3.0


def read_all(bootstrap, topic, stream=None, min_count=0, idle_s=1.5, max_wait_s=30.0, committed=True):
    """Every message of ``topic`` from the beginning: read until quiet for ``idle_s`` once the position has
    reached the end offsets seen at the start (a lower bound of what is there), or quiet for ``idle_s`` +
    :data:`END_GRACE_S` when it has not (a transaction left open by a killed worker holds the end back on Tansu).
    Quiet time alone ended a read before its first fetch on a loaded machine: an empty topic to the caller.
    ``committed=False``: aborted records too (a test's look at what a killed worker sent; Tansu shows them anyway)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest",
                      isolation_level="read_committed" if committed else "read_uncommitted")
    tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or {0})]
    c.assign(tps)
    seek_to_first(c, tps)
    ends = c.end_offsets(tps)
    out = []
    start = last = time.monotonic()
    while time.monotonic() - start < max_wait_s:
        batch = c.poll(timeout_ms=300, max_records=20000)
        for recs in batch.values():
            for r in recs:
                doc = json.loads(r.value)
                if stream is None or doc.get("stream", stream) == stream:
                    out.append((r.key.decode() if r.key else None, doc, r.partition, r.offset))
                last = time.monotonic()
        quiet = time.monotonic() - last
        if len(out) >= min_count and quiet > idle_s and (
                quiet > idle_s + END_GRACE_S or all(c.position(tp) >= ends[tp] for tp in tps)):
            break
    c.close()
    return out


def record_batch_codecs(bootstrap, topic) -> list[int]:
    """The compression codec of every record batch of ``topic`` as fetched from the broker (kafka-python's
    ``DefaultRecordBatch.CODEC_*``: 0 none, 1 gzip, 3 lz4): read through kafka-python with its fetcher's record
    parser wrapped, since no consumer API shows a batch's attributes."""
    import kafka.consumer.fetcher as fetcher

    codecs, parser = [], fetcher.MemoryRecords

    class Recording(parser):
        def next_batch(self, *args, **kwargs):
            batch = super().next_batch(*args, **kwargs)
            if batch is not None and not getattr(batch, "is_control_batch", False):
                codecs.append(batch.compression_type)
            return batch

    from kafka import KafkaConsumer, TopicPartition

    fetcher.MemoryRecords = Recording
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or {0})]
        c.assign(tps)
        seek_to_first(c, tps)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 1.5:
            if c.poll(timeout_ms=300):
                quiet_since = time.monotonic()
    finally:
        c.close()
        fetcher.MemoryRecords = parser
    return codecs


def setup_stream(tmp_path, bootstrap, name):
    from stream_anon.config import load_config
    from stream_anon.kafka.topics import ensure_topics

    path = write_stream_config(tmp_path / "cfg", name, f"raw.test.{name}")
    cfg = load_config(path)
    ensure_topics(bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records", "anon.releases",
                                    "anon.deadletter", "anon.metrics"],
                  default_partitions={cfg.stream.input_topic: 4, f"anon.{name}.records": 1})
    return path, cfg


def collect(bootstrap, name, events_expected_published=None, committed=True):
    """(manifests by release_id, copies per release_id, record tokens by release_id, dead letters by source);
    ``committed=False``: with the records of aborted transactions (:func:`read_all`).

    The three topics are read side by side (each read ends after a quiet period); the records are read again, to
    at least the count the manifests publish, when the first read came back short."""
    from concurrent.futures import ThreadPoolExecutor

    records_topic = f"anon.{name}.records"
    with ThreadPoolExecutor(max_workers=3) as pool:
        releases_read = pool.submit(read_all, bootstrap, "anon.releases", stream=name, committed=committed)
        records_read = pool.submit(read_all, bootstrap, records_topic, committed=committed)
        dead_read = pool.submit(read_all, bootstrap, "anon.deadletter", stream=name, committed=committed)
    manifests, copies = {}, Counter()
    for key, doc, _, _ in releases_read.result():
        assert key == doc["release_id"]
        copies[doc["release_id"]] += 1
        if doc["release_id"] in manifests:     # a re-produced release is identical (deterministic engine)
            a = {k: v for k, v in manifests[doc["release_id"]].items() if k != "created_at"}
            b = {k: v for k, v in doc.items() if k != "created_at"}
            assert a == b, f"release {doc['release_id']} re-produced with different content"
        manifests.setdefault(doc["release_id"], doc)
    need = sum(m["published"] * copies[r] for r, m in manifests.items())
    records = defaultdict(list)
    raw_records = records_read.result()
    if len(raw_records) < need:
        raw_records = read_all(bootstrap, records_topic, min_count=need, committed=committed)
    for key, doc, _, _ in raw_records:
        assert key == doc["release_id"]
        records[doc["release_id"]].append(doc)
    dead = {}
    for _, doc, _, _ in dead_read.result():
        s = doc["source"]
        dead.setdefault((s["topic"], s["partition"], s["offset"]), doc)
    return manifests, copies, records, dead


def account(events, secret, manifests, records, dead):
    """Every event is published, suppressed or dead-lettered exactly once (after dedupe by release_id).

    Returns (resolved tokens, tokens of events neither resolved nor dead-lettered)."""
    from stream_anon import crypto

    dead_tokens = {doc["audit_token"] for doc in dead.values() if "audit_token" in doc}
    expected = {crypto.audit_token(secret, e["event_id"]) for e in events} - dead_tokens
    published = Counter()
    for rid, recs in records.items():
        assert rid in manifests, f"records of release {rid} without a manifest"
        tokens = {r["audit_token"] for r in recs}          # dedupe re-produced copies of the release
        assert len(tokens) == manifests[rid]["published"]
        published.update(tokens)
    suppressed = Counter(t for m in manifests.values() for ts in m["suppressed_tokens"].values() for t in ts)
    assert all(v == 1 for v in published.values()), "a record published in two releases"
    assert all(v == 1 for v in suppressed.values()), "a record suppressed twice"
    assert not (set(published) & set(suppressed)), "a record both published and suppressed"
    resolved = set(published) | set(suppressed)
    assert resolved <= expected, "a published/suppressed token that is not an input event (or was dead-lettered)"
    return resolved, expected - resolved


def committed_offsets(bootstrap, group, topic):
    """The group's committed offsets of ``topic`` (by kafka-python, independently of the worker's client)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offs = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    return {tp.partition: om.offset for tp, om in offs.items() if tp.topic == topic and om.offset >= 0}


def state_offsets(bootstrap, app_id, stream) -> dict[int, int]:
    """Per partition, the last input offset covered by the committed state (-1: none), from the state topic."""
    from stream_anon.kafka.supervise import committed_states

    states = committed_states(bootstrap, app_id, stream, range(4), idle_s=0.3)
    return {p: states[p]["offset"] if p in states else -1 for p in range(4)}


def wait_for(pred, timeout_s, what, explain=None):
    """``pred()`` once it is true; on timeout an AssertionError naming ``what`` and, when given, ``explain()`` (what
    was last seen: the head of a CI report must say why, its middle may be cut)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"timeout waiting for {what}" + (f": {explain()}" if explain else ""))


def wait_while_running(pred, timeout_s: float, what: str, procs=()) -> float:
    """Seconds until ``pred()`` is true; a RuntimeError when one of the worker processes ``procs`` exits first, a
    TimeoutError naming ``what`` after ``timeout_s``."""
    t0 = time.monotonic()
    while not pred():
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a worker exited ({p.returncode}) while waiting for {what}")
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.2)
    return time.monotonic() - t0


def wait_accounted(bootstrap: str, stream: str, n_events: int, timeout_s: float, procs=()) -> dict:
    """The output accounting (:meth:`~stream_anon.kafka.supervise.OutputReader.accounting`) once ``n_events`` are
    accounted for and none is deferred, the workers ``procs`` running all along."""
    from stream_anon.kafka.supervise import OutputReader
    reader = OutputReader(bootstrap, stream)
    try:
        def accounted():
            reader.poll(300)
            acc = reader.accounting()
            return acc["accounted"] >= n_events and acc["deferred"] == 0
        wait_while_running(accounted, timeout_s, "every event accounted", procs)
        return reader.accounting()
    finally:
        reader.close()


def release_contents(bootstrap: str) -> dict[str, set[bytes]]:
    """Release id -> the distinct contents published under it on ``anon.releases`` (``created_at`` aside): a
    release re-produced after a failure must have one."""
    import orjson

    from stream_anon import contract
    from stream_anon.audit.kafka_source import read_topic
    contents: dict[str, set[bytes]] = {}
    for _, value in read_topic(bootstrap, contract.topics().releases, idle_s=1.0):
        doc = orjson.loads(value)
        doc.pop("created_at", None)
        contents.setdefault(doc["release_id"], set()).add(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
    return contents


def topics_apply(bootstrap: str, cfg_path, app_id: str) -> list[str]:
    """``stream-anon topics apply --config X --app-id ID``, as an operator runs it before workers that may not create
    topics: the names of the topics it plans (created at the broker's ``default.replication.factor``)."""
    from stream_anon.cli import main
    from stream_anon.config import load_config
    from stream_anon.kafka.topics import apply_plan, load_topic_definitions

    assert main(["topics", "apply", "--broker", bootstrap, "--config", str(cfg_path), "--app-id", app_id]) == 0
    return sorted(apply_plan(load_topic_definitions(), [load_config(cfg_path)], app_id))
