"""How a partition resumes from its state topic (stream_anon.worker.state), case by case, without a broker: the
committed marker picks the chain of state records (a full record and the deltas after it), records of aborted
attempts are ignored, deltas applied in order give the committed tables, and everything unexpected halts the
partition with a reason instead of guessing."""
from __future__ import annotations

import json

import numpy as np
import pytest

from stream_anon import checkpoint
from stream_anon.keyed_table import KeyedTable
from stream_anon.worker import state as st

DT = np.dtype([("time", "<f8"), ("n", "<u2")])
NO_KEYS = checkpoint.EMPTY_KEYS


def doc(seq: int, offset: int, topic_id: str | None = "T1", tag: str = "") -> dict:
    return {"seq": seq, "offset": offset, "input_topic_id": topic_id, "tag": tag}


def rows(*vals) -> np.ndarray:
    return np.array([(float(v), v) for v in vals], dtype=DT)


def enc(*docs, full=True) -> list[bytes]:
    return [st.encode_state(st.StateRecord(d, {}, full)) for d in docs]


def test_the_record_with_the_committed_sequence_number_wins_over_aborted_attempts():
    # seq 3 was attempted twice (the first attempt aborted, visible on a broker that shows aborted records),
    # seq 4 aborted: the marker says 3 was the last commit
    states = enc(doc(1, 99), doc(2, 199), doc(3, 299, tag="aborted"), doc(3, 299, tag="committed"),
                 doc(4, 399, tag="aborted"))
    rec = st.choose_state(states, marker=3, committed_input=300)
    assert rec.halt is None and rec.doc["seq"] == 3 and rec.doc["tag"] == "committed"


def test_a_chain_of_deltas_gives_the_committed_tables_and_ignores_aborted_attempts():
    full = st.StateRecord(doc(1, 9), {"t": (np.array([1, 2, 3]), rows(1, 2, 3), NO_KEYS)})
    d2 = st.StateRecord(doc(2, 19), {"t": (np.array([4]), rows(4), np.array([1]))}, full=False)
    aborted3 = st.StateRecord(doc(3, 29, tag="aborted"), {"t": (np.array([9]), rows(9), np.array([2]))}, full=False)
    d3 = st.StateRecord(doc(3, 29), {"t": (np.array([2, 5]), rows(20, 5), NO_KEYS),
                                     "u": (np.array([7]), rows(7), NO_KEYS)}, full=False)
    aborted4 = st.StateRecord(doc(4, 39), {"t": (NO_KEYS, rows(), np.array([3, 4, 5]))}, full=False)
    values = [st.encode_state(r) for r in (full, d2, aborted3, d3, aborted4)]
    rec = st.choose_state(values, marker=3, committed_input=30)
    assert rec.halt is None and rec.base_seq == 1 and rec.doc["seq"] == 3
    keys, got = rec.tables["t"]
    assert keys.tolist() == [2, 3, 4, 5] and got["n"].tolist() == [20, 3, 4, 5]
    assert rec.tables["u"][0].tolist() == [7]
    # the same chain replayed on a KeyedTable, the engine's own structure, agrees
    t = KeyedTable(DT)
    t.put(np.array([1, 2, 3]), rows(1, 2, 3))
    t.delete(np.array([1])); t.put(np.array([4]), rows(4))
    t.put(np.array([2, 5]), rows(20, 5))
    k2, r2 = t.snapshot()
    assert k2.tolist() == keys.tolist() and r2.tolist() == got.tolist()


def test_a_full_record_followed_by_a_later_one_lets_the_log_forget_what_came_before():
    log = st.StateLog()
    for v in enc(doc(1, 9), doc(2, 19), full=True) + enc(doc(3, 29), full=False) + enc(doc(4, 39), full=True) \
            + enc(doc(5, 49), full=False):
        log.add(v)
    assert sorted(log.values) == [4, 5]
    assert st.choose_state(log, marker=5, committed_input=50).doc["seq"] == 5


def test_a_broken_chain_halts():
    values = enc(doc(1, 9)) + enc(doc(3, 29), full=False)           # delta 3 without delta 2
    rec = st.choose_state(values, marker=3, committed_input=30)
    assert rec.halt == st.HALT_MARKER_WITHOUT_STATE and "broken" in rec.detail


def test_a_new_partition_starts_empty():
    rec = st.choose_state([], marker=None, committed_input=None)
    assert rec.halt is None and rec.doc is None


def test_aborted_first_attempts_are_no_history():
    """A worker killed inside a partition's first transaction leaves sequence-1 records (visible on a broker that
    shows aborted records) and no marker: a committed first transaction would have committed marker 1 with it."""
    rec = st.choose_state(enc(doc(1, 99, tag="a"), doc(1, 149, tag="b")), marker=None, committed_input=None)
    assert rec.halt is None and rec.doc is None


@pytest.mark.parametrize("states, marker, committed, cached, topic_id, reason", [
    ([], 5, 600, None, "T1", st.HALT_MARKER_WITHOUT_STATE),          # committed state lost
    ([], None, 600, None, "T1", st.HALT_OFFSETS_WITHOUT_STATE),      # offsets without any state
    (enc(doc(1, 99), doc(2, 199)), None, None, None, "T1", st.HALT_STATE_WITHOUT_MARKER),   # offsets lost
    ([], None, None, {"seq": 7, "offset": 700, "input_topic_id": "T1"}, "T1", st.HALT_STATE_RESET),  # broker reset
    (enc(doc(2, 199)), 2, 200, {"seq": 9, "offset": 900, "input_topic_id": "T1"}, "T1", st.HALT_STATE_RESET),
    (enc(doc(2, 199)), 2, 150, None, "T1", st.HALT_OFFSET_MISMATCH),
    (enc(doc(2, 199)), 2, 200, None, "T2", st.HALT_TOPIC_RECREATED),  # the input topic was re-created
])
def test_unexpected_state_halts_the_partition(states, marker, committed, cached, topic_id, reason):
    rec = st.choose_state(states, marker, committed, cached, topic_id)
    assert rec.doc is None and rec.halt == reason and rec.detail


def test_the_operator_accepts_a_recreated_topic_and_the_state_carries_on_from_offset_0():
    rec = st.choose_state(enc(doc(2, 199, "T1")), 2, None, None, "T2", accept_input_reset=True)
    assert rec.halt is None and rec.adopted_reset
    assert rec.doc["offset"] == -1 and rec.doc["input_topic_id"] == "T2" and rec.doc["seq"] == 2


def test_state_records_round_trip_and_barriers_are_told_apart():
    tables = {"t": (np.array([5, 8]), rows(5, 8), np.array([3]))}
    value = st.encode_state(st.StateRecord(doc(12, 3456), tables, full=False))
    assert st.header(value)[:3] == (checkpoint.KIND_DELTA, 12, 3456)
    back = st.decode_state(value)
    assert back.doc["offset"] == 3456 and not back.full
    k, r, d = back.tables["t"]
    assert k.tolist() == [5, 8] and r.tolist() == rows(5, 8).tolist() and d.tolist() == [3]
    barrier = st.encode_barrier(b"nonce-1")
    assert st.header(barrier)[0] == st.KIND_BARRIER and st.barrier_nonce(barrier) == b"nonce-1"
    assert st.header(b"something else") is None and st.barrier_nonce(value) is None and st.header(None) is None


def test_the_json_part_is_an_lz4_frame_and_blob_tables_round_trip():
    tables = {"t": (np.array([5, 8]), rows(5, 8), np.array([3])),
              "b": (np.array([1, 4]), [b'{"x":1}', b""], np.array([2]))}
    rec = st.StateRecord(doc(12, 3456), tables, full=True)
    value = st.encode_state(rec)
    body_at = 4 + checkpoint.HEAD.size + 4
    assert value[body_at:body_at + 4] == checkpoint.LZ4_FRAME_MAGIC
    back = st.decode_state(value)
    assert back.doc == rec.doc and back.full
    assert back.tables["b"][0].tolist() == [1, 4] and back.tables["b"][1] == [b'{"x":1}', b""]
    assert back.tables["b"][2].tolist() == [2]
    # a record of the earlier format (a zlib JSON part) is refused with the reason, never half-read
    import zlib
    import lz4.frame
    (n,) = checkpoint._BODY.unpack_from(value, 4 + checkpoint.HEAD.size)
    old_body = zlib.compress(lz4.frame.decompress(value[body_at:body_at + n]), 1)
    old = value[:4 + checkpoint.HEAD.size] + checkpoint._BODY.pack(len(old_body)) + old_body + value[body_at + n:]
    with pytest.raises(ValueError, match="earlier format"):
        st.decode_state(old)


# ---- the worker's records, end to end in process (no broker): what recovery reads is what the worker had
def _cards_messages(n: int) -> list[tuple[int, int, bytes]]:
    import zlib

    import orjson

    from stream_anon.datasets import load_events

    out, offsets = [], {}
    for e in load_events("oyster-cards", limit=n):
        p = zlib.crc32(str(e["card_id"]).encode()) % 2
        offsets[p] = offsets.get(p, -1) + 1
        out.append((p, offsets[p], orjson.dumps(e)))
    return out


def test_state_records_replayed_from_the_log_restore_the_worker_exactly():
    """oyster-cards with m = 3 (signature tables) and DP, 150-event batches: after every transaction, the chain
    read back from the encoded records equals the live engine's core and tables; a worker restored from the log
    half-way produces exactly the output of the one that never stopped; deltas carry a fraction of the rows."""
    from stream_anon import contract
    from stream_anon.config import load_config
    from stream_anon.worker.core import WorkerCore

    cfg = load_config(contract.config_path("oyster-cards"))
    secret = b"state-records-secret-0123456789abcdef"
    msgs = _cards_messages(6000)
    core = WorkerCore(cfg, "app", secret)
    logs = {0: st.StateLog(), 1: st.StateLog()}
    sizes = {True: [], False: []}
    half = len(msgs) // 2
    out_live, restored = [], None
    for i in range(0, len(msgs), 150):
        batch = msgs[i:i + 150]
        by_part = {}
        for p, off, raw in batch:
            by_part.setdefault(p, []).append((off, raw))
        for p, part in by_part.items():
            ps = core.parts.get(p) or core.open_partition(p)
            out = core.process(ps, part)
            out_live += out.messages if i >= half else []
            rec = core.committed(ps, out.last_offset)
            value = st.encode_state(rec)
            sizes[rec.full].append(rec.rows / max(1, checkpoint.table_rows(ps.engine)))
            logs[p].add(value)
            got = st.choose_state(logs[p], marker=ps.seq, committed_input=ps.offset + 1)
            assert got.halt is None and got.doc["offset"] == ps.offset
            live = ps.full_tables()            # the engine's tables (engine/...) and the DP aggregates' (dp/...)
            assert sorted(got.tables) == sorted(live)
            for name, (k, r) in live.items():
                assert np.array_equal(got.tables[name][0], k), name
                assert got.tables[name][1] == r if isinstance(r, list) else np.array_equal(got.tables[name][1], r)
            assert got.doc["engine"] == orjson_roundtrip(ps.engine.state_core())
            assert got.doc["dp"] == orjson_roundtrip(ps.dp.state_core())
        if i + 150 == half:
            restored = WorkerCore(cfg, "app", secret)
            for p, log in logs.items():
                r = st.choose_state(log, marker=core.parts[p].seq, committed_input=None)
                restored.open_partition(p, r.doc, r.tables, r.base_seq)
    assert restored is not None and sizes[False], "the run must restore half-way and write deltas"
    assert any(n.startswith("dp/") for n in live) and "engine/former/signatures" in live
    out_restored = []
    for i in range(half, len(msgs), 150):
        by_part = {}
        for p, off, raw in msgs[i:i + 150]:
            by_part.setdefault(p, []).append((off, raw))
        for p, part in by_part.items():
            out = restored.process(restored.parts[p], part)
            out_restored += out.messages
            restored.committed(restored.parts[p], out.last_offset)
    assert stable(out_restored) == stable(out_live)
    # a delta carries a small share of the tables' rows (a full record carries all of them)
    assert np.mean(sizes[False]) < 0.25 and min(sizes[True]) >= 0.99


def test_the_committed_state_held_in_memory_is_what_was_written_whatever_comes_after():
    """The worker keeps its last committed records in memory: a failing batch goes back to them
    (``WorkerCore._isolate``). After the next batch changed the live engine and aggregates (buffer, open windows,
    published registry, counterfeit pool, metrics: lists and dicts that grow in place), what it would go back to
    must still be what was written to the state topic."""
    from stream_anon import contract
    from stream_anon.config import load_config
    from stream_anon.worker.core import WorkerCore

    cfg = load_config(contract.config_path("oyster-cards"))
    core = WorkerCore(cfg, "app", b"state-records-secret-0123456789abcdef")
    msgs = _cards_messages(3000)
    written: dict[int, bytes] = {}
    checked = 0
    for i in range(0, len(msgs), 150):
        by_part = {}
        for p, off, raw in msgs[i:i + 150]:
            by_part.setdefault(p, []).append((off, raw))
        for p, part in by_part.items():
            ps = core.parts.get(p) or core.open_partition(p)
            out = core.process(ps, part)
            if p in written:              # the batch is processed, not committed: go-back state = last written
                doc, tables = ps.committed_state()
                back_doc, back_tables = st.resolve_chain([st.decode_state(v) for v in written[p]])
                assert orjson_roundtrip(doc) == orjson_roundtrip(back_doc), (i, p)
                assert tables.keys() == back_tables.keys() and all(
                    np.array_equal(tables[n][0], back_tables[n][0]) for n in tables), (i, p)
                assert tables["engine/windows"][1] == back_tables["engine/windows"][1], (i, p)
                checked += len(tables["engine/windows"][0]) > 0
            rec = core.committed(ps, out.last_offset)
            written[p] = [st.encode_state(rec)] if rec.full else written[p] + [st.encode_state(rec)]
    assert checked > 10


def orjson_roundtrip(obj):
    import orjson

    return orjson.loads(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))


def stable(messages) -> list:
    """Output messages without the metrics topic and the wall-clock fields (``created_at``)."""
    import orjson

    out = []
    for topic, key, value in messages:
        if topic != "anon.metrics":
            doc = orjson.loads(value)
            doc.pop("created_at", None)
            out.append((topic, key, doc))
    return out


def test_a_state_written_under_another_key_halts_with_both_key_ids():
    """A worker started with another secret must not resume a state made under the first: its keyed unit ids,
    event keys and audit tokens would not match. The partition halts with one line naming both key ids."""
    from stream_anon import contract
    from stream_anon.config import load_config
    from stream_anon.worker.core import WorkerCore

    cfg = load_config(contract.config_path("oyster-cards"))
    first = WorkerCore(cfg, "app", b"first-secret-0123456789abcdef0123")
    ps = first.open_partition(0)
    first.process(ps, [(i, m) for i, (_, _, m) in enumerate(_cards_messages(300))])
    value = st.encode_state(first.committed(ps, ps.offset))
    second = WorkerCore(cfg, "app", b"other-secret-0123456789abcdef0123")
    rec = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=second.kid)
    assert rec.halt == st.HALT_KEY_CHANGED and rec.doc is None
    assert rec.detail.startswith(f"the state was written with key id {first.kid}, this worker's secret is key id "
                                 f"{second.kid}; to rotate the key, restart with --rotate-key")
    same = st.choose_state([value], marker=ps.seq, committed_input=ps.offset + 1, kid=first.kid)
    assert same.halt is None and same.doc["kid"] == first.kid


def test_the_audit_with_another_secret_says_so_in_one_line_before_any_check():
    """Audited with a secret other than the worker's, every token would look fabricated: the audit says which key
    ids differ, in one line, instead of thousands of unknown records."""
    from stream_anon import contract
    from stream_anon.audit import AuditConfig, audit
    from stream_anon.config import load_config
    from stream_anon.worker.core import WorkerCore
    from stream_anon.render import TOPICS

    path = contract.config_path("oyster-cards")
    core = WorkerCore(load_config(path), "app", b"worker-secret-0123456789abcdef0123")
    msgs = _cards_messages(2000)
    out = core.handle(msgs) + core.flush_all()
    outputs = {"records": [], "manifests": [json.loads(v) for t, _, v in out if t == TOPICS.releases],
               "deadletters": []}
    raw = [(("raw", p, off), v) for p, off, v in msgs]
    other = b"auditor-secret-0123456789abcdef0123"
    report = audit(raw, outputs, other, AuditConfig.from_toml(path))
    from stream_anon.crypto import key_id
    assert report.verdict == "FAILED" and list(report.checks) == ["key"]
    assert report.verdict_reason == (f"the releases carry key id {core.kid}, this secret is key id "
                                     f"{key_id(other)}")
    assert report.format_text().splitlines()[0] == f"AUDIT FAILED: {report.verdict_reason}"
