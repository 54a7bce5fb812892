"""One input partition as the worker sees it: its pipeline (the engine's reader, window core, former and criteria;
the DP aggregates on the windows it closes), its position in the input, and its committed state as a chain of
state records (:mod:`stream_anon.checkpoint`).

State record of a partition: the core ``{"version", "stream", "partition", "seq", "offset", "input_topic",
"input_topic_id", "kid" (the key id of the secret it was written with), "lineage" (the stream's lineage the
partition's releases belong to, :mod:`stream_anon.kafka.lineage`), "settings" (the guarantee settings it was
written under, :mod:`stream_anon.guarantees`), "settings_changes" (accepted changes not yet in a manifest), "notes"
(what the next manifest must say: ``lineage_started``, ``key_rotated``), "flush_pending", "written_at", "engine":
<engine core>, "dp": <aggregates core>}`` and the tables ``engine/<table>``
(:meth:`stream_anon.engine.Engine.state_tables`), ``dp/<table>`` (the DP aggregates',
:class:`stream_anon.worker.aggregates.PartitionAggregates`) and ``qi/leaves`` (each hierarchy quasi-identifier's
leaves in code order, what the buffered records are coded with: :class:`stream_anon.engine.recode.QILeaves`).

An accepted configuration change (``--accept-config-change``) is applied when the partition is opened
(:func:`open_partition`): :func:`check_change` refuses what the state cannot carry, :func:`carry_dp_change` carries
a DP change into the aggregates' state (:mod:`stream_anon.dp.transition`), :func:`apply_change` re-windows and
recodes the buffered records. A key rotation (``--rotate-key``) is checked (:func:`check_rotation`) and applied
(:func:`rotate_key`) there too.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from stream_anon import checkpoint, crypto, guarantees
from stream_anon.engine import Engine
from stream_anon.engine.recode import QILeaves, recheck_sensitive, recode_buffer
from stream_anon.pipeline import WindowConsumer
from stream_anon.worker.state import MAX_CHAIN

log = logging.getLogger("stream_anon.worker")

STATE_VERSION = 4              # 4: the lineage in every state record (3: one state model, engine/ and dp/ tables)
# the parts of a partition's state record; their tables are named <part>/<table> (checkpoint.Composite's layout).
# qi: the hierarchies' leaves the buffered records are coded with (engine/recode.py)
ENGINE_PART, QI_PART, DP_PART = "engine", "qi", "dp"
ENGINE, QI, DP = (part + checkpoint.SEPARATOR for part in (ENGINE_PART, QI_PART, DP_PART))


@dataclass
class PartitionState:
    """A partition's pipeline (``engine``, ``dp``: the aggregates, None without ``[dp]``), its input position and
    its committed chain of state records."""
    partition: int
    engine: Engine
    dp: WindowConsumer | None = None    # PartitionAggregates, or RemoteAggregates (the aggregates process)
    offset: int = -1               # last input offset whose effects are in the state (-1: none)
    seq: int = 0                   # committed state transactions of this partition (0: none)
    input_topic_id: str | None = None
    flush_pending: bool = False    # a committed decision to flush, not yet carried out (see loop.py)
    flush_through: int | None = None   # the decided flush's DP clock (WorkerCore.dp_clock_through), redone the same
    # the committed state as the chain of state records since the last full one: the state before the batch in
    # flight, restored when a batch fails as a whole
    chain: list = field(default_factory=list)
    next_full: bool = True         # the parts' change tracking starts from an empty base (new or restored)
    chain_start: int = 1           # lowest sequence number whose record key may still hold a record (tombstones)
    record_parts: dict = field(default_factory=dict)   # seq -> values it was written as, of records in parts
    last_input: float = field(default_factory=time.monotonic)
    dirty_since_flush: bool = False
    events_in: int = 0
    wait_for_aggregates: bool = False   # wait for each DP release of the aggregates process (WorkerCore.complete)
    settings: dict = field(default_factory=dict)         # the guarantee settings in force (stream_anon.guarantees)
    settings_changes: list = field(default_factory=list)  # accepted changes not published in a manifest yet
    leaves: QILeaves | None = None      # the hierarchies' leaves in code order (None: from the engine's config)
    lineage: str | None = None          # the stream's lineage of this partition's releases
    notes: dict = field(default_factory=dict)     # for the next manifest (lineage_started, key_rotated)

    def __post_init__(self):
        if self.leaves is None:
            self.leaves = QILeaves(self.engine.space)

    # -- state records ----------------------------------------------------------------------------------------
    def core_doc(self, stream: str, input_topic: str | None, seq: int, offset: int, flush_pending: bool,
                 dp_core: dict | None = None) -> dict:
        doc = {"version": STATE_VERSION, "stream": stream, "partition": self.partition, "seq": seq,
               "offset": offset, "input_topic": input_topic, "input_topic_id": self.input_topic_id,
               "kid": self.engine.kid, "lineage": self.lineage, "settings": self.settings,
               "flush_pending": flush_pending, "engine": self.engine.state_core(), "written_at": time.time()}
        if flush_pending and self.flush_through is not None:
            doc["flush_through"] = self.flush_through
        if self.settings_changes:
            doc["settings_changes"] = self.settings_changes
        if self.notes:
            doc["notes"] = self.notes
        if self.dp is not None:
            doc["dp"] = self.dp.state_core() if dp_core is None else dp_core
        return doc

    def local_parts(self) -> checkpoint.Composite:
        """The parts whose state lives in this process as one Checkpointable: the engine and the hierarchies'
        leaves (tables ``engine/...``, ``qi/...``). The DP aggregates' part comes in one piece (``dp/...``,
        :meth:`record`): they may live in another process."""
        assert self.leaves is not None          # set in __post_init__
        return checkpoint.Composite({ENGINE_PART: self.engine, QI_PART: self.leaves})

    def full_tables(self) -> dict:
        """Every table of the partition in full: the engine's (``engine/``), the leaves' (``qi/``) and the
        aggregates' (``dp/``)."""
        _, out = checkpoint.full_state(self.local_parts())
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
        local = self.local_parts()
        changes = checkpoint.changes(local)
        if dp_changes is None:          # the aggregates' changes since the last record are not known: in full
            return checkpoint.StateRecord.full_of(doc, self.full_tables())
        changes.update({DP + name: c for name, c in dp_changes.items()})
        rec = checkpoint.StateRecord(doc, changes, full=self.next_full)
        if not rec.full:
            chained = sum(r.rows for r in self.chain[1:]) + rec.rows
            if chained > checkpoint.table_rows(local) + dp_rows \
                    or len(self.chain) >= MAX_CHAIN:
                rec = checkpoint.StateRecord.full_of(doc, self.full_tables())
        return rec

    def note_committed(self, rec: checkpoint.StateRecord, parts: int = 1) -> None:
        """``rec`` was committed (written as ``parts`` state-topic values): it is the partition's state now (as
        written: its encoding, made here if it was not, is what :meth:`committed_state` reads)."""
        checkpoint.encode_state(rec)
        self.seq, self.offset, self.flush_pending = rec.seq, rec.doc["offset"], rec.doc.get("flush_pending", False)
        self.flush_through = rec.doc.get("flush_through") if self.flush_pending else None
        if rec.full:
            self.chain = [rec]
            self.chain_start = rec.seq
            self.record_parts = {}
        else:
            self.chain.append(rec)
        if parts > 1:               # the keys its chain's tombstones must reach
            self.record_parts[rec.seq] = parts
        self.next_full = False

    def committed_state(self) -> tuple[dict | None, dict]:
        """(core, tables) of the last committed state ((None, {}): nothing committed)."""
        return checkpoint.resolve_chain([rec.as_written() for rec in self.chain]) if self.chain else (None, {})

    def snapshot(self, stream: str, input_topic: str | None) -> checkpoint.StateRecord:
        """The current state as a full record, encoded at once (the live objects change after)."""
        rec = checkpoint.StateRecord.full_of(self.core_doc(stream, input_topic, self.seq, self.offset,
                                                           self.flush_pending), self.full_tables())
        checkpoint.encode_state(rec)
        return rec


def split_tables(tables: dict) -> tuple[dict, dict, dict]:
    """(the engine's tables, the aggregates' tables, the hierarchies' leaves) of a partition's state, by their own
    names; a table of none is refused (a state of another layout must not be half-read)."""
    unknown = sorted(n for n in tables if not n.startswith((ENGINE, DP, QI)))
    if unknown:
        raise ValueError(f"partition state holds table(s) {unknown} of no part")
    engine, dp, qi = ({n[len(prefix):]: t for n, t in tables.items() if n.startswith(prefix)}
                      for prefix in (ENGINE, DP, QI))
    return engine, dp, qi


class ConfigChangeRefused(ValueError):
    """An accepted configuration change that the partition's state cannot be carried over (the reason says why)."""


# changes an accepted change step cannot apply to a state (the key prefix, why); DP settings:
# stream_anon.dp.transition
_NEW_STATE = "a new app id and --new-lineage: docs/operations.md, Lineage"
_NEVER = (("anonymization.m ", f"m binds every individual's signature: changing it needs a new state ({_NEW_STATE})"),
          ("stream.privacy_unit ", f"k, the m-invariance signatures and the DP ledgers count individuals of the unit "
                                   f"the state was written under: another unit needs a new state ({_NEW_STATE})"),
          ("stream.event_time ", f"the state's windows, watermark and DP periods are of the old event time: another "
                                 f"needs a new state ({_NEW_STATE})"),
          ("input.", f"each event's id (its audit token and duplicate key), unit and values are read through the "
                     f"mapping, and the audit reads the raw topic through one mapping per lineage: another mapping "
                     f"needs a new state ({_NEW_STATE})"))
_WITH_M = (("sensitive.invariant ", f"with m the invariant is what every signature is made of: another needs a new "
                                    f"state ({_NEW_STATE})"),)
# settings a state lacks when it was written before they were recorded (it then lacks stream.privacy_unit): their
# "(absent)" side is no value that changed
_FIRST_RECORDED = ("stream.", "input.", "anonymization.strategy")
_WITH_EMPTY_BUFFER = (("quasi_identifiers.", "quasi-identifiers"), ("sensitive.", "sensitive fields"))
_RECODED = "sensitive.domains."        # and a hierarchy whose old leaves the state holds (recodable_hierarchies)


def recodable_hierarchies(config, tables: dict) -> dict[str, int]:
    """Quasi-identifier name -> its code's dimension, for each hierarchy quasi-identifier whose old leaves the state
    holds (``qi/leaves``): its buffered records can be recoded under a new hierarchy (engine/recode.py)."""
    keys = tables.get(QI + "leaves", ((),))[0]
    saved = {int(k) for k in keys}
    out, d = {}, 0
    for q in config.quasi_identifiers:
        if q.kind in ("categorical", "station") and d in saved:
            out[q.name] = d
        d += q.dims
    return out


def check_change(changes: list[str], tables: dict, old: dict | None = None, new: dict | None = None,
                 recodable: tuple = ()) -> None:
    """Raise :class:`ConfigChangeRefused`, naming every change that cannot apply to this state: m, the privacy unit,
    the event time and the input mapping never change in place (nor, with m, the invariant), nor the DP settings that
    fix which releases the ledger charges together
    (:func:`stream_anon.dp.transition.refusals`; ``old``, ``new``: the settings before and after); quasi-identifiers
    and sensitive fields only while no record is buffered (the buffer holds them coded under the old
    definitions), except the changes of ``recodable`` keys (a hierarchy or a sensitive domain: the buffered records
    are recoded, :func:`apply_change`)."""
    from stream_anon.dp import transition      # here: stream_anon.dp loads diffprivlib, only streams with [dp] need it
    old, new = old or {}, new or {}
    buffered = len(tables.get(ENGINE + "buffer", ((),))[0])
    refused = transition.refusals(changes, old, new)
    never = _NEVER + (_WITH_M if old.get("anonymization.m") is not None or new.get("anonymization.m") is not None
                      else ())
    for change in changes:
        if _first_recorded(change, old):
            continue
        for prefix, why in never:
            if change.startswith(prefix):
                refused.append(f"{change}: {why}")
        if change.startswith(_RECODED) or change.split(" ", 1)[0] in recodable:
            continue
        for prefix, what in _WITH_EMPTY_BUFFER:
            if change.startswith(prefix) and buffered:
                refused.append(f"{change}: {buffered} chunk(s) of buffered records are coded under the old {what}; "
                               "let the worker release them (--flush-when-idle) first")
    if refused:
        raise ConfigChangeRefused("; ".join(refused))


def _first_recorded(change: str, old: dict) -> bool:
    """A setting the state was written before recording (:data:`_FIRST_RECORDED`), now recorded: no change."""
    key, rest = change.split(" ", 1)
    return rest.startswith("(absent) -> ") and key.startswith(_FIRST_RECORDED) and "stream.privacy_unit" not in old


class KeyRotationRefused(ValueError):
    """A key rotation the partition's state cannot take now (the reason says why and what to do)."""


def _rows(tables: dict, name: str) -> int:
    return len(tables.get(name, ((),))[0])


def check_rotation(config, doc: dict, tables: dict) -> None:
    """Raise :class:`KeyRotationRefused` unless nothing of the state is keyed by the old secret in a way the new one
    would contradict: no buffered record and no open window (their unit ids and audit tokens are the old key's;
    counted together with the new key's, one individual would count as two), no m-invariance signature (bound to
    the old unit ids for good: a new lineage instead), and, with DP periods, the aggregates' period over (their
    per-unit window counts are the old key's: the new one would give each unit its windows again)."""
    refused = []
    for name, what in ((ENGINE + "buffer", "chunk(s) of buffered records"), (ENGINE + "windows", "open window(s)")):
        if _rows(tables, name):
            refused.append(f"{_rows(tables, name)} {what} under the old key: let the worker release them "
                           "(--flush-when-idle) before rotating")
    signatures = _rows(tables, ENGINE + "former/signatures")
    if signatures:
        refused.append(f"m-invariance signatures of {signatures} individuals are bound to the old key's unit ids: "
                       "a new key needs a new lineage (--new-lineage, docs/operations.md)")
    dp = config.dp
    period = ((doc.get("dp") or {}).get("aggregator") or {}).get("period")
    closed_until = (doc.get("engine") or {}).get("closed_until")
    if dp is not None and dp.clock is not None and period is not None and closed_until is not None:
        upcoming = dp.clock.period_of(int(closed_until // config.anonymization.window_s))[0]
        if upcoming == period:
            refused.append(f"DP period {period} is still open (released up to window end {closed_until:.0f}): "
                           "rotate at a period boundary")
    if refused:
        raise KeyRotationRefused("; ".join(refused))


def rotate_key(tables: dict) -> dict:
    """The state's tables under a new key (:func:`check_rotation` passed): the duplicate table (keyed by the old
    key's event hashes) and the finished DP period's per-unit windows are dropped. A copy of an event released
    before is then late (every released event's time is below the end of the last release), so it still ends in
    one place (suppressed as ``late``, or under ``late_policy = "next_release"`` published again)."""
    return {n: t for n, t in tables.items() if n not in (ENGINE + "seen_events", DP + "aggregator/unit_windows")}


def carry_dp_change(dp_core: dict | None, old: dict, new: dict, changes: list[str]) -> dict | None:
    """The aggregates' saved core with an accepted DP change carried into it (:mod:`stream_anon.dp.transition`):
    the settings in force until the current period ends, and the change each aggregate's next release states (every
    row of it: each value cut to 80 characters)."""
    from stream_anon.dp import transition
    short = {line.split(" ", 1)[0]: line for line in guarantees.changes(old, new, width=80)}
    changes = [short.get(c.split(" ", 1)[0], c) for c in changes]
    mine = transition.dp_changes(changes)
    if dp_core is None or not mine:
        return dp_core
    aggregator = dict(dp_core["aggregator"])
    if aggregator.get("period") is not None:          # nothing was released yet: the new settings hold at once
        aggregator["carry"] = transition.carry(old, new, changes, aggregator.get("carry"))
    names = {k.split(".")[1] for k in new if k.startswith("aggregates.")}
    announce = aggregator.get("announce", {})
    aggregator["announce"] = {n: list(announce.get(n, [])) + mine for n in sorted(names)}
    return {**dp_core, "aggregator": aggregator}


def apply_change(engine: Engine, changes: list[str], leaves: QILeaves | None = None,
                 recodable: dict[str, int] | None = None) -> None:
    """An accepted change on the restored engine (restored without its published classes: a class met the old
    rule, so none is reused under the new one): the open windows are re-windowed when ``window_s`` changed; the
    buffered records are recoded under a changed hierarchy (``leaves``: the saved leaves; ``recodable``: the
    hierarchy quasi-identifiers' dimensions) and re-checked under a changed sensitive domain (engine/recode.py)."""
    keys = [c.split(" ", 1)[0] for c in changes]
    if "anonymization.window_s" in keys:
        engine.next_chunk = engine.windows.rewindow(engine.window_s, engine.next_chunk)
    dims = [d for q, d in (recodable or {}).items() if f"quasi_identifiers.{q}.hierarchy" in keys]
    if dims:
        if leaves is None:
            raise ValueError("recoding the buffer under a changed hierarchy needs the saved leaves")
        missing = {d: 1.0 - len(leaves.saved[d]) for d in dims}        # 0 - width, the width n - 1 (space.py)
        lost = recode_buffer(engine, leaves.saved, missing, dims)
        if lost:
            log.warning("%d buffered record(s) hold a leaf the new hierarchy lacks: coded as missing (published "
                        "as *)", lost)
    fields = [k[len(_RECODED):] for k in keys if k.startswith(_RECODED)]
    if fields:
        nulled = recheck_sensitive(engine, fields)
        if nulled:
            log.warning("%d buffered sensitive value(s) outside the new domain: published as null", nulled)


def open_partition(config, secret: bytes, partition: int, aggregates, doc: dict | None = None,
                   tables: dict | None = None, base_seq: int | None = None,
                   accepted_changes: list[str] | None = None, lineage: str | None = None,
                   notes: dict | None = None, rotated_from: str | None = None) -> PartitionState:
    """A partition's pipeline, new (``doc`` None: in ``lineage``) or restored from a committed state (``doc``: the
    core of its state record, ``tables``: name -> (keys, rows); its lineage is the state's);
    ``aggregates(partition, core, tables, lineage)``: its DP aggregates or None; ``accepted_changes``: guarantee
    settings changed since the state was written, accepted by the operator (:func:`check_change`,
    :func:`apply_change`); ``notes``: for the next release manifest (``lineage_started``, ``key_rotated``);
    ``rotated_from``: the key id the state was written with, rotated to ``secret``'s (:func:`check_rotation`)."""
    settings = guarantees.settings(config)
    if doc is None:
        dp = aggregates(partition, None, None, lineage)
        engine = Engine(config, partition=partition, secret=secret, carried=dp.carried if dp else (),
                        lineage=lineage)
        return PartitionState(partition, engine, dp, settings=settings, lineage=lineage, notes=dict(notes or {}))
    stream = config.stream.name
    if doc.get("version") != STATE_VERSION or doc.get("stream") != stream or doc.get("partition") != partition:
        raise ValueError(f"partition {partition}: state document of another stream, partition or version "
                         f"({doc.get('stream')!r}, {doc.get('partition')!r}, v{doc.get('version')!r})")
    dp_core = doc.get("dp")
    recodable = recodable_hierarchies(config, tables or {})
    if accepted_changes:
        check_change(accepted_changes, tables or {}, doc.get("settings", {}), settings,
                     tuple(f"quasi_identifiers.{q}.hierarchy" for q in recodable))
        dp_core = carry_dp_change(dp_core, doc.get("settings", {}), settings, accepted_changes)
    if rotated_from is not None:
        check_rotation(config, doc, tables or {})
        tables = rotate_key(tables or {})
        notes = {**(notes or {}), "key_rotated": {"from": rotated_from, "to": crypto.key_id(secret)}}
    engine_tables, dp_tables, qi_tables = split_tables(tables or {})
    if accepted_changes:          # every published class met the old rule: none is reused under the new one
        engine_tables.pop("published", None)
    # the recovered state stands as the committed chain (a full record of it comes next), frozen as written
    # before the engine and the aggregates are restored from (and may keep) its objects
    chain = [checkpoint.StateRecord.full_of(doc, tables or {})]
    checkpoint.encode_state(chain[0])
    # the aggregates first: which fields the engine carries depends on their restored period
    lineage = doc.get("lineage")
    dp = aggregates(partition, dp_core, dp_tables, lineage)
    engine = Engine.restore(config, partition, secret, doc["engine"], engine_tables, dp.carried if dp else (),
                            lineage=lineage)
    leaves = QILeaves(engine.space)
    leaves.load_state({}, qi_tables)
    if accepted_changes:
        apply_change(engine, accepted_changes, leaves, recodable)
    ps = PartitionState(partition, engine, dp, offset=doc["offset"], seq=doc["seq"],
                        input_topic_id=doc.get("input_topic_id"), flush_pending=doc.get("flush_pending", False),
                        flush_through=doc.get("flush_through") if doc.get("flush_pending") else None,
                        chain=chain, chain_start=base_seq or doc["seq"], settings=settings,
                        settings_changes=list(doc.get("settings_changes", [])) + list(accepted_changes or []),
                        leaves=leaves, lineage=lineage, notes={**doc.get("notes", {}), **(notes or {})})
    ps.dirty_since_flush = engine.deferred > 0      # buffered records still need an idle flush
    if accepted_changes:
        # a batch that fails is retried from the committed chain: it must hold the state as changed (the carried
        # DP settings, the retired classes, the recoded buffer), not as it was before the change
        ps.chain = [ps.snapshot(stream, doc.get("input_topic"))]
    return ps
