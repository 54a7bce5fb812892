"""Partition state in Kafka: the state topic's records and the fail-closed decision at recovery.

Each input partition ``p`` has its state in partition ``p`` of the app's state topic (``<app_id>-state``,
compacted, co-partitioned with the input), written in the same Kafka transaction as the batch's output records
and consumer offsets (read-process-write exactly-once, as Kafka Streams does). Any worker of the app can recover
it: state survives the loss of a worker's machine.

**Records.** A partition's state is a bounded *core* and *keyed tables* (:mod:`stream_anon.checkpoint`: the
worker's position, the engine's and the DP aggregates' parts). Each transaction writes one state record
(:func:`~stream_anon.checkpoint.encode_state`): the full core plus either every table in full (a **full** record)
or only the rows put and the keys deleted since the previous transaction (a **delta**). So a transaction costs
what changed, not what was ever seen; a full record is written when a partition is (re)opened and whenever the
deltas since the last full one hold more rows than the tables (or ``MAX_CHAIN`` transactions), which bounds what
recovery reads to about two full states. Record keys are ``<stream>/p<p>/s<seq>``; a full record's transaction also
writes tombstones for the keys of the chain before it, so compaction keeps about one chain per partition.

**Size.** No state-topic value is longer than ``PART_MAX_BYTES`` (900,000 bytes): a longer record is written as
parts in the same transaction (:func:`~stream_anon.checkpoint.split_value`; part ``i`` > 0 under the key
``<stream>/p<p>/s<seq>/<i>``), each naming its transaction, its index, the number of parts and the digest of the
whole record, and reassembled on recovery; a record of the chain with a part missing, or whose parts do not make
the record their digest names, is an incomplete chain (``HALT_MARKER_WITHOUT_STATE``). The worker creates the
state topic with ``max.message.bytes`` = ``MESSAGE_MAX_BYTES`` and its producers use the same
``message.max.bytes``; it refuses to start on an existing state topic with a lower limit.

Recovery never relies on the broker's end offset (the Tansu broker reports it wrong, see
``../shared/notes/broker-notes.md``) nor on consumers never seeing aborted records (Tansu shows them to
``read_committed`` consumers, and never expires a dead producer's transaction; Apache Kafka does neither, so on it
these rules are a second line, for Tansu they are the only one: docs/brokers.md):

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

from dataclasses import dataclass, field

from stream_anon import guarantees
from stream_anon.checkpoint import (HEAD, KIND_BARRIER, KIND_FULL, KIND_PART, MAGIC, MIN_PART_BYTES,  # noqa: F401
                                    PART_MAX_BYTES, STATE_KINDS, Part, StateRecord, decode_state, encode_state,
                                    header, join_parts, read_part, resolve_chain, split_value)

MAX_CHAIN = 256                     # transactions between two full records, at most
# The state topic's max.message.bytes, set when the worker creates it, and its producers' message.max.bytes: a
# value of at most PART_MAX_BYTES with its key and a record batch's framing fits (message_bytes_needed; Apache
# Kafka's default is 1 MB).
MESSAGE_MAX_BYTES = 1_048_576
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "max.message.bytes": str(MESSAGE_MAX_BYTES)}

HALT_MARKER_WITHOUT_STATE = "committed_state_missing"
HALT_OFFSETS_WITHOUT_STATE = "committed_offsets_without_state"
HALT_STATE_WITHOUT_MARKER = "state_without_committed_marker"
HALT_TOPIC_RECREATED = "input_topic_recreated"
HALT_STATE_RESET = "state_topic_reset"
HALT_OFFSET_MISMATCH = "committed_offset_mismatch"
HALT_KEY_CHANGED = "key_changed"
HALT_MESSAGE_TOO_LARGE = "message_too_large"
HALT_CONFIG_CHANGED = "config_changed"
HALT_CONFIG_CHANGE_REFUSED = "config_change_refused"
HALT_KEY_ROTATION_REFUSED = "key_rotation_refused"


def state_topic(app_id: str) -> str:
    return f"{app_id}-state"


def transactional_id(app_id: str, partition: int) -> str:
    return f"{app_id}-p{partition}"


def state_key(stream: str, partition: int, seq: int, part: int = 0) -> bytes:
    """The key of transaction ``seq``'s record (of its part ``part`` when written in parts; part 0 has the key a
    whole record has): each part is kept by compaction until its transaction's chain is tombstoned."""
    return f"{stream}/p{partition}/s{seq}".encode() + (f"/{part}".encode() if part else b"")


def record_keys(stream: str, partition: int, seq: int, parts: int = 1) -> list[bytes]:
    """The keys of transaction ``seq``'s record written as ``parts`` values."""
    return [state_key(stream, partition, seq, i) for i in range(parts)]


def checked_part_bytes(part_bytes: int) -> int:
    """The largest state-topic value a worker is given (``--state-part-bytes``), or ValueError."""
    if not MIN_PART_BYTES <= part_bytes <= PART_MAX_BYTES:
        raise ValueError(f"--state-part-bytes {part_bytes}: between {MIN_PART_BYTES} and {PART_MAX_BYTES}")
    return int(part_bytes)


def message_bytes_needed(part_bytes: int = PART_MAX_BYTES) -> int:
    """The ``max.message.bytes`` a state topic needs for values of at most ``part_bytes``: the value, its key and a
    record batch's framing, and lz4's worst case on bytes that do not compress (0.4%)."""
    return part_bytes + part_bytes // 200 + 1024


def topic_limit_problem(configs: dict, part_bytes: int = PART_MAX_BYTES) -> str | None:
    """Why an existing state topic cannot take the worker's records of at most ``part_bytes`` a value (``configs``:
    its configuration as described by the broker, name -> value), or None. A topic that does not say its limit is
    taken at its word."""
    limit = configs.get("max.message.bytes")
    try:
        limit = int(limit) if limit is not None else None
    except ValueError:
        return f"its max.message.bytes is not a number ({limit!r})"
    needed = message_bytes_needed(part_bytes)
    if limit is not None and limit < needed:
        return (f"its max.message.bytes is {limit}, below the {needed} bytes the worker's state records need: "
                f"raise it (kafka-configs --alter --add-config max.message.bytes={MESSAGE_MAX_BYTES} on the topic) "
                "or lower --state-part-bytes")
    return None


def barrier_key(stream: str, partition: int) -> bytes:
    return f"{stream}/p{partition}/barrier".encode()


def encode_barrier(nonce: bytes) -> bytes:
    return MAGIC + KIND_BARRIER + HEAD.pack(-1, -1) + nonce


def barrier_nonce(value: bytes) -> bytes | None:
    h = header(value)
    return value[4 + HEAD.size:] if h and h[0] == KIND_BARRIER else None


class _Attempt:
    """The parts of one attempt at writing a record in parts (all of one digest), as they come."""

    def __init__(self, digest: bytes, count: int):
        self.digest, self.count = digest, count
        self.parts: dict[int, Part] = {}
        self.error = ""              # a malformed part where this record's were expected

    def value(self) -> tuple[bytes | None, str]:
        if self.error:
            return None, self.error
        if len(self.parts) < self.count:
            missing = sorted(set(range(self.count)) - set(self.parts))
            return None, f"{len(missing)} of its {self.count} parts missing (part(s) {missing[:5]})"
        try:
            return join_parts(list(self.parts.values())), ""
        except ValueError as exc:
            return None, str(exc)


class StateLog:
    """A partition's state records read in log order, keeping for each sequence number the last record carrying
    it (the committed one, for every number up to the committed marker; see the module docstring). A record
    written in parts (:func:`~stream_anon.checkpoint.split_value`) is the parts of the last attempt carrying its
    sequence number, told apart from an earlier attempt's by the record's digest; it is whole only with every
    part, and recovery of a chain holding it halts otherwise. Records older than a full record that a later
    transaction followed are dropped as they come: the chain of any marker from then on starts at that full record
    or later, so memory stays about one chain even on a broker that never compacts."""

    def __init__(self):
        self.values: dict[int, bytes | _Attempt] = {}
        self.full: dict[int, bool] = {}
        self._latest_full: int | None = None

    def add(self, value: bytes) -> None:
        h = header(value)
        if h is None or h[0] not in (*STATE_KINDS, KIND_PART):
            return
        seq = h[1]
        if h[0] != KIND_PART:
            self._attempt(seq, h[0] == KIND_FULL, value)
            return
        try:
            part = read_part(value)
        except ValueError as exc:       # this attempt's record cannot be made whole
            held = self.values.get(seq)
            if not isinstance(held, _Attempt):
                held = _Attempt(b"", 0)
                self._attempt(seq, self.full.get(seq, False), held)
            held.error = str(exc)
            return
        held = self.values.get(seq)
        if not (isinstance(held, _Attempt) and (held.digest, held.count) == (part.digest, part.count)):
            held = _Attempt(part.digest, part.count)       # another attempt at the transaction: it wins
            self._attempt(seq, part.kind == KIND_FULL, held)
        held.parts[part.index] = part

    def _attempt(self, seq: int, full: bool, value) -> None:
        """A new attempt at transaction ``seq``, whole or its first part."""
        if self._latest_full is not None and seq > self._latest_full:
            for s in [s for s in self.values if s < self._latest_full]:
                del self.values[s], self.full[s]
        self.values[seq] = value
        self.full[seq] = full
        if full and (self._latest_full is None or seq >= self._latest_full):
            self._latest_full = seq
        elif not full and self._latest_full == seq:
            self._latest_full = max((s for s, f in self.full.items() if f), default=None)

    def written_as(self, seq: int) -> int:
        """Values transaction ``seq``'s record was written as (1: whole)."""
        held = self.values.get(seq)
        return held.count if isinstance(held, _Attempt) else 1

    def chain(self, marker: int) -> tuple[list[StateRecord] | None, str]:
        """The decoded chain ending at ``marker``, or (None, why it is incomplete)."""
        seq = marker
        while seq in self.values and not self.full[seq]:
            seq -= 1
        if seq not in self.values:
            return None, (f"committed state transaction {marker} not found among {len(self.values)} state records"
                          if seq == marker else f"the chain of committed state transaction {marker} is broken at "
                                                f"transaction {seq}")
        chain = []
        for s in range(seq, marker + 1):
            held = self.values[s]
            value, why = (held, "") if isinstance(held, bytes) else held.value()
            if value is None:
                return None, f"the record of committed state transaction {s} is incomplete: {why}"
            chain.append(decode_state(value))
        return chain, ""


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
    record_parts: dict = field(default_factory=dict)   # seq -> values it was written as, of records in parts
    changes: list = field(default_factory=list)     # guarantee settings that differ from the state's (one line each)
    lineage: str | None = None      # without state: the lineage the partition starts in (stream_anon.kafka.lineage)
    notes: dict = field(default_factory=dict)       # for the partition's next manifest (lineage_started, key_rotated)
    rotated_from: str | None = None     # the state's key id, rotated to the worker's (--rotate-key)


def choose_state(states, marker: int | None, committed_input: int | None,
                 cached: dict | None = None, input_topic_id: str | None = None,
                 accept_input_reset: bool = False, kid: str | None = None, settings: dict | None = None,
                 accept_config_change: bool = False, rotate_from: str | None = None) -> Recovery:
    """Decide how a partition resumes (pure function: the loop reads, this decides).

    ``states``: a :class:`StateLog`, or the partition's state-topic values in log order; ``marker``: the
    committed marker offset (the sequence number of the last committed state transaction) or None;
    ``committed_input``: the group's committed input offset or None; ``cached``: the worker's local cache header of
    the partition (``{"seq", "offset", "input_topic_id"}``) or None; ``input_topic_id``: the input topic's
    current id; ``kid``: the key id of the worker's secret (a state written under another key is not resumed:
    its keyed unit ids, event keys and tokens would not match what this key makes); ``settings``: the guarantee
    settings in force (:func:`stream_anon.guarantees.settings`): a state written under others is resumed only when
    ``accept_config_change`` (the changes are then listed in ``Recovery.changes``), else the partition halts with
    them; ``rotate_from``: the key id of the previous secret (``--rotate-key``): a state written under it is resumed
    under the worker's key (``Recovery.rotated_from``; :func:`stream_anon.worker.partition.check_rotation` decides
    whether it can be).

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
    record_parts = {r.seq: states.written_as(r.seq) for r in chain if states.written_as(r.seq) > 1}
    rotated_from = None
    if kid is not None and doc.get("kid") != kid:
        if rotate_from is None or doc.get("kid") != rotate_from:
            how = (f"the previous secret given is key id {rotate_from}" if rotate_from else
                   "to rotate the key, restart with --rotate-key and the previous secret in "
                   "STREAM_ANON_PREVIOUS_SECRET(_FILE) (docs/operations.md, Key rotation)")
            return Recovery(halt=HALT_KEY_CHANGED,
                            detail=f"the state was written with key id {doc.get('kid')}, this worker's secret is key "
                                   f"id {kid}; {how}")
        rotated_from = rotate_from
    changed = guarantees.changes(doc.get("settings", {}), settings) if settings is not None else []
    if changed and not accept_config_change:
        return Recovery(halt=HALT_CONFIG_CHANGED, detail="; ".join(changed), changes=changed)
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
        return Recovery(doc=doc, tables=tables, base_seq=chain[0].seq, adopted_reset=True, changes=changed,
                        rotated_from=rotated_from, record_parts=record_parts)
    return Recovery(doc=doc, tables=tables, base_seq=chain[0].seq, changes=changed, rotated_from=rotated_from,
                    record_parts=record_parts)
