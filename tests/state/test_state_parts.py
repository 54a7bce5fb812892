"""State records over ``PART_MAX_BYTES`` are written in parts and reassembled on recovery (stream_anon.checkpoint,
stream_anon.worker.state), case by case without a broker: no value over the limit, the parts of the committed
attempt win over an aborted attempt's, and a chain whose record lacks a part, or whose parts do not make the record
they name, halts the partition. ``tests/state/test_state_size_kafka.py`` does it on the broker with 300,000 cards."""
from __future__ import annotations

import numpy as np
import pytest

from stream_anon import checkpoint
from stream_anon.worker import state as st

DT = np.dtype([("time", "<f8"), ("n", "<u8")])
NO_KEYS = checkpoint.EMPTY_KEYS
LIMIT = 4096                                # a small part limit: records of a few KB are written in parts


def doc(seq: int, offset: int, tag: str = "") -> dict:
    return {"seq": seq, "offset": offset, "input_topic_id": "T1", "tag": tag}


def big_record(seq: int, n: int = 2000, seed: int = 0, full: bool = True, tag: str = "") -> st.StateRecord:
    """A record of ``n`` random rows (random bytes do not compress: its size is its rows)."""
    rng = np.random.default_rng(seed)
    keys = np.sort(rng.choice(10 ** 9, n, replace=False)).astype(np.int64)
    rows = np.zeros(n, dtype=DT)
    rows["time"], rows["n"] = rng.random(n), rng.integers(0, 2 ** 62, n)
    return st.StateRecord(doc(seq, 10 * seq, tag), {"t": (keys, rows, NO_KEYS)}, full=full)


def values_of(*records, limit: int = LIMIT) -> list[bytes]:
    return [v for r in records for v in st.split_value(st.encode_state(r), limit)]


def test_a_record_over_the_limit_is_written_in_parts_none_over_it_and_they_make_the_record_again():
    rec = big_record(3)
    whole = st.encode_state(rec)
    parts = st.split_value(whole, LIMIT)
    assert len(whole) > 5 * LIMIT and len(parts) == checkpoint.part_count(len(whole), LIMIT) > 5
    assert max(len(p) for p in parts) <= LIMIT
    assert all(st.header(p) == (st.KIND_PART, 3, 30) for p in parts)       # each part names its transaction
    read = [st.read_part(p) for p in parts]
    assert st.join_parts(read[::-1]) == whole                              # in any order
    small = st.encode_state(st.StateRecord(doc(4, 40), {}))
    assert st.split_value(small, LIMIT) == [small]                         # a record within the limit: itself
    # the default limit: 900,000 bytes a value
    assert checkpoint.PART_MAX_BYTES == 900_000
    assert max(len(p) for p in st.split_value(st.encode_state(big_record(1, 200_000)))) <= 900_000


def test_a_chain_of_records_in_parts_is_recovered_with_their_part_counts():
    full, delta = big_record(1), big_record(2, n=600, seed=1, full=False)
    rec = st.choose_state(values_of(full, delta), marker=2, committed_input=21)
    assert rec.halt is None and rec.base_seq == 1 and rec.doc["seq"] == 2
    expect_doc, expect = st.resolve_chain([full.as_written(), delta.as_written()])
    assert rec.doc == expect_doc
    assert np.array_equal(rec.tables["t"][0], expect["t"][0]) and np.array_equal(rec.tables["t"][1], expect["t"][1])
    n1 = len(st.split_value(st.encode_state(full), LIMIT))
    n2 = len(st.split_value(st.encode_state(delta), LIMIT))
    assert rec.record_parts == {1: n1, 2: n2} and n1 > 1 and n2 > 1
    # their keys: part 0 under the key a whole record has, so tombstones reach every part
    keys = st.record_keys("s", 0, 1, n1)
    assert keys[0] == st.state_key("s", 0, 1) == b"s/p0/s1" and keys[1] == b"s/p0/s1/1" and len(set(keys)) == n1


def test_the_committed_attempt_wins_over_an_aborted_attempt_of_the_same_transaction():
    # a broker that shows aborted records (Tansu) gives the parts of an attempt that aborted (here with more parts
    # than the committed one, and one cut short) before the committed attempt of the same sequence number
    full = big_record(1)
    aborted = values_of(big_record(2, n=900, seed=7, full=False, tag="aborted"))
    cut_short = values_of(big_record(2, n=500, seed=8, full=False, tag="aborted"))[:2]
    committed = big_record(2, n=300, seed=9, full=False, tag="committed")
    rec = st.choose_state(values_of(full) + aborted + cut_short + values_of(committed), marker=2, committed_input=21)
    assert rec.halt is None and rec.doc["tag"] == "committed"
    assert rec.record_parts[2] == len(values_of(committed))
    # and a whole committed record after an aborted attempt in parts
    small = st.StateRecord(doc(2, 20, "whole"), {}, full=False)
    rec = st.choose_state(values_of(full) + aborted + [st.encode_state(small)], marker=2, committed_input=21)
    assert rec.halt is None and rec.doc["tag"] == "whole" and 2 not in rec.record_parts


@pytest.mark.parametrize("damage", ["missing_first", "missing_middle", "missing_last", "tampered", "malformed"])
def test_a_record_of_the_chain_that_is_not_whole_halts_the_partition(damage):
    full, delta = values_of(big_record(1)), values_of(big_record(2, n=600, seed=1, full=False))
    if damage == "missing_first":
        full = full[1:]
    elif damage == "missing_middle":
        full = full[:2] + full[3:]
    elif damage == "missing_last":
        delta = delta[:-1]
    elif damage == "tampered":           # a byte of one part changed: the parts do not make the record they name
        v = bytearray(full[2])
        v[-1] ^= 1
        full[2] = bytes(v)
    else:                                # a part whose own header is broken (index beyond the count)
        v = bytearray(full[1])
        v[4 + checkpoint.HEAD.size + 1:4 + checkpoint.HEAD.size + 3] = (999).to_bytes(2, "big")
        full[1] = bytes(v)
    rec = st.choose_state(full + delta, marker=2, committed_input=21)
    assert rec.doc is None and rec.halt == st.HALT_MARKER_WITHOUT_STATE
    assert "is incomplete" in rec.detail, rec.detail


def test_the_log_forgets_records_in_parts_before_a_later_full_record_as_it_does_whole_ones():
    log = st.StateLog()
    for v in values_of(big_record(1), big_record(2, n=300, seed=2, full=False), big_record(3, seed=3),
                       big_record(4, n=300, seed=4, full=False)):
        log.add(v)
    assert sorted(log.values) == [3, 4]
    assert st.choose_state(log, marker=4, committed_input=41).doc["seq"] == 4


def test_an_existing_state_topic_with_a_lower_message_limit_is_refused_with_the_setting_to_change():
    assert st.STATE_TOPIC_CONFIG["max.message.bytes"] == str(st.MESSAGE_MAX_BYTES)
    # a part, its key, the batch framing and lz4's worst case fit the limit the worker sets
    assert st.message_bytes_needed(checkpoint.PART_MAX_BYTES) <= st.MESSAGE_MAX_BYTES
    assert st.topic_limit_problem({"max.message.bytes": "1048588", "cleanup.policy": "compact"}) is None
    assert st.topic_limit_problem({}) is None                                # not described: taken at its word
    why = st.topic_limit_problem({"max.message.bytes": "500000"})
    assert "500000" in why and f"max.message.bytes={st.MESSAGE_MAX_BYTES}" in why and "--state-part-bytes" in why
    # a worker given smaller parts needs less
    assert st.topic_limit_problem({"max.message.bytes": "500000"}, part_bytes=400_000) is None
    assert "not a number" in st.topic_limit_problem({"max.message.bytes": "lots"})


def test_the_worker_producer_limit_matches_the_state_topic(monkeypatch):
    from stream_anon.kafka import transactions

    seen = {}
    monkeypatch.setattr(transactions, "Producer", lambda cfg: seen.update(cfg))
    transactions.transactional_producer({"bootstrap.servers": "localhost:9"}, "app", 0, "lz4")
    assert str(seen["message.max.bytes"]) == st.STATE_TOPIC_CONFIG["max.message.bytes"]
