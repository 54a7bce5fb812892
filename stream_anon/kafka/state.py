"""Partition state in Kafka: the state topic's records and the fail-closed decision at recovery.

Each input partition ``p`` has its state in partition ``p`` of the app's state topic (``<app_id>-state``,
compacted, co-partitioned with the input), written in the same Kafka transaction as the batch's output records
and consumer offsets (read-process-write exactly-once, as Kafka Streams does). Any worker of the app can recover
it: state survives the loss of a worker's machine.

Recovery never relies on the broker's end offset (the Tansu broker reports it wrong, see
``../shared/notes/broker-notes.md``) nor on consumers never seeing aborted records (Tansu shows them to
``read_committed`` consumers, and never expires a dead producer's transaction):

1. the new owner initializes the partition's transactional producer (``<app_id>-p<p>``): this fences a zombie
   and ends whatever transaction it left open;
2. it commits a **barrier** record with a fresh nonce to the state partition and reads the partition from the
   beginning until it sees that nonce: everything committed before is then read;
3. every state transaction also commits a **marker offset** for the state partition itself in the consumer
   group: the transaction's sequence number. A committed offset is visible only once its transaction commits, so
   the state record to use is the last one carrying exactly that sequence number; records with another number
   come from aborted transactions and are ignored.

Anything unexpected stops the partition with a reason (``HALT_*``), never a guess: a committed marker whose
state record is missing, committed input offsets without state, an input topic that was re-created (its topic
id changed), a local cache that knows more history than the state topic (a broker or state topic reset).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import orjson

MAGIC = b"SA1"
KIND_STATE, KIND_BARRIER = b"s", b"b"
_HEAD = struct.Struct(">qq")        # sequence number, last input offset

HALT_MARKER_WITHOUT_STATE = "committed_state_missing"
HALT_OFFSETS_WITHOUT_STATE = "committed_offsets_without_state"
HALT_STATE_WITHOUT_MARKER = "state_without_committed_marker"
HALT_TOPIC_RECREATED = "input_topic_recreated"
HALT_STATE_RESET = "state_topic_reset"
HALT_OFFSET_MISMATCH = "committed_offset_mismatch"


def state_topic(app_id: str) -> str:
    return f"{app_id}-state"


def transactional_id(app_id: str, partition: int) -> str:
    return f"{app_id}-p{partition}"


def state_key(stream: str, partition: int) -> bytes:
    return f"{stream}/p{partition}".encode()


def barrier_key(stream: str, partition: int) -> bytes:
    return f"{stream}/p{partition}/barrier".encode()


def encode_state(doc: dict) -> bytes:
    """``SA1 s <seq> <offset> zlib(json)``: the header can be read without decompressing the state."""
    body = zlib.compress(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), 1)
    return MAGIC + KIND_STATE + _HEAD.pack(doc["seq"], doc["offset"]) + body


def encode_barrier(nonce: bytes) -> bytes:
    return MAGIC + KIND_BARRIER + _HEAD.pack(-1, -1) + nonce


def header(value: bytes | None) -> tuple[bytes, int, int] | None:
    """(kind, seq, offset) of a state-topic value, or None for anything else."""
    if not value or len(value) < 4 + _HEAD.size or value[:3] != MAGIC:
        return None
    seq, offset = _HEAD.unpack_from(value, 4)
    return value[3:4], seq, offset


def barrier_nonce(value: bytes) -> bytes | None:
    h = header(value)
    return value[4 + _HEAD.size:] if h and h[0] == KIND_BARRIER else None


def decode_state(value: bytes) -> dict:
    h = header(value)
    if h is None or h[0] != KIND_STATE:
        raise ValueError("not a state record")
    return orjson.loads(zlib.decompress(value[4 + _HEAD.size:]))


@dataclass
class Recovery:
    """The outcome of reading a partition's state: the state document to resume from (None: start empty), or
    the reason to halt the partition."""
    doc: dict | None = None
    halt: str | None = None
    detail: str = ""
    adopted_reset: bool = False


def choose_state(states: list[bytes], marker: int | None, committed_input: int | None,
                 cached: dict | None = None, input_topic_id: str | None = None,
                 accept_input_reset: bool = False) -> Recovery:
    """Decide how a partition resumes (pure function: the loop reads, this decides).

    ``states``: the partition's state-record values in log order (barriers left out); ``marker``: the committed
    marker offset (the sequence number of the last committed state transaction) or None; ``committed_input``:
    the group's committed input offset or None; ``cached``: the worker's local cache header of the partition
    (``{"seq", "offset", "input_topic_id"}``) or None; ``input_topic_id``: the input topic's current id.

    >>> choose_state([], None, None).doc is None, choose_state([], None, None).halt
    (True, None)
    >>> choose_state([], None, 120).halt
    'committed_offsets_without_state'
    """
    if marker is None:
        seqs = {h[1] for h in map(header, states) if h is not None}
        if seqs and seqs != {1}:
            return Recovery(halt=HALT_STATE_WITHOUT_MARKER,
                            detail=f"{len(states)} state records (transactions {sorted(seqs)[:5]}...) but no "
                                   "committed marker: the group's offsets were lost or reset")
        # only first attempts (sequence 1) and no marker: the partition never committed (a committed first
        # transaction commits marker 1 with it); these records come from aborted attempts
        if committed_input is not None:
            return Recovery(halt=HALT_OFFSETS_WITHOUT_STATE,
                            detail=f"input offset {committed_input} committed but the state topic holds no state")
        if cached and cached.get("seq", 0) > 0:
            return Recovery(halt=HALT_STATE_RESET,
                            detail=f"the local cache knows state transaction {cached['seq']} (input offset "
                                   f"{cached.get('offset')}) but the broker has no state and no offsets: broker or "
                                   "state topic reset")
        return Recovery()
    chosen = None
    for value in states:
        h = header(value)
        if h is not None and h[0] == KIND_STATE and h[1] == marker:
            chosen = value                       # the last copy: records of aborted attempts come before it
    if chosen is None:
        return Recovery(halt=HALT_MARKER_WITHOUT_STATE,
                        detail=f"committed state transaction {marker} not found among {len(states)} state records")
    doc = decode_state(chosen)
    if committed_input is not None and committed_input != doc["offset"] + 1:
        return Recovery(halt=HALT_OFFSET_MISMATCH,
                        detail=f"committed input offset {committed_input} but the state covers up to "
                               f"{doc['offset']}")
    if cached and cached.get("seq", 0) > doc["seq"] and cached.get("input_topic_id") == doc.get("input_topic_id"):
        return Recovery(halt=HALT_STATE_RESET,
                        detail=f"the local cache knows state transaction {cached['seq']}, the state topic only "
                               f"{doc['seq']}")
    old = doc.get("input_topic_id")
    if old and input_topic_id and old != input_topic_id:
        if not accept_input_reset:
            return Recovery(halt=HALT_TOPIC_RECREATED,
                            detail=f"input topic id changed from {old} to {input_topic_id} (re-created): offsets "
                                   "in the state do not refer to the new topic")
        doc = {**doc, "offset": -1, "input_topic_id": input_topic_id}
        return Recovery(doc=doc, adopted_reset=True)
    return Recovery(doc=doc)
