"""One state model for every stateful part of a partition: a small bounded **core** plus **keyed tables**.

A part (the engine's window core, a former, the published-class registry, the DP aggregates, the budget ledger)
implements :class:`Checkpointable`:

* ``state_core()``: a JSON-serializable dict whose size does not grow with the individuals or events seen (counters,
  positions, small lists bounded by configuration). Not a copy: serialize it before the part changes again.
* ``state_tables()``: the part's live :class:`~stream_anon.keyed_table.KeyedTable` objects by name: what grows
  with the individuals or events seen. Each table says what changed since it was last asked
  (:meth:`KeyedTable.changes`), so a state record costs what changed.
* ``load_state(core, tables)``: on a part just built from the configuration, the state of ``state_core()`` and the
  tables in full (name -> ``(keys, rows)``; a missing table is empty).

Parts nest: :class:`Composite` names its children, their cores sit under the child's name and their tables as
``child/table``. The functions below work on any Checkpointable, so the partition's state record, its restore and
the contract suite (:mod:`stream_anon.contract_checks.checkpointable`) are written once.

**State records** (:class:`StateRecord`, :func:`encode_state`): one transaction's record of a state, either
**full** (the core and every table in full) or a **delta** (the core and, per table, the rows put and the keys
deleted since the record before it). :func:`resolve_chain` gives the state a chain of records (a full one and the
deltas after it) stands for. Where the records are kept and how recovery chooses a chain is the worker's business
(:mod:`stream_anon.worker.state`).

A record longer than ``PART_MAX_BYTES`` is written as parts (:func:`split_value`), each carrying the digest of the
whole record; :func:`join_parts` gives the record back only from all of one record's parts.

>>> from stream_anon.keyed_table import KeyedTable
>>> class Counter:
...     def __init__(self):
...         self.n, self.seen = 0, KeyedTable([("time", "f8")])
...     def state_core(self):
...         return {"n": self.n}
...     def state_tables(self):
...         return {"seen": self.seen}
...     def load_state(self, core, tables):
...         self.n = core["n"]
...         load_tables(self.state_tables(), tables)
>>> a = Counter(); a.n = 2; a.seen.put(np.array([7]), np.array([(1.5,)], dtype=a.seen.dtype))
>>> core, tables = full_state(Composite({"counter": a}))
>>> core, sorted(tables)
({'counter': {'n': 2}}, ['counter/seen'])
>>> b = Composite({"counter": Counter()}); b.load_state(core, tables)
>>> b.children["counter"].n, b.children["counter"].seen == a.seen
(2, True)
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

import lz4.frame
import numpy as np
import orjson

from stream_anon.keyed_table import BLOB, KeyedTable

SEPARATOR = "/"          # a nested table's name: <child>/<table>
EMPTY_KEYS = np.empty(0, dtype=np.int64)

# name -> (int64 keys sorted ascending, records: a structured array, or a BlobTable's values as a list)
Tables = Mapping[str, tuple[np.ndarray, np.ndarray | list[bytes]]]
Changes = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]   # name -> (keys put, their records, keys deleted)


@runtime_checkable
class Checkpointable(Protocol):
    """A stateful part of a partition (module docstring)."""

    def state_core(self) -> dict: ...

    def state_tables(self) -> Mapping[str, KeyedTable]: ...

    def load_state(self, core: dict, tables: Tables) -> None: ...


def full_state(part: Checkpointable) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(core, every table in full as copies). Does not reset what :func:`changes` reports."""
    return part.state_core(), {name: t.snapshot() for name, t in part.state_tables().items()}


def changes(part: Checkpointable) -> Changes:
    """What changed in the part's tables since the previous call (the first call on a new or restored part: every
    row, no deletion). Applying the change sets in order to the first gives :func:`full_state`'s tables."""
    return {name: t.changes() for name, t in part.state_tables().items()}


def changes_then(first: Changes, then: Changes) -> Changes:
    """The change sets of two consecutive :func:`changes` calls as one: what a single call at the time of the
    second would have given (a key's record as of ``then``; a key deleted and put again is put, one put and then
    deleted is deleted). For a state record that covers two batches whose changes were asked after each.

    >>> k = lambda *a: np.array(a, dtype=np.int64)
    >>> r = lambda *a: np.array([(x,) for x in a], dtype=[("v", "<i4")])
    >>> keys, rows, gone = changes_then({"t": (k(1, 3), r(10, 30), k(5))}, {"t": (k(2, 5), r(20, 50), k(3))})["t"]
    >>> keys.tolist(), rows["v"].tolist(), gone.tolist()
    ([1, 2, 5], [10, 20, 50], [3])
    """
    out: Changes = {}
    for name in {**first, **then}:
        if name not in first or name not in then:
            out[name] = then[name] if name in then else first[name]
            continue
        (k1, r1, d1), (k2, r2, d2) = first[name], then[name]
        kept = ~np.isin(k1, np.concatenate([k2, d2]))
        keys = np.concatenate([k1[kept], k2])
        order = np.argsort(keys, kind="stable")
        if isinstance(r1, list):             # a BlobTable's values
            both = [v for v, keep in zip(r1, kept.tolist()) if keep] + list(r2)
            rows = [both[i] for i in order.tolist()]
        else:
            rows = np.concatenate([r1[kept], r2])[order]
        gone = np.union1d(d1, d2)
        out[name] = (keys[order], rows, gone[~np.isin(gone, k2)])
    return out


def table_rows(part: Checkpointable) -> int:
    """Rows held by the part's tables (what a full state record carries besides the core)."""
    return sum(len(t) for t in part.state_tables().values())


def load_tables(live: Mapping[str, KeyedTable], saved: Tables) -> None:
    """Fill ``live`` tables from ``saved`` ones (name -> (keys, rows)); a table not saved is emptied. A saved table
    the part does not have is an error: state written by another layout must not be half-read."""
    unknown = sorted(set(saved) - set(live))
    if unknown:
        raise ValueError(f"state holds table(s) {unknown} that this part does not have ({sorted(live)})")
    for name, table in live.items():
        keys, rows = saved.get(name, (EMPTY_KEYS, np.empty(0, dtype=table.dtype)))
        table.load(keys, np.asarray(rows, dtype=table.dtype))


class Composite:
    """Named children as one Checkpointable: core ``{child: child core}``, tables ``child/table``."""

    def __init__(self, children: Mapping[str, Checkpointable]):
        for name in children:
            if SEPARATOR in name:
                raise ValueError(f"a part's name may not contain {SEPARATOR!r}: {name!r}")
        self.children = dict(children)

    def state_core(self) -> dict:
        return {name: child.state_core() for name, child in self.children.items()}

    def state_tables(self) -> dict[str, KeyedTable]:
        return {f"{name}{SEPARATOR}{t}": table for name, child in self.children.items()
                for t, table in child.state_tables().items()}

    def load_state(self, core: dict, tables: Tables) -> None:
        unknown = sorted(n for n in tables if n.partition(SEPARATOR)[0] not in self.children)
        if unknown:
            raise ValueError(f"state holds table(s) {unknown} of no part of {sorted(self.children)}")
        for name, child in self.children.items():
            prefix = name + SEPARATOR
            child.load_state(core[name], {n[len(prefix):]: t for n, t in tables.items() if n.startswith(prefix)})


# -- state records --------------------------------------------------------------------------------------------
MAGIC = b"SA2"
KIND_FULL, KIND_DELTA, KIND_BARRIER, KIND_PART = b"f", b"d", b"b", b"p"
STATE_KINDS = (KIND_FULL, KIND_DELTA)
HEAD = struct.Struct(">qq")         # sequence number, last input offset
_BODY = struct.Struct(">I")         # length of the compressed JSON part
LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"   # an LZ4 frame's first bytes


def table_dtype(descr) -> np.dtype:
    """The dtype of a table from its description in a state record (``dtype.descr``, JSON round-tripped)."""
    return np.dtype([tuple(f) for f in descr])


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
    def full_of(cls, doc: dict, tables: Tables) -> "StateRecord":
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


def encode_state(rec: StateRecord) -> bytes:
    """``SA2 <f|d> <seq> <offset> <json length> lz4(json) <table bytes>``. The header can be read without
    decoding the rest; the JSON part names each table's layout and counts; the tables follow as raw little-endian
    keys, records (a blob table: value lengths, then the values as one LZ4 frame) and deleted keys (hashed keys do
    not compress: they are not compressed). The JSON part is an LZ4 frame: a partition's core is rewritten by every
    transaction, and zlib at level 1 took 2-5 us per event of the worker's one thread for a ratio within 10% of
    lz4's, which takes a ninth of that. Encoded once: later calls return what the first wrote."""
    if rec.value is not None:
        return rec.value
    layout, blobs = [], []
    for name, (keys, rows, deleted) in rec.tables.items():
        if isinstance(rows, list):          # a BlobTable: value lengths, then the values as one LZ4 frame (JSON)
            values = lz4.frame.compress(b"".join(rows))
            layout.append([name, [BLOB, len(values)], len(keys), len(deleted)])
            blobs += [np.ascontiguousarray(keys, dtype="<i8").tobytes(),
                      np.array([len(v) for v in rows], dtype="<u4").tobytes(), values,
                      np.ascontiguousarray(deleted, dtype="<i8").tobytes()]
            continue
        dt = rows.dtype.newbyteorder("<") if rows.dtype.byteorder == ">" else rows.dtype
        layout.append([name, dt.descr, len(keys), len(deleted)])
        blobs += [np.ascontiguousarray(keys, dtype="<i8").tobytes(),
                  np.ascontiguousarray(rows.astype(dt, copy=False)).tobytes(),
                  np.ascontiguousarray(deleted, dtype="<i8").tobytes()]
    body = lz4.frame.compress(orjson.dumps({"doc": rec.doc, "tables": layout},
                                           option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    kind = KIND_FULL if rec.full else KIND_DELTA
    rec.value = b"".join([MAGIC, kind, HEAD.pack(rec.doc["seq"], rec.doc["offset"]), _BODY.pack(len(body)), body,
                          *blobs])
    return rec.value


def header(value: bytes | None) -> tuple[bytes, int, int] | None:
    """(kind, seq, offset) of a state-topic value, or None for anything else (a tombstone, another format)."""
    if not value or len(value) < 4 + HEAD.size or value[:3] != MAGIC:
        return None
    seq, offset = HEAD.unpack_from(value, 4)
    return value[3:4], seq, offset


def decode_state(value: bytes) -> StateRecord:
    h = header(value)
    if h is None or h[0] not in STATE_KINDS:
        raise ValueError("not a state record")
    pos = 4 + HEAD.size
    (n,) = _BODY.unpack_from(value, pos)
    pos += _BODY.size
    body = value[pos:pos + n]
    if body[:4] != LZ4_FRAME_MAGIC:
        raise ValueError("state record of an earlier format (its JSON part is not an LZ4 frame)")
    meta = orjson.loads(lz4.frame.decompress(body))
    pos += n
    tables = {}
    for name, descr, n_put, n_del in meta["tables"]:
        keys = np.frombuffer(value, dtype="<i8", count=n_put, offset=pos).astype(np.int64)
        pos += 8 * n_put
        rows: np.ndarray | list[bytes]
        if descr[0] == BLOB:
            lengths = np.frombuffer(value, dtype="<u4", count=n_put, offset=pos).tolist()
            pos += 4 * n_put
            values = lz4.frame.decompress(value[pos:pos + descr[1]])
            pos += descr[1]
            rows, at = [], 0
            for n_bytes in lengths:
                rows.append(values[at:at + n_bytes])
                at += n_bytes
        else:
            dt = table_dtype(descr)
            rows = np.frombuffer(value, dtype=dt, count=n_put, offset=pos).copy()
            pos += dt.itemsize * n_put
        deleted = np.frombuffer(value, dtype="<i8", count=n_del, offset=pos).astype(np.int64)
        pos += 8 * n_del
        tables[name] = (keys, rows, deleted)
    if pos != len(value):
        raise ValueError(f"{len(value) - pos} bytes beyond the declared tables")
    return StateRecord(meta["doc"], tables, h[0] == KIND_FULL)


# -- a record in parts ------------------------------------------------------------------------------------------
PART_MAX_BYTES = 900_000            # a state-topic value, at most: a record longer than this is written in parts
MIN_PART_BYTES = 4096               # the lowest part size a worker may be given (--state-part-bytes)
_PART = struct.Struct(">cHH16s")    # the record's kind, the part's index, the number of parts, the record's digest
_PART_AT = 4 + HEAD.size            # where a part's own header starts (after MAGIC, KIND_PART, seq, offset)


def record_digest(value: bytes) -> bytes:
    """What tells the parts of one written record from another's: the digest of the whole record (two attempts at
    a transaction that wrote the same bytes have the same digest, and their parts are interchangeable)."""
    return hashlib.blake2b(value, digest_size=16).digest()


def part_count(nbytes: int, max_bytes: int = PART_MAX_BYTES) -> int:
    """Values a record of ``nbytes`` is written as (1: itself)."""
    if nbytes <= max_bytes:
        return 1
    return -(-nbytes // (max_bytes - _PART_AT - _PART.size))


def split_value(value: bytes, max_bytes: int = PART_MAX_BYTES) -> list[bytes]:
    """A record's value as written to the state topic: itself when at most ``max_bytes`` long, else parts of at
    most ``max_bytes`` each: ``SA2 p <seq> <offset> <kind> <index> <count> <digest> <slice of the record>``. Every
    part names its transaction (seq, offset: :func:`header`), the record's kind and the digest of the whole record
    (:func:`join_parts` checks the parts against it)."""
    count = part_count(len(value), max_bytes)
    if count == 1:
        return [value]
    h = header(value)
    if h is None or h[0] not in STATE_KINDS:
        raise ValueError("not a state record")
    if count > 0xFFFF:
        raise ValueError(f"a state record of {len(value)} bytes needs {count} parts, more than {0xFFFF}")
    room = max_bytes - _PART_AT - _PART.size
    head = MAGIC + KIND_PART + value[4:_PART_AT]
    digest = record_digest(value)
    return [head + _PART.pack(h[0], i, count, digest) + value[i * room:(i + 1) * room] for i in range(count)]


@dataclass(frozen=True)
class Part:
    """One part of a record written in parts (:func:`split_value`)."""
    seq: int
    kind: bytes          # the whole record's: KIND_FULL or KIND_DELTA
    index: int
    count: int
    digest: bytes
    payload: bytes


def read_part(value: bytes) -> Part:
    """The part a state-topic value is; ValueError for anything that is not a well-formed part."""
    h = header(value)
    if h is None or h[0] != KIND_PART or len(value) < _PART_AT + _PART.size:
        raise ValueError("not a part of a state record")
    kind, index, count, digest = _PART.unpack_from(value, _PART_AT)
    if kind not in STATE_KINDS or count < 2 or index >= count:
        raise ValueError(f"a malformed part of state transaction {h[1]} (kind {kind!r}, part {index} of {count})")
    return Part(h[1], kind, index, count, digest, value[_PART_AT + _PART.size:])


def join_parts(parts: list[Part]) -> bytes:
    """The record the parts of one written record (in any order) make; ValueError when they are not all its
    parts or do not make the record their digest names."""
    first = parts[0]
    by_index = {p.index: p for p in parts}
    if sorted(by_index) != list(range(first.count)) or any(
            (p.seq, p.kind, p.count, p.digest) != (first.seq, first.kind, first.count, first.digest) for p in parts):
        raise ValueError(f"state transaction {first.seq}: parts {sorted(by_index)} of {first.count} do not make one "
                         "record")
    value = b"".join(by_index[i].payload for i in range(first.count))
    h = header(value)
    if record_digest(value) != first.digest or h is None or (h[0], h[1]) != (first.kind, first.seq):
        raise ValueError(f"state transaction {first.seq}: its {first.count} parts do not make the record they name")
    return value


def resolve_chain(chain: list[StateRecord]) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray | list[bytes]]]]:
    """The state a chain stands for: the last record's core and the tables of the first (full) record with every
    later delta applied in order, as name -> (keys sorted, rows). Vectorized: per table, the last action on each
    key across the chain wins (a put, or a deletion that removes the key)."""
    if not chain or not chain[0].full:
        raise ValueError("a state chain starts with a full record")
    tables: dict[str, tuple[np.ndarray, np.ndarray | list[bytes]]] = {}
    for name in dict.fromkeys(n for rec in chain for n in rec.tables):
        key_parts: list[np.ndarray] = []
        order_parts: list[np.ndarray] = []
        row_parts: list[np.ndarray | list[bytes]] = []
        src_parts: list[np.ndarray] = []
        base = 0
        for i, rec in enumerate(chain):
            if name not in rec.tables:
                continue
            k, r, d = rec.tables[name]
            key_parts += [k, d]
            order_parts += [np.full(len(k) + len(d), i, dtype=np.int64)]
            src_parts += [np.arange(base, base + len(k), dtype=np.int64), np.full(len(d), -1, dtype=np.int64)]
            row_parts.append(r)
            base += len(k)
        keys, order, src = np.concatenate(key_parts), np.concatenate(order_parts), np.concatenate(src_parts)
        by = np.lexsort((order, keys))                       # by key, then by position in the chain
        keys, src = keys[by], src[by]
        last = np.ones(len(keys), dtype=bool)
        last[:-1] = keys[1:] != keys[:-1]                   # the last action on each key
        keep = last & (src >= 0)
        if isinstance(row_parts[0], list):                  # a BlobTable's values
            values = [v for r in row_parts for v in r]
            tables[name] = (keys[keep], [values[i] for i in src[keep].tolist()])
        else:
            tables[name] = (keys[keep], np.concatenate(row_parts)[src[keep]])
    return chain[-1].doc, tables


def roundtrip(core: dict, tables: Tables) -> tuple[dict, dict]:
    """(core, tables) as a full state record encodes and decodes them: what a restore reads back (tests, the
    worker's snapshots before a retried batch)."""
    rec = StateRecord.full_of({"seq": 0, "offset": -1, "core": core}, tables)
    doc, back = resolve_chain([decode_state(encode_state(rec))])
    return doc["core"], back
