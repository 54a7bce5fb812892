"""Partition state in Kafka: the state topic's records and the fail-closed decision at recovery.

Each input partition ``p`` has its state in partition ``p`` of the app's state topic (``<app_id>-state``,
compacted, co-partitioned with the input), written in the same Kafka transaction as the batch's output records
and consumer offsets (read-process-write exactly-once, as Kafka Streams does). Any worker of the app can recover
it: state survives the loss of a worker's machine.

**Records.** A state has a bounded *core* (JSON: the worker's position, the engine's
:meth:`~stream_anon.engine.Engine.state_core`, the DP counters and ledger) and *keyed tables* that grow with the
individuals or events seen (m-invariance signatures, event ids seen, DP window counts per unit; numpy records,
:mod:`stream_anon.engine.state`). Each transaction writes one record: the full core plus either every table in
full (a **full** record) or only the rows put and the keys deleted since the previous transaction (a **delta**,
:meth:`~stream_anon.engine.Engine.state_changes`). So a transaction costs what changed, not what was ever seen;
a full record is written when a partition is (re)opened and whenever the deltas since the last full one hold
more rows than the tables (or ``MAX_CHAIN`` transactions), which bounds what recovery reads to about two full
states. Record keys are ``<stream>/p<p>/s<seq>``; a full record's transaction also writes tombstones for the keys
of the chain before it, so compaction keeps about one chain per partition.

Recovery never relies on the broker's end offset (the Tansu broker reports it wrong, see
``../shared/notes/broker-notes.md``) nor on consumers never seeing aborted records (Tansu shows them to
``read_committed`` consumers, and never expires a dead producer's transaction):

1. the new owner initializes the partition's transactional producer (``<app_id>-p<p>``): this fences a zombie
   and ends whatever transaction it left open;
2. it commits a **barrier** record with a fresh nonce to the state partition and reads the partition from the
   beginning until it sees that nonce: everything committed before is then read;
3. every state transaction also commits a **marker offset** for the state partition itself in the consumer
   group: the transaction's sequence number ``M``. A committed offset is visible only once its transaction
   commits, and a transaction is attempted only after the one before it committed, so for every sequence number
   up to ``M`` the last record carrying it is the committed one (records of aborted attempts come before it, and
   attempts after ``M`` carry larger numbers): the state is the chain from the last full record up to ``M``.

Anything unexpected stops the partition with a reason (``HALT_*``), never a guess: a committed marker whose
chain is incomplete, committed input offsets without state, an input topic that was re-created (its topic id
changed), a local cache that knows more history than the state topic (a broker or state topic reset).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import lz4.frame
import numpy as np
import orjson

from stream_anon.engine.carried import orjson_default
from stream_anon.engine.state import table_dtype

MAGIC = b"SA2"
KIND_FULL, KIND_DELTA, KIND_BARRIER = b"f", b"d", b"b"
STATE_KINDS = (KIND_FULL, KIND_DELTA)
_HEAD = struct.Struct(">qq")        # sequence number, last input offset
_BODY = struct.Struct(">I")         # length of the compressed JSON part
LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"   # an LZ4 frame's first bytes; a zlib stream starts with 0x78
MAX_CHAIN = 256                     # transactions between two full records, at most

HALT_MARKER_WITHOUT_STATE = "committed_state_missing"
HALT_OFFSETS_WITHOUT_STATE = "committed_offsets_without_state"
HALT_STATE_WITHOUT_MARKER = "state_without_committed_marker"
HALT_TOPIC_RECREATED = "input_topic_recreated"
HALT_STATE_RESET = "state_topic_reset"
HALT_OFFSET_MISMATCH = "committed_offset_mismatch"

EMPTY_KEYS = np.empty(0, dtype=np.int64)


def state_topic(app_id: str) -> str:
    return f"{app_id}-state"


def transactional_id(app_id: str, partition: int) -> str:
    return f"{app_id}-p{partition}"


def state_key(stream: str, partition: int, seq: int) -> bytes:
    return f"{stream}/p{partition}/s{seq}".encode()


def barrier_key(stream: str, partition: int) -> bytes:
    return f"{stream}/p{partition}/barrier".encode()


@dataclass
class StateRecord:
    """One state transaction's record. ``doc``: the core (JSON; carries ``seq`` and ``offset``). ``tables``: table
    name -> ``(keys, rows, deleted keys)``; for a full record the tables in full (no deletion), for a delta the
    rows put and keys deleted since the record before it (a table not named did not change). ``value``: the
    record as :func:`encode_state` wrote it (set by its first call: what was written, whatever later happens to
    the objects ``doc`` refers to, some of which may be a live engine's)."""
    doc: dict
    tables: dict = field(default_factory=dict)
    full: bool = True
    value: bytes | None = field(default=None, compare=False, repr=False)

    @classmethod
    def full_of(cls, doc: dict, tables: dict) -> "StateRecord":
        """A full record of a core and its tables (name -> (keys, rows))."""
        return cls(doc, {name: (keys, rows, EMPTY_KEYS) for name, (keys, rows) in tables.items()})

    def as_written(self) -> "StateRecord":
        """The record decoded from what was written (:func:`encode_state`)."""
        return decode_state(encode_state(self))

    @property
    def seq(self) -> int:
        return int(self.doc["seq"])

    @property
    def rows(self) -> int:
        """Rows put plus keys deleted: what the record costs, for the full-record policy."""
        return sum(len(k) + len(d) for k, _, d in self.tables.values())


def changes_by_table(changes: dict) -> dict:
    """``Engine.state_changes()`` form (``name``: (keys, rows), ``name:deleted``: (keys, None)) -> name -> (keys,
    rows, deleted keys)."""
    out = {}
    for name, (keys, rows) in changes.items():
        if not name.endswith(":deleted"):
            deleted = changes.get(name + ":deleted", (EMPTY_KEYS, None))[0]
            out[name] = (keys, rows, deleted)
    return out


def encode_state(rec: StateRecord) -> bytes:
    """``SA2 <f|d> <seq> <offset> <json length> lz4(json) <table bytes>``. The header can be read without
    decoding the rest; the JSON part names each table's layout and counts; the tables follow as raw little-endian
    keys, records and deleted keys (hashed keys do not compress: they are not compressed). The JSON part is an
    LZ4 frame (records written before were zlib: :func:`decode_state` reads both): a partition's core is rewritten
    by every transaction, and zlib at level 1 took 2-5 us per event of the worker's one thread for a ratio
    within 10% of lz4's, which takes a ninth of that. Encoded once: later calls return what the first wrote."""
    if rec.value is not None:
        return rec.value
    layout, blobs = [], []
    for name, (keys, rows, deleted) in rec.tables.items():
        dt = rows.dtype.newbyteorder("<") if rows.dtype.byteorder == ">" else rows.dtype
        layout.append([name, dt.descr, len(keys), len(deleted)])
        blobs += [np.ascontiguousarray(keys, dtype="<i8").tobytes(),
                  np.ascontiguousarray(rows.astype(dt, copy=False)).tobytes(),
                  np.ascontiguousarray(deleted, dtype="<i8").tobytes()]
    body = lz4.frame.compress(orjson.dumps({"doc": rec.doc, "tables": layout}, default=orjson_default,
                                           option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    kind = KIND_FULL if rec.full else KIND_DELTA
    rec.value = b"".join([MAGIC, kind, _HEAD.pack(rec.doc["seq"], rec.doc["offset"]), _BODY.pack(len(body)), body,
                          *blobs])
    return rec.value


def encode_barrier(nonce: bytes) -> bytes:
    return MAGIC + KIND_BARRIER + _HEAD.pack(-1, -1) + nonce


def header(value: bytes | None) -> tuple[bytes, int, int] | None:
    """(kind, seq, offset) of a state-topic value, or None for anything else (a tombstone, another format)."""
    if not value or len(value) < 4 + _HEAD.size or value[:3] != MAGIC:
        return None
    seq, offset = _HEAD.unpack_from(value, 4)
    return value[3:4], seq, offset


def barrier_nonce(value: bytes) -> bytes | None:
    h = header(value)
    return value[4 + _HEAD.size:] if h and h[0] == KIND_BARRIER else None


def decode_state(value: bytes) -> StateRecord:
    h = header(value)
    if h is None or h[0] not in STATE_KINDS:
        raise ValueError("not a state record")
    pos = 4 + _HEAD.size
    (n,) = _BODY.unpack_from(value, pos)
    pos += _BODY.size
    body = value[pos:pos + n]
    meta = orjson.loads(lz4.frame.decompress(body) if body[:4] == LZ4_FRAME_MAGIC else zlib.decompress(body))
    pos += n
    tables = {}
    for name, descr, n_put, n_del in meta["tables"]:
        dt = table_dtype(descr)
        keys = np.frombuffer(value, dtype="<i8", count=n_put, offset=pos).astype(np.int64)
        pos += 8 * n_put
        rows = np.frombuffer(value, dtype=dt, count=n_put, offset=pos).copy()
        pos += dt.itemsize * n_put
        deleted = np.frombuffer(value, dtype="<i8", count=n_del, offset=pos).astype(np.int64)
        pos += 8 * n_del
        tables[name] = (keys, rows, deleted)
    if pos != len(value):
        raise ValueError(f"{len(value) - pos} bytes beyond the declared tables")
    return StateRecord(meta["doc"], tables, h[0] == KIND_FULL)


def resolve_chain(chain: list[StateRecord]) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The state a chain stands for: the last record's core and the tables of the first (full) record with every
    later delta applied in order, as name -> (keys sorted, rows). Vectorized: per table, the last action on each
    key across the chain wins (a put, or a deletion that removes the key)."""
    if not chain or not chain[0].full:
        raise ValueError("a state chain starts with a full record")
    tables = {}
    for name in dict.fromkeys(n for rec in chain for n in rec.tables):
        keys, order, rows, src = [], [], [], []
        base = 0
        for i, rec in enumerate(chain):
            if name not in rec.tables:
                continue
            k, r, d = rec.tables[name]
            keys += [k, d]
            order += [np.full(len(k) + len(d), i, dtype=np.int64)]
            src += [np.arange(base, base + len(k), dtype=np.int64), np.full(len(d), -1, dtype=np.int64)]
            rows.append(r)
            base += len(k)
        keys, order, src = np.concatenate(keys), np.concatenate(order), np.concatenate(src)
        rows = np.concatenate(rows)
        by = np.lexsort((order, keys))                       # by key, then by position in the chain
        keys, src = keys[by], src[by]
        last = np.ones(len(keys), dtype=bool)
        last[:-1] = keys[1:] != keys[:-1]                   # the last action on each key
        keep = last & (src >= 0)
        tables[name] = (keys[keep], rows[src[keep]])
    return chain[-1].doc, tables


class StateLog:
    """A partition's state records read in log order, keeping for each sequence number the last record carrying
    it (the committed one, for every number up to the committed marker; see the module docstring). Records older
    than a full record that a later transaction followed are dropped as they come: the chain of any marker
    from then on starts at that full record or later, so memory stays about one chain even on a broker that
    never compacts."""

    def __init__(self):
        self.values: dict[int, bytes] = {}
        self.full: dict[int, bool] = {}
        self._latest_full: int | None = None

    def add(self, value: bytes) -> None:
        h = header(value)
        if h is None or h[0] not in STATE_KINDS:
            return
        seq = h[1]
        if self._latest_full is not None and seq > self._latest_full:
            for s in [s for s in self.values if s < self._latest_full]:
                del self.values[s], self.full[s]
        self.values[seq] = value
        self.full[seq] = h[0] == KIND_FULL
        if self.full[seq] and (self._latest_full is None or seq >= self._latest_full):
            self._latest_full = seq
        elif not self.full[seq] and self._latest_full == seq:
            self._latest_full = max((s for s, f in self.full.items() if f), default=None)

    def chain(self, marker: int) -> tuple[list[StateRecord] | None, str]:
        """The decoded chain ending at ``marker``, or (None, why it is incomplete)."""
        seq = marker
        while seq in self.values and not self.full[seq]:
            seq -= 1
        if seq not in self.values:
            return None, (f"committed state transaction {marker} not found among {len(self.values)} state records"
                          if seq == marker else f"the chain of committed state transaction {marker} is broken at "
                                                f"transaction {seq}")
        return [decode_state(self.values[s]) for s in range(seq, marker + 1)], ""


@dataclass
class Recovery:
    """The outcome of reading a partition's state: the state to resume from (``doc`` core and ``tables``; None:
    start empty), or the reason to halt the partition. ``base_seq``: the full record its chain starts at."""
    doc: dict | None = None
    tables: dict = field(default_factory=dict)
    base_seq: int | None = None
    halt: str | None = None
    detail: str = ""
    adopted_reset: bool = False


def choose_state(states, marker: int | None, committed_input: int | None,
                 cached: dict | None = None, input_topic_id: str | None = None,
                 accept_input_reset: bool = False) -> Recovery:
    """Decide how a partition resumes (pure function: the loop reads, this decides).

    ``states``: a :class:`StateLog`, or the partition's state-topic values in log order; ``marker``: the
    committed marker offset (the sequence number of the last committed state transaction) or None;
    ``committed_input``: the group's committed input offset or None; ``cached``: the worker's local cache header of
    the partition (``{"seq", "offset", "input_topic_id"}``) or None; ``input_topic_id``: the input topic's
    current id.

    >>> choose_state([], None, None).doc is None, choose_state([], None, None).halt
    (True, None)
    >>> choose_state([], None, 120).halt
    'committed_offsets_without_state'
    """
    if not isinstance(states, StateLog):
        log = StateLog()
        for value in states:
            log.add(value)
        states = log
    if marker is None:
        seqs = set(states.values)
        if seqs and seqs != {1}:
            return Recovery(halt=HALT_STATE_WITHOUT_MARKER,
                            detail=f"{len(seqs)} state records (transactions {sorted(seqs)[:5]}...) but no "
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
    chain, why = states.chain(marker)
    if chain is None:
        return Recovery(halt=HALT_MARKER_WITHOUT_STATE, detail=why)
    doc, tables = resolve_chain(chain)
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
        return Recovery(doc=doc, tables=tables, base_seq=chain[0].seq, adopted_reset=True)
    return Recovery(doc=doc, tables=tables, base_seq=chain[0].seq)
