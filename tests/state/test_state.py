"""Bounded, incremental engine state: KeyedTable, the engine's state API (core + keyed tables + changes), duplicate
event ids (seen_events) and m-invariance signatures expiring through the table (issue 11 item 2, issue 10
duplicates). The worker's state records built from this API: tests/state/test_state_recovery.py."""
from __future__ import annotations

import copy
import json

import numpy as np
import orjson
import pytest

from stream_anon import crypto
from stream_anon.config import M_HORIZON_S, ConfigError, load_config, parse_config
from stream_anon.datasets import oyster_cards
from stream_anon.engine import Engine, demo_config
from stream_anon.engine.records import DUPLICATE_EVENT
from stream_anon import checkpoint
from stream_anon.keyed_table import BlobTable, KeyedTable
from stream_anon.worker import state as st
from _state_helpers import reopened

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SECRET = b"state-test-secret-0123456789abcdef"
CARDS = ROOT / "configs" / "oyster-cards.toml"


# ------------------------------------------------------------------------------------------------ KeyedTable
def _apply(base: dict, keys, rows, deleted) -> None:
    for k in deleted.tolist():
        base.pop(k, None)
    for k, r in zip(keys.tolist(), rows.tolist()):
        base[k] = r


def test_keyed_table_matches_a_dict_and_its_changes_rebuild_it():
    rng = np.random.default_rng(7)
    t = KeyedTable([("a", "<i4"), ("t", "<f8")])
    ref: dict[int, tuple] = {}
    mirror: dict[int, tuple] = {}         # what a consumer of changes() holds
    for step in range(60):
        op = rng.integers(3)
        keys = rng.integers(-20000, 20000, size=int(rng.integers(1, 3000)))
        if op == 1:
            keys = np.unique(keys)            # sorted, each key once: put() and the lookups skip their sort
        if op < 2:
            rows = np.zeros(len(keys), dtype=t.dtype)
            rows["a"] = rng.integers(0, 100, len(keys))
            rows["t"] = rng.random(len(keys))
            if step % 4 == 0:                     # records as a strided view: the table holds them as bytes
                spread = np.zeros(2 * len(keys), dtype=t.dtype)
                spread[::2] = rows
                t.put(keys, spread[::2])
            else:
                t.put(keys, rows)
            for k, r in zip(keys.tolist(), rows.tolist()):     # last occurrence wins
                ref[k] = r
        else:
            t.delete(keys)
            for k in keys.tolist():
                ref.pop(k, None)
        if step % 3 == 0:
            t.delete_where("t", 0.05)
            for k in [k for k, r in ref.items() if r[1] < 0.05]:
                del ref[k]
        if step % 5 == 0:
            keys_c, rows_c, deleted = t.changes()
            assert len(np.intersect1d(keys_c, deleted)) == 0 and rows_c.dtype == t.dtype
            _apply(mirror, keys_c, rows_c, deleted)
            assert mirror == ref
        assert len(t) == len(ref)
    probe = np.arange(-20000, 20000)
    found, rows = t.get(probe)
    assert {k: r for k, f, r in zip(probe.tolist(), found.tolist(), rows.tolist()) if f} == ref
    keys, rows = t.snapshot()
    assert (np.diff(keys) > 0).all() and dict(zip(keys.tolist(), rows.tolist())) == ref
    assert t.nbytes == len(ref) * (8 + t.dtype.itemsize) == len(ref) * 20      # 8-byte key + 12-byte record


def test_change_sets_asked_after_each_batch_and_joined_equal_the_set_asked_once():
    """checkpoint.changes_then: a state record covering several batches joins the change sets asked after each
    (the DP aggregates' prefetched ones), and must say what one call at the end would have said."""
    rng = np.random.default_rng(11)
    asked_often, asked_once = KeyedTable([("a", "<i4")]), KeyedTable([("a", "<i4")])
    blobs_often, blobs_once = BlobTable(), BlobTable()
    for t in (asked_often, asked_once, blobs_often, blobs_once):
        t.changes()                          # tracking on: the next calls give what changed
    for _ in range(30):
        joined = {"t": asked_often.changes(), "b": blobs_often.changes()}
        for _ in range(int(rng.integers(1, 5))):
            keys = np.unique(rng.integers(0, 300, size=int(rng.integers(1, 60))))
            if rng.random() < 0.6:
                rows = np.zeros(len(keys), dtype=asked_often.dtype)
                rows["a"] = rng.integers(0, 1000, len(keys))
                values = [str(v).encode() for v in rows["a"].tolist()]
                for t, b in ((asked_often, blobs_often), (asked_once, blobs_once)):
                    t.put(keys, rows)
                    b.put(keys, values)
            else:
                for t in (asked_often, asked_once, blobs_often, blobs_once):
                    t.delete(keys)
            joined = checkpoint.changes_then(joined, {"t": asked_often.changes(), "b": blobs_often.changes()})
        once = {"t": asked_once.changes(), "b": blobs_once.changes()}
        for name in ("t", "b"):
            (k1, r1, d1), (k2, r2, d2) = joined[name], once[name]
            assert k1.tolist() == k2.tolist() and d1.tolist() == d2.tolist()
            assert (r1 == r2 if isinstance(r1, list) else r1.tolist() == r2.tolist())


def test_keyed_table_first_changes_are_everything_then_only_what_changed():
    t = KeyedTable([("time", "<f8")])
    t.put(np.arange(10), np.zeros(10, dtype=t.dtype))
    keys, _, deleted = t.changes()
    assert keys.tolist() == list(range(10)) and len(deleted) == 0
    assert all(len(x) == 0 for x in t.changes())
    t.delete(np.array([3, 99]))
    t.put(np.array([4]), np.ones(1, dtype=t.dtype))
    keys, rows, deleted = t.changes()
    assert keys.tolist() == [4] and rows["time"].tolist() == [1.0] and deleted.tolist() == [3]
    t.load(*t.snapshot())                     # after a load the next changes are everything again
    assert len(t.changes()[0]) == 9
    with pytest.raises(ValueError, match="duplicate keys"):
        t.load(np.array([1, 1]), np.zeros(2, dtype=t.dtype))


# ------------------------------------------------------------------------------------------------ engine API
def cards_events(n=None):
    ev = oyster_cards.read_events()
    return ev if n is None else ev[:n]


def run(engine, events, batch=1000):
    out = []
    for i in range(0, len(events), batch):
        r = engine.process(events[i:i + batch])
        out.append((r.releases, [(x.event.get("event_id"), x.reason) for x in r.rejected]))
    return out


def fingerprint(results) -> list:
    docs = []
    for releases, rejected in results:
        for r in releases:
            m = r.manifest()
            m.pop("created_at")
            docs.append((m, r.records))
        docs.append(rejected)
    return json.loads(orjson.dumps(docs, option=orjson.OPT_SERIALIZE_NUMPY))


def test_state_changes_rebuild_state_tables_and_restore_continues_identically():
    cfg = load_config(CARDS)
    events = cards_events(8000)
    ref = Engine(cfg, secret=SECRET)
    ref_out = run(ref, events)
    a = Engine(cfg, secret=SECRET)
    mirror: dict[str, dict] = {}
    out = []
    for i in range(0, 5000, 1000):
        out += run(a, events[i:i + 1000])
        for name, (keys, rows, deleted) in checkpoint.changes(a).items():
            table = mirror.setdefault(name, {})
            for k in deleted.tolist():
                table.pop(k, None)     # put and deleted between two change sets: reported deleted
            table.update(zip(keys.tolist(), rows if isinstance(rows, list) else rows.tolist()))
    core, tables = checkpoint.full_state(a)
    assert set(tables) == {"former/signatures", "seen_events", "buffer", "windows", "published"}
    assert len(tables["former/signatures"][0]) > 100
    for name, (keys, rows) in tables.items():
        assert mirror[name] == dict(zip(keys.tolist(), rows if isinstance(rows, list) else rows.tolist()))
    core = json.loads(json.dumps(core))          # the core is JSON
    assert "units" not in core["former"] and "buffer" not in core
    c = reopened(a)          # through an encoded state record: the same
    b = Engine.restore(cfg, 0, SECRET, core, tables)
    assert b.former.units == a.former.units and b.seen_events == a.seen_events
    after = run(b, events[5000:])
    assert fingerprint(out + after) == fingerprint(ref_out)
    assert c.former.units == a.former.units and c.seen_events == a.seen_events
    assert fingerprint(run(c, events[5000:])) == fingerprint(after)
    with pytest.raises(ValueError, match="partition"):
        Engine.restore(cfg, 1, SECRET, core, tables)


def test_kanon_engine_has_no_former_table():
    e = Engine(demo_config(k=2), secret=SECRET)
    e.process([{"event_id": "a", "event_type": "reading", "unit": "u", "time": 1.0, "value": 1.0}])
    assert set(e.state_tables()) == {"seen_events", "buffer", "windows", "published"}
    assert set(checkpoint.changes(e)) == {"seen_events", "buffer", "windows", "published"}


# ------------------------------------------------------------------------------------------------ m_horizon_s
def synth_cfg(**anon):
    raw = copy.deepcopy(demo_config(k=3).raw)
    raw["stream"]["event_types"] = ["reading"]
    raw["anonymization"].update(anon)
    raw["sensitive"] = {"fields": ["segment"], "invariant": "segment"}
    return parse_config(raw)


def test_m_horizon_has_a_bounded_default_and_expired_signatures_are_deletions():
    assert load_config(CARDS).anonymization.m_horizon_s == M_HORIZON_S == 7 * 86400
    assert load_config(ROOT / "configs" / "oyster.toml").anonymization.m_horizon_s is None   # no m: unused
    cfg = synth_cfg(m=2, m_horizon_s=600)
    e = Engine(cfg, secret=SECRET)
    people = [{"event_id": f"e{i}", "event_type": "reading", "unit": f"u{i}", "time": float(i), "value": 50.0,
               "segment": "abc"[i % 3]} for i in range(9)]
    e.process(people + [{"event_id": "x", "event_type": "reading", "unit": "x", "time": 100.0, "value": 1.0,
                         "segment": "a"}])
    assert len(e.former.units) == 9
    checkpoint.changes(e)
    e.process([{"event_id": "y", "event_type": "reading", "unit": "y", "time": 2000.0, "value": 1.0,
                "segment": "b"}])
    deleted = checkpoint.changes(e)["former/signatures"][2]
    assert len(deleted) == 9 and len(e.former.units) <= 1
    assert set(deleted.tolist()) == set(e.reader.unit_ids([f"u{i}" for i in range(9)]).tolist())


# ------------------------------------------------------------------------------------------------ duplicates
def dcfg(horizon=None, k=2):
    raw = copy.deepcopy(demo_config(k=k).raw)
    if horizon is not None:
        raw["limits"] = {"duplicate_horizon_s": horizon}
    return parse_config(raw)


def ev(eid, t, unit="u"):
    return {"event_id": eid, "event_type": "reading", "unit": unit, "time": float(t), "value": 10.0}


def dups(result):
    return [r.event["event_id"] for r in result.rejected if r.reason == DUPLICATE_EVENT]


def test_duplicate_within_a_batch_and_across_batches():
    e = Engine(dcfg(), secret=SECRET)
    r = e.process([ev("a", 1), ev("b", 2), ev("a", 3), ev("c", 4), ev("a", 5)])
    assert dups(r) == ["a", "a"]
    assert [x.event["time"] for x in r.rejected] == [3.0, 5.0]       # the first occurrence is kept
    assert dups(e.process([ev("b", 6), ev("d", 7)])) == ["b"]
    # the duplicate goes to the dead letters like every rejection: the reader reports it with its position
    records, rejected = e.reader.read([ev("d", 8), ev("e", 9)])
    assert rejected == [(0, DUPLICATE_EVENT)] and len(records) == 1
    # an event rejected for another reason is not "seen": its id can arrive again, valid
    bad = ev("f", 10)
    bad["time"] = "yesterday"
    assert e.process([bad]).rejected[0].reason != DUPLICATE_EVENT
    assert dups(e.process([ev("f", 11)])) == []


def test_duplicate_after_the_horizon_is_accepted_again():
    e = Engine(dcfg(horizon=100, k=2), secret=SECRET)
    assert dups(e.process([ev("a", 0), ev("b", 50, "v")])) == []
    assert dups(e.process([ev("a", 100, "w")])) == ["a"]        # 0 >= watermark 50 - 100: still a duplicate
    r = e.process([ev("z", 250, "x"), ev("a", 260, "y")])       # watermark 250: 0 < 250 - 100, forgotten
    assert dups(r) == []
    assert dups(e.process([ev("a", 270, "y")])) == ["a"]        # ... and remembered again from 260
    assert e.seen_events.contains(e.reader.event_keys([crypto.audit_token(SECRET, "z")])).all()


def test_duplicate_detection_does_not_depend_on_batches():
    rng = np.random.default_rng(3)
    events = [ev(f"e{int(rng.integers(400))}", 7 * i, f"u{i % 23}") for i in range(1500)]
    cfg = dcfg(horizon=3000, k=3)
    outs = []
    for batch in (1, 37, 500, 1500):
        e = Engine(cfg, secret=SECRET)
        rej, tokens = [], []
        for i in range(0, len(events), batch):
            r = e.process(events[i:i + batch])
            rej += [(x.event["event_id"], x.event["time"]) for x in r.rejected]
            tokens += [t for rel in r.releases for t in rel.record_token]
        outs.append((rej, tokens))
    assert len(outs[0][0]) > 100 and all(o == outs[0] for o in outs[1:])


def test_duplicate_across_a_checkpoint_restore(tmp_path):
    cfg = dcfg()
    e = Engine(cfg, secret=SECRET)
    e.process([ev("a", 1), ev("b", 2)])
    assert dups(reopened(e).process([ev("a", 3)])) == ["a"]
    # through the worker's state records: a full record, then a delta holding "c"
    full = st.StateRecord({"seq": 1, "offset": 10, "engine": e.state_core()}, checkpoint.changes(e), full=True)
    st.encode_state(full)
    e.process([ev("c", 4)])
    delta = st.StateRecord({"seq": 2, "offset": 11, "engine": e.state_core()}, checkpoint.changes(e), full=False)
    assert len(delta.tables["seen_events"][0]) == 1
    rec = st.choose_state([st.encode_state(full), st.encode_state(delta)], marker=2, committed_input=12)
    r = Engine.restore(cfg, 0, SECRET, rec.doc["engine"], rec.tables)
    assert dups(r.process([ev("c", 5), ev("a", 6), ev("d", 7)])) == ["c", "a"]


def test_duplicate_horizon_config():
    assert dcfg().limits.duplicate_horizon_s == 86400.0
    e = Engine(dcfg(horizon=0), secret=SECRET)          # 0: detection off
    assert dups(e.process([ev("a", 1), ev("a", 2)])) == [] and len(e.seen_events) == 0
    for bad in (-1, True, "1h", float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="duplicate_horizon_s"):
            dcfg(horizon=bad)
