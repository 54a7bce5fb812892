"""One input partition as the worker sees it: its pipeline (the engine's reader, window core, former and criteria;
the DP aggregates on the windows it closes), its position in the input, and its committed state as a chain of
state records (:mod:`stream_anon.checkpoint`).

State record of a partition: the core ``{"version", "stream", "partition", "seq", "offset", "input_topic",
"input_topic_id", "kid" (the key id of the secret it was written with), "flush_pending", "written_at", "engine":
<engine core>, "dp": <aggregates core>}`` and the
tables ``engine/<table>`` (:meth:`stream_anon.engine.Engine.state_tables`) and ``dp/<table>`` (the DP aggregates',
:class:`stream_anon.kafka.aggregates.PartitionAggregates`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from stream_anon import checkpoint, guarantees
from stream_anon.engine import Engine
from stream_anon.kafka.state import MAX_CHAIN

STATE_VERSION = 3              # 3: one state model (the engine's tables under engine/, the aggregates' under dp/)
ENGINE, DP = "engine/", "dp/"  # prefixes of the parts' tables in a partition's state record


@dataclass
class PartitionState:
    """A partition's pipeline (``engine``, ``dp``: the aggregates, None without ``[dp]``), its input position and
    its committed chain of state records."""
    partition: int
    engine: Engine
    dp: object = None              # stream_anon.kafka.aggregates.PartitionAggregates (or its process proxy)
    offset: int = -1               # last input offset whose effects are in the state (-1: none)
    seq: int = 0                   # committed state transactions of this partition (0: none)
    input_topic_id: str | None = None
    flush_pending: bool = False    # a committed decision to flush, not yet carried out (see loop.py)
    # the committed state as the chain of state records since the last full one: the state before the batch in
    # flight, restored when a batch fails as a whole
    chain: list = field(default_factory=list)
    next_full: bool = True         # the parts' change tracking starts from an empty base (new or restored)
    chain_start: int = 1           # lowest sequence number whose record key may still hold a record (tombstones)
    last_input: float = field(default_factory=time.monotonic)
    dirty_since_flush: bool = False
    events_in: int = 0
    wait_for_aggregates: bool = False   # wait for each DP release of the aggregates process (WorkerCore.complete)
    settings: dict = field(default_factory=dict)         # the guarantee settings in force (stream_anon.guarantees)
    settings_changes: list = field(default_factory=list)  # accepted changes not published in a manifest yet

    # -- state records ----------------------------------------------------------------------------------------
    def core_doc(self, stream: str, input_topic: str, seq: int, offset: int, flush_pending: bool,
                 dp_core: dict | None = None) -> dict:
        doc = {"version": STATE_VERSION, "stream": stream, "partition": self.partition, "seq": seq,
               "offset": offset, "input_topic": input_topic, "input_topic_id": self.input_topic_id,
               "kid": self.engine.kid, "settings": self.settings, "flush_pending": flush_pending,
               "engine": self.engine.state_core(), "written_at": time.time()}
        if self.settings_changes:
            doc["settings_changes"] = self.settings_changes
        if self.dp is not None:
            doc["dp"] = self.dp.state_core() if dp_core is None else dp_core
        return doc

    def full_tables(self) -> dict:
        """Every table of the partition in full: the engine's (``engine/``) and the aggregates'."""
        _, tables = checkpoint.full_state(self.engine)
        out = {ENGINE + name: t for name, t in tables.items()}
        if self.dp is not None:
            out.update({DP + name: t for name, t in self.dp.full_tables().items()})
        return out

    def record(self, stream: str, input_topic: str, seq: int, offset: int, flush_pending: bool = False
               ) -> checkpoint.StateRecord:
        """The record of state transaction ``seq``: the core and the tables' changes since the last committed
        record, or the tables in full when the partition was (re)opened or when the changes since the last full
        record outgrow the tables. Resets the tables' change tracking: the record must be committed
        (:meth:`note_committed`) or the partition recovered again."""
        # the aggregates' part in one piece (from the aggregates process: sent with the batch's releases)
        dp_core, dp_changes, dp_rows = self.dp.record_state() if self.dp is not None else (None, {}, 0)
        doc = self.core_doc(stream, input_topic, seq, offset, flush_pending, dp_core)
        changes = {ENGINE + name: c for name, c in checkpoint.changes(self.engine).items()}
        if dp_changes is None:          # the aggregates' changes since the last record are not known: in full
            return checkpoint.StateRecord.full_of(doc, self.full_tables())
        changes.update({DP + name: c for name, c in dp_changes.items()})
        rec = checkpoint.StateRecord(doc, changes, full=self.next_full)
        if not rec.full:
            chained = sum(r.rows for r in self.chain[1:]) + rec.rows
            if chained > checkpoint.table_rows(self.engine) + dp_rows or len(self.chain) >= MAX_CHAIN:
                rec = checkpoint.StateRecord.full_of(doc, self.full_tables())
        return rec

    def note_committed(self, rec: checkpoint.StateRecord) -> None:
        """``rec`` was committed: it is the partition's state now (as written: its encoding, made here if it was
        not, is what :meth:`committed_state` reads)."""
        checkpoint.encode_state(rec)
        self.seq, self.offset, self.flush_pending = rec.seq, rec.doc["offset"], rec.doc.get("flush_pending", False)
        if rec.full:
            self.chain = [rec]
            self.chain_start = rec.seq
        else:
            self.chain.append(rec)
        self.next_full = False

    def committed_state(self) -> tuple[dict | None, dict]:
        """(core, tables) of the last committed state ((None, {}): nothing committed)."""
        return checkpoint.resolve_chain([rec.as_written() for rec in self.chain]) if self.chain else (None, {})

    def snapshot(self, stream: str, input_topic: str) -> checkpoint.StateRecord:
        """The current state as a full record, encoded at once (the live objects change after)."""
        rec = checkpoint.StateRecord.full_of(self.core_doc(stream, input_topic, self.seq, self.offset,
                                                           self.flush_pending), self.full_tables())
        checkpoint.encode_state(rec)
        return rec


def split_tables(tables: dict) -> tuple[dict, dict]:
    """(the engine's tables, the aggregates' tables) of a partition's state, by their own names; a table of
    neither is refused (a state of another layout must not be half-read)."""
    unknown = sorted(n for n in tables if not n.startswith((ENGINE, DP)))
    if unknown:
        raise ValueError(f"partition state holds table(s) {unknown} of no part")
    return ({n[len(ENGINE):]: t for n, t in tables.items() if n.startswith(ENGINE)},
            {n[len(DP):]: t for n, t in tables.items() if n.startswith(DP)})


class ConfigChangeRefused(ValueError):
    """An accepted configuration change that the partition's state cannot be carried over (the reason says why)."""


# changes an accepted change step cannot apply to a state (the key prefix, why)
_NEVER = (("anonymization.m ", "m binds every individual's signature: changing it needs a new app id (a new state)"),
          ("dp.", "DP settings apply per period: change them with a new app id at a period boundary"),
          ("aggregates.", "DP settings apply per period: change them with a new app id at a period boundary"))
_WITH_EMPTY_BUFFER = (("quasi_identifiers.", "quasi-identifiers"), ("sensitive.", "sensitive fields"))


def check_change(changes: list[str], tables: dict) -> None:
    """Raise :class:`ConfigChangeRefused`, naming every change that cannot apply to this state: m and the DP
    settings never change in place; quasi-identifiers and sensitive fields only while no record is buffered (the
    buffer holds them coded under the old definitions)."""
    buffered = len(tables.get(ENGINE + "buffer", ((),))[0])
    refused = []
    for change in changes:
        for prefix, why in _NEVER:
            if change.startswith(prefix):
                refused.append(f"{change}: {why}")
        for prefix, what in _WITH_EMPTY_BUFFER:
            if change.startswith(prefix) and buffered:
                refused.append(f"{change}: {buffered} chunk(s) of buffered records are coded under the old {what}; "
                               "let the worker release them (--flush-when-idle) first")
    if refused:
        raise ConfigChangeRefused("; ".join(refused))


def apply_change(engine: Engine, changes: list[str]) -> None:
    """An accepted change on the restored engine (restored without its published classes: a class met the old
    rule, so none is reused under the new one): the open windows are re-windowed when ``window_s`` changed."""
    if any(c.startswith("anonymization.window_s ") for c in changes):
        engine.next_chunk = engine.windows.rewindow(engine.window_s, engine.next_chunk)


def open_partition(config, secret: bytes, partition: int, aggregates, doc: dict | None = None,
                   tables: dict | None = None, base_seq: int | None = None,
                   accepted_changes: list[str] | None = None) -> PartitionState:
    """A partition's pipeline, new (``doc`` None) or restored from a committed state (``doc``: the core of its state
    record, ``tables``: name -> (keys, rows)); ``aggregates(partition, core, tables)``: its DP aggregates or None;
    ``accepted_changes``: guarantee settings changed since the state was written, accepted by the operator
    (:func:`check_change`, :func:`apply_change`)."""
    settings = guarantees.settings(config)
    if doc is None:
        dp = aggregates(partition, None)
        engine = Engine(config, partition=partition, secret=secret, carried=dp.carried if dp else ())
        return PartitionState(partition, engine, dp, settings=settings)
    stream = config.stream.name
    if doc.get("version") != STATE_VERSION or doc.get("stream") != stream or doc.get("partition") != partition:
        raise ValueError(f"partition {partition}: state document of another stream, partition or version "
                         f"({doc.get('stream')!r}, {doc.get('partition')!r}, v{doc.get('version')!r})")
    if accepted_changes:
        check_change(accepted_changes, tables or {})
    engine_tables, dp_tables = split_tables(tables or {})
    if accepted_changes:          # every published class met the old rule: none is reused under the new one
        engine_tables.pop("published", None)
    # the recovered state stands as the committed chain (a full record of it comes next), frozen as written
    # before the engine and the aggregates are restored from (and may keep) its objects
    chain = [checkpoint.StateRecord.full_of(doc, tables or {})]
    checkpoint.encode_state(chain[0])
    # the aggregates first: which fields the engine carries depends on their restored period
    dp = aggregates(partition, doc.get("dp"), dp_tables)
    engine = Engine.restore(config, partition, secret, doc["engine"], engine_tables, dp.carried if dp else ())
    if accepted_changes:
        apply_change(engine, accepted_changes)
    ps = PartitionState(partition, engine, dp, offset=doc["offset"], seq=doc["seq"],
                        input_topic_id=doc.get("input_topic_id"), flush_pending=doc.get("flush_pending", False),
                        chain=chain, chain_start=base_seq or doc["seq"], settings=settings,
                        settings_changes=list(doc.get("settings_changes", [])) + list(accepted_changes or []))
    ps.dirty_since_flush = engine.deferred > 0      # buffered records still need an idle flush
    return ps
