"""How a partition resumes from its state topic (stream_anon.kafka.state.choose_state), case by case, without a
broker: the committed marker picks the state record, records of aborted attempts are ignored, and everything
unexpected halts the partition with a reason instead of guessing."""
from __future__ import annotations

import pytest

from stream_anon.kafka import state as st


def doc(seq: int, offset: int, topic_id: str | None = "T1", tag: str = "") -> dict:
    return {"seq": seq, "offset": offset, "input_topic_id": topic_id, "tag": tag}


def enc(*docs) -> list[bytes]:
    return [st.encode_state(d) for d in docs]


def test_the_record_with_the_committed_sequence_number_wins_over_aborted_attempts():
    # seq 3 was attempted twice (the first attempt aborted, visible on a broker that shows aborted records),
    # seq 4 aborted: the marker says 3 was the last commit
    states = enc(doc(1, 99), doc(2, 199), doc(3, 299, tag="aborted"), doc(3, 299, tag="committed"),
                 doc(4, 399, tag="aborted"))
    rec = st.choose_state(states, marker=3, committed_input=300)
    assert rec.halt is None and rec.doc["seq"] == 3 and rec.doc["tag"] == "committed"


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
    value = st.encode_state(doc(12, 3456))
    assert st.header(value)[:3] == (st.KIND_STATE, 12, 3456) and st.decode_state(value)["offset"] == 3456
    barrier = st.encode_barrier(b"nonce-1")
    assert st.header(barrier)[0] == st.KIND_BARRIER and st.barrier_nonce(barrier) == b"nonce-1"
    assert st.header(b"something else") is None and st.barrier_nonce(value) is None
