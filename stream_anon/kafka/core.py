"""The worker's core, without faust or a Kafka client: a partition's batch of input messages in, the output
messages and the partition's new state out (:mod:`stream_anon.kafka.loop` moves them through Kafka in one
transaction; tests and benchmarks drive the core directly).

One :class:`~stream_anon.engine.Engine` per input partition (a release is one window's output of one partition).
Per batch of one partition, in offset order: offsets at or below the partition's state are skipped (already
processed); size, JSON, kind and schema checks, then the engine's reader (event type, privacy unit, time,
quasi-identifiers) -> dead letters with a reason; the records go to the engine; the output is every release's
records (``anon.<stream>.records``, key release_id), its manifest (``anon.releases``), a release metric and alerts
(``anon.metrics``), the dead letters (``anon.deadletter``) and, for streams with DP aggregates, the rows of the
windows the engine closed (``anon.aggregates``). The output is a function of the partition's state and its input
messages only (not of how they were cut into batches), so re-processing after a failure reproduces it exactly.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import orjson

from stream_anon import crypto
from stream_anon.checkpoint import SEPARATOR
from stream_anon.contract import topics
from stream_anon.engine import Engine, get_path
from stream_anon.events import schema_ok_batch, schema_reason
from stream_anon.inputs import Decoder
from stream_anon.engine.carried import plain_values
from stream_anon.engine.state import compose_state
from stream_anon.kafka import aggregates
from stream_anon.kafka import state as st

log = logging.getLogger("stream_anon.worker")

TOPICS = topics()           # the topic contract (topics/topics.toml), shipped inside the package
LAG_NOTE = ("approximate: computed from the consumed position and the broker's reported end offset, which the "
            "Tansu broker under-reports for multi-record batches")
STATE_VERSION = 3              # 3: the DP state as Checkpointable parts, its tables named dp/<part>/<table>
BISECT_MAX_DEPTH = 16          # a failing batch is split at most this deep before its events are dead-lettered
DEADLETTER_PAYLOAD_MAX = 4096   # characters of an oversized payload kept in its dead letter


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def dumps(obj) -> bytes:
    """Output serialization: orjson (compact UTF-8, numpy scalars and arrays natively; ~5x faster than json.dumps
    on the record path)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)



class AlertLog:
    """WARNING lines for release alerts, at most one per alert name every ``interval_s`` seconds; the lines held
    back are counted into the next one (``+N more since the last line``)."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s = interval_s
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def warn(self, name: str, msg: str, *args) -> bool:
        now = time.monotonic()
        if now - self.last.get(name, float("-inf")) < self.interval_s:
            self.held[name] = self.held.get(name, 0) + 1
            return False
        more = self.held.pop(name, 0)
        self.last[name] = now
        log.warning("alert %s: " + msg + (f" (+{more} more since the last line)" if more else ""), name, *args)
        return True


# --------------------------------------------------------------------------------------------- input checks
def check_payload(raw: bytes | None, config) -> tuple[str | None, dict | None]:
    """(reason, None) for bad input, (None, event) for an event the engine's reader may see: size, JSON, kind and
    the kind's schema. Event type, privacy unit, time and quasi-identifiers are checked once, by the reader
    (:class:`stream_anon.engine.RecordReader`). Never raises: an exception while checking one payload is its
    reason (``unreadable payload: <exception class>``)."""
    reason, event = parse_payload(raw, config)
    return (reason, None) if reason else check_payload_schema(event, config)


def check_payloads(raws: list, config) -> list[tuple[str | None, dict | None]]:
    """:func:`check_payload` of each payload of a batch; the schema is checked a field at a time over the batch's
    parsed events (:func:`stream_anon.events.schema_ok_batch`), and event by event only when that check fails."""
    parsed = [parse_payload(raw, config) for raw in raws]
    events = [e for r, e in parsed if r is None]
    try:
        all_valid = schema_ok_batch(events, config.stream.kind)
    except Exception:   # noqa: BLE001 - the per-event checks decide (and name the reason)
        all_valid = False
    if all_valid:
        return parsed
    return [(r, e) if r is not None else check_payload_schema(e, config) for r, e in parsed]


def check_payload_schema(event: dict, config) -> tuple[str | None, dict | None]:
    """The schema part of :func:`check_payload` for a parsed event; never raises."""
    try:
        reason = schema_reason(event, config.stream.kind)
    except Exception as exc:   # noqa: BLE001
        return f"unreadable payload: {type(exc).__name__}", None
    return (f"schema: {reason}", None) if reason else (None, event)


def parse_payload(raw: bytes | None, config) -> tuple[str | None, dict | None]:
    """Size, JSON, object and kind of a payload (the checks before the schema); never raises."""
    try:
        return _parse_payload(raw, config)
    except Exception as exc:   # noqa: BLE001 - one message never stops the partition
        return f"unreadable payload: {type(exc).__name__}", None


def _parse_payload(raw: bytes | None, config) -> tuple[str | None, dict | None]:
    if raw is None:
        return "empty payload", None
    limit = config.limits.max_event_bytes
    if len(raw) > limit:
        return f"oversized payload: {len(raw)} bytes > limit {limit}", None
    try:
        event = orjson.loads(raw)     # strict RFC 8259: NaN/Infinity literals are malformed input, not numbers
    except (UnicodeDecodeError, ValueError) as exc:
        return f"malformed JSON: {exc}", None
    if not isinstance(event, dict):
        return f"malformed event: expected a JSON object, got {type(event).__name__}", None
    kind = config.stream.kind
    if event.get("kind") != kind:
        return f"wrong kind: {event.get('kind')!r} on a {kind} stream", None
    return None, event


# --------------------------------------------------------------------------------------------- partition state
@dataclass
class PartitionState:
    partition: int
    engine: Engine
    dp: object = None              # stream_anon.kafka.aggregates.PartitionAggregates when the stream has [dp]
    offset: int = -1               # last input offset whose effects are in the state (-1: none)
    seq: int = 0                   # committed state transactions of this partition (0: none)
    input_topic_id: str | None = None
    flush_pending: bool = False    # a committed decision to flush, not yet carried out (see loop.py)
    # the committed state as the chain of state records since the last full one (kafka/state.py): the state
    # before the batch in flight, restored when a batch fails as a whole
    chain: list = field(default_factory=list)
    next_full: bool = True         # the engine's change tracking starts from an empty base (new or restored)
    chain_start: int = 1           # lowest sequence number whose record key may still hold a record (tombstones)
    last_input: float = field(default_factory=time.monotonic)
    dirty_since_flush: bool = False
    events_in: int = 0
    wait_for_aggregates: bool = False   # wait for each DP release of the aggregates process (see complete())


@dataclass
class BatchOutput:
    """What one partition batch produces: messages, the new last input offset, counters."""
    messages: list
    last_offset: int
    counts: dict
    engine_input: bool = False
    releases: list = field(default_factory=list)
    # DP rows still being released by the aggregates process: (position in messages, Pending), for
    # WorkerCore.complete
    pending: list = field(default_factory=list)


class WorkerCore:
    """Everything the worker does between reading input and writing output, for the partitions it owns."""

    def __init__(self, config, app_id: str, secret: bytes, flush_when_idle_s: float | None = None,
                 raw_deadletters: bool = False, aggregates_process: bool = False, aggregates_setup=None,
                 aggregates_serve=None):
        self.config = config
        self.app_id = app_id
        self.secret = secret
        self.kid = crypto.key_id(secret)          # published with releases and dead letters (secret rotation)
        self.flush_when_idle_s = flush_when_idle_s
        self.raw_deadletters = raw_deadletters     # opt-in: keep payloads that are not JSON objects verbatim
        self.stream = config.stream.name
        self.topic = config.stream.input_topic
        self.parts: dict[int, PartitionState] = {}
        self.stats = {"events_in": 0, "skipped": 0, "dead_letters": 0, "releases": 0, "published": 0,
                      "suppressed": 0, "aggregate_rows": 0, "batches": 0, "started": time.time()}
        self.by_reason = {"suppressed": {}, "dead_letters": {}}   # counters by reason (metrics)
        self.last_release: dict[int, dict] = {}                  # partition -> figures of its latest release
        self.alerts: dict[str, int] = {}                         # alert name -> times raised
        self._last_metric = (time.monotonic(), 0)
        self.alert_log = AlertLog()
        # [input] mapping (stream_anon.inputs); None: the built-in JSON shape, checked by check_payload
        self.decoder = None if config.input.legacy else Decoder(config.input, config.limits.max_event_bytes)
        # the DP aggregates in a child process (stream_anon.kafka.aggregates_process); their rows are then collected
        # by complete() before a batch's output is written
        self.aggregates_process = None
        if aggregates_process and config.dp is not None and config.dp.aggregates:
            from stream_anon.kafka.aggregates_process import AggregatesProcess
            self.aggregates_process = AggregatesProcess(config, secret, dumps, setup=aggregates_setup,
                                                        serve=aggregates_serve)

    # ---- partitions
    def open_partition(self, partition: int, doc: dict | None = None, tables: dict | None = None,
                       base_seq: int | None = None) -> PartitionState:
        """The partition's state from a committed state (``doc``: the core of :meth:`state_record`, ``tables``:
        name -> (keys, rows), as :func:`stream_anon.kafka.state.resolve_chain` gives them), or a new one."""
        if doc is None:
            dp = self._aggregates(partition, None)
            engine = Engine(self.config, partition=partition, secret=self.secret, carried=dp.carried if dp else ())
            ps = PartitionState(partition, engine)
            ps.dp = dp
        else:
            if doc.get("version") != STATE_VERSION or doc.get("stream") != self.stream \
                    or doc.get("partition") != partition:
                raise ValueError(f"partition {partition}: state document of another stream, partition or version "
                                 f"({doc.get('stream')!r}, {doc.get('partition')!r}, v{doc.get('version')!r})")
            tables = tables or {}
            # the recovered state stands as the committed chain (a full record of it comes next), frozen as
            # written before the engine and the aggregates are restored from (and may keep) its objects
            chain = [st.StateRecord.full_of(doc, tables)]
            st.encode_state(chain[0])
            # the aggregates first: they name the fields the engine carries to the closed windows
            dp = self._aggregates(partition, doc.get("dp"), dp_tables(tables))
            engine = Engine.restore(self.config, partition, self.secret, doc["engine"], engine_tables(tables),
                                    dp.carried if dp else ())
            ps = PartitionState(partition, engine, offset=doc["offset"], seq=doc["seq"],
                                input_topic_id=doc.get("input_topic_id"), flush_pending=doc.get("flush_pending",
                                                                                                  False))
            ps.dp = dp
            ps.chain = chain
            ps.chain_start = base_seq or doc["seq"]
            ps.dirty_since_flush = engine.deferred > 0      # buffered records still need an idle flush
        self.parts[partition] = ps
        return ps

    def _aggregates(self, partition: int, core: dict | None, tables: dict | None = None):
        """The partition's DP aggregates (None without ``[dp]``): new, or from their core and their own tables."""
        if self.config.dp is None or not self.config.dp.aggregates:
            return None
        if self.aggregates_process is not None:
            return self.aggregates_process.open(self.config, partition, core, tables)
        dp = aggregates.PartitionAggregates(self.config, partition, self.secret)
        if core is not None:
            dp.load_state(core, tables or {})
        return dp

    def close_partition(self, partition: int) -> None:
        ps = self.parts.pop(partition, None)
        if ps is not None and self.aggregates_process is not None and ps.dp is not None:
            ps.dp.close()

    def close(self) -> None:
        """Stop the aggregates process, if any (the worker's end)."""
        if self.aggregates_process is not None:
            self.aggregates_process.close()

    def _core_doc(self, ps: PartitionState, seq: int, offset: int, flush_pending: bool,
                  dp_core: dict | None = None) -> dict:
        doc = {"version": STATE_VERSION, "stream": self.stream, "partition": ps.partition, "seq": seq,
               "offset": offset, "input_topic": self.topic, "input_topic_id": ps.input_topic_id,
               "flush_pending": flush_pending, "engine": ps.engine.state_core(raw_json=True),
               "written_at": time.time()}
        if ps.dp is not None:
            doc["dp"] = ps.dp.state_core() if dp_core is None else dp_core
        return doc

    def state_record(self, ps: PartitionState, seq: int, offset: int, flush_pending: bool = False
                     ) -> st.StateRecord:
        """The record of the partition's state for state transaction ``seq`` (kafka/state.py): the core, and the
        keyed tables' changes since the last committed record, or the tables in full when the partition was
        (re)opened or when the changes since the last full record outgrow the tables. Resets the tables' change
        tracking: the record must be committed (:meth:`note_committed`) or the partition recovered again."""
        # the aggregates' part in one piece (from the aggregates process: sent with the batch's releases)
        dp_core, dp_changes, dp_rows = ps.dp.record_state() if ps.dp is not None else (None, {}, 0)
        doc = self._core_doc(ps, seq, offset, flush_pending, dp_core)
        changes = st.changes_by_table(ps.engine.state_changes())
        changes.update(as_dp_tables(dp_changes or {}))
        rec = st.StateRecord(doc, changes, full=ps.next_full)
        if dp_changes is None:          # the aggregates' changes since the last record are not known: in full
            rec = st.StateRecord.full_of(doc, self.state_tables(ps))
        elif not rec.full:
            chained = sum(r.rows for r in ps.chain[1:]) + rec.rows
            if chained > ps.engine.table_rows() + dp_rows or len(ps.chain) >= st.MAX_CHAIN:
                rec = st.StateRecord.full_of(doc, self.state_tables(ps))
        return rec

    def state_tables(self, ps: PartitionState) -> dict:
        """Every keyed table of the partition in full: the engine's and the DP aggregates' (``dp/`` names)."""
        tables = dict(ps.engine.state_tables())
        if ps.dp is not None:
            tables.update(as_dp_tables(ps.dp.full_tables()))
        return tables

    def note_committed(self, ps: PartitionState, rec: st.StateRecord) -> None:
        """``rec`` was committed: it is the partition's state now (as written: its encoding, made here if it was
        not, is what :meth:`committed_state` reads; the core's lists may be the engine's own, growing in place)."""
        st.encode_state(rec)
        ps.seq, ps.offset, ps.flush_pending = rec.seq, rec.doc["offset"], rec.doc.get("flush_pending", False)
        if rec.full:
            ps.chain = [rec]
        else:
            ps.chain.append(rec)
        ps.next_full = False
        if rec.full:
            ps.chain_start = rec.seq

    def committed_state(self, ps: PartitionState) -> tuple[dict | None, dict]:
        """(core, tables) of the partition's last committed state ((None, {}): nothing committed)."""
        return st.resolve_chain([rec.as_written() for rec in ps.chain]) if ps.chain else (None, {})

    def committed_doc(self, ps: PartitionState) -> dict | None:
        """The last committed state as one JSON-able document (the engine's tables inside ``engine``), for tests
        and tools."""
        return composed_doc(*self.committed_state(ps))

    # ---- outputs
    def _deadletter_doc(self, reason, partition, offset, raw: bytes | None = None,
                        event: dict | None = None, index: int | None = None,
                        opaque: bool = False) -> tuple[str, bytes, bytes]:
        """A dead letter: reason, source coordinates, the event's audit token when it has an event id, and the
        payload with the identifier fields (privacy unit, ``identifiers.pseudonymize``) replaced by their keyed
        pseudonyms and ``identifiers.drop`` removed. A payload that is not a JSON object cannot be searched for
        identifiers: it is withheld (size and digest only) unless ``raw_deadletters`` was asked for."""
        doc = {"reason": reason, "stream": self.stream,
               "source": {"topic": self.topic, "partition": partition, "offset": offset},
               "received_at": _now_iso(), "kid": self.kid}
        if index is not None:       # the event's position inside a multi-event message (stream_anon.inputs)
            doc["source"]["index"] = index
        if event is None and raw is not None and not opaque:   # opaque: a mapped format's raw message is never
            # searched for identifiers (its fields are not the engine's): withheld unless raw_deadletters
            try:
                event = orjson.loads(raw)
            except ValueError:
                event = None
        if isinstance(event, dict):
            eid = event.get("event_id")
            if isinstance(eid, str) and eid:
                try:    # the event's audit token: dead letters are accounted for like published records
                    doc["audit_token"] = crypto.audit_token(self.secret, eid)
                except UnicodeEncodeError:
                    pass
            try:
                text = orjson.dumps(self._redact(event), default=str).decode()
            except Exception as exc:   # noqa: BLE001 - e.g. nested deeper than the encoder allows
                text = None
                doc["payload_withheld"] = f"cannot be redacted: {type(exc).__name__}"
                if raw is not None:
                    doc["payload_bytes"] = len(raw)
                    doc["payload_sha256"] = hashlib.sha256(raw).hexdigest()
        elif self.raw_deadletters and raw is not None:
            text = raw.decode("utf-8", errors="replace")
        else:
            text = None
            if raw is not None:
                doc["payload_withheld"] = ("raw message of a mapped input: identifiers cannot be located" if opaque
                                           else "not a JSON object: identifiers cannot be located")
                doc["payload_bytes"] = len(raw)
                doc["payload_sha256"] = hashlib.sha256(raw).hexdigest()
        if text is not None:
            doc["payload"] = text[:DEADLETTER_PAYLOAD_MAX]
            if len(text) > DEADLETTER_PAYLOAD_MAX:
                doc["payload_truncated"] = True
                doc["payload_bytes"] = len(raw) if raw is not None else len(text)
        return TOPICS.deadletter, self.stream.encode(), dumps(doc)

    def _redact(self, event: dict) -> dict:
        event = copy.deepcopy(event)
        ids = self.config
        for path in ids.identifiers:
            parent, _, leaf = path.rpartition(".")
            holder = get_path(event, parent) if parent else event
            if not isinstance(holder, dict) or leaf not in holder:
                continue
            if path in ids.drop:
                del holder[leaf]
            else:
                holder[leaf] = "pseudonym:" + crypto.pseudonym(self.secret, str(holder[leaf]))[:20]
        return event

    def _release_docs(self, rel) -> tuple[list[tuple[str, bytes, bytes]], dict]:
        """(messages to produce, counters) for one release: records, manifest, release metric, alert."""
        key = rel.release_id.encode()
        topic = TOPICS.records(self.stream)
        out = [(topic, key, payload) for payload in rel.record_payloads(dumps)]
        manifest = rel.manifest()
        out.append((TOPICS.releases, key, dumps(manifest)))
        metric = {"type": "release", "stream": self.stream, "partition": rel.partition, "ts": _now_iso(),
                  "release_id": rel.release_id, "seq": manifest.get("seq"), "published": manifest.get("published"),
                  "suppressed": manifest.get("suppressed"), "deferred": manifest.get("deferred"),
                  "ncp_mean": manifest.get("ncp_mean"), "suppression_ratio": manifest.get("suppression_ratio"),
                  "late": getattr(rel, "late", 0)}     # late events this release handled (stream_anon.engine)
        if "m" in manifest:     # m-invariance: counterfeit counts, as in the manifest (never which records)
            metric.update({name: manifest[name] for name in ("m", "counterfeit_individuals", "counterfeit_records")})
        out.append((TOPICS.metrics, self.stream.encode(), dumps(metric)))
        if manifest.get("suppression_limit_exceeded"):
            self.alerts["suppression_limit_exceeded"] = self.alerts.get("suppression_limit_exceeded", 0) + 1
            alert = {"type": "alert", "stream": self.stream, "partition": rel.partition, "ts": _now_iso(),
                     "alert": "suppression_limit_exceeded", "release_id": rel.release_id,
                     "suppression_ratio": manifest.get("suppression_ratio"),
                     "limit": self.config.anonymization.max_suppression_ratio}
            out.append((TOPICS.metrics, self.stream.encode(), dumps(alert)))
            self.alert_log.warn("suppression_limit_exceeded", "stream %s partition %s release %s: %.1f%% of its "
                                "records suppressed (limit %.1f%%): %s", self.stream, rel.partition,
                                rel.release_id, 100 * (manifest.get("suppression_ratio") or 0),
                                100 * self.config.anonymization.max_suppression_ratio, manifest.get("suppressed"))
        lossy = (manifest.get("suppressed") or {}).get("class_loss_above_limit")
        if lossy:
            self.alert_log.warn("loss_limit", "stream %s partition %s release %s: %s records suppressed because "
                                "their class's NCP was above max_class_ncp %.3g", self.stream, rel.partition,
                                rel.release_id, lossy, self.config.anonymization.max_class_ncp)
        counts = {"releases": 1, "published": manifest.get("published", 0),
                  "suppressed": sum((manifest.get("suppressed") or {}).values())}
        return out, counts

    # ---- one batch of one partition
    def process(self, ps: PartitionState, msgs) -> BatchOutput:
        """``msgs``: (offset, value bytes) of one partition. Skips offsets already in the state."""
        out = BatchOutput([], ps.offset, {"skipped": 0, "events_in": 0, "dead_letters": 0, "releases": 0,
                                          "published": 0, "suppressed": 0, "aggregate_rows": 0})
        good, offsets = [], []
        last = ps.offset
        fresh = []
        for off, raw in sorted(msgs, key=lambda m: m[0]):
            if off <= last:
                out.counts["skipped"] += 1
                continue
            last = off
            fresh.append((off, raw))
        checked = check_payloads([raw for _, raw in fresh], self.config) if self.decoder is None else None
        for pos, (off, raw) in enumerate(fresh):
            if checked is not None:
                out.counts["events_in"] += 1
                reason, event = checked[pos]
                if reason:
                    self._deadletter(out, reason, ps.partition, off, raw=raw)
                else:
                    good.append(event)
                    offsets.append(off)
                continue
            # mapped input: an unreadable message is one event (dead letter at its offset); a message of N events
            # is N events (stream_anon.inputs.decode), each dead-lettered on its own (with its index when the
            # format holds several per message)
            d = self.decoder.decode(raw, self.topic, ps.partition, off)
            if d.reason:
                out.counts["events_in"] += 1
                self._deadletter(out, d.reason, ps.partition, off, raw=raw, opaque=True)
                continue
            for i, (event, reason) in enumerate(zip(d.events, d.reasons)):
                out.counts["events_in"] += 1
                source = (off, i) if self.config.input.multi else off
                if reason:
                    self._deadletter(out, reason, ps.partition, source, event=event)
                else:
                    good.append(event)
                    offsets.append(source)
        out.last_offset = last
        if good:
            out.engine_input = True
            self._process_events(ps, good, offsets, out)
        self._account(ps, out)
        self._prefetch(ps)
        return out

    def flush(self, ps: PartitionState) -> BatchOutput:
        """Close the open window and resolve every deferred record (end of a replay / idle input)."""
        out = BatchOutput([], ps.offset, {"skipped": 0, "events_in": 0, "dead_letters": 0, "releases": 0,
                                          "published": 0, "suppressed": 0, "aggregate_rows": 0})
        self._emit(ps, ps.engine.flush(), out)
        self._account(ps, out)
        ps.dirty_since_flush = False
        self._prefetch(ps)
        return out

    def _prefetch(self, ps: PartitionState) -> None:
        """Ask the aggregates process now for what the partition's next state record needs of the aggregates:
        its reply follows the batch's releases, where a request made when the record is written would wait behind
        the releases of the partitions processed since."""
        if self.aggregates_process is not None and ps.dp is not None:
            ps.dp.prefetch_record_state()

    ISOLATION_TRIES = 2            # attempts of a single event before it is dead-lettered as a processing error
    ISOLATION_MAX_FAILURES = 64    # failed attempts per batch; beyond, a failing part is dead-lettered whole

    def _process_events(self, ps: PartitionState, events: list, offsets: list, out: BatchOutput) -> None:
        """Reader, engine and output of a batch's checked events. If this raises, no event is lost and the
        partition does not stop: see :meth:`_isolate`."""
        first, counts = len(out.messages), dict(out.counts)
        try:
            self._attempt(ps, events, offsets, range(len(events)), out)
        except Exception as exc:   # noqa: BLE001 - one event never stops the partition
            del out.messages[first:]          # the failed attempt leaves neither messages nor counts behind
            out.counts.update(counts)
            out.releases.clear()
            self._isolate(ps, events, offsets, out, exc)

    def _attempt(self, ps: PartitionState, events: list, offsets: list, idx, out: BatchOutput) -> None:
        idx = list(idx)
        part = [events[i] for i in idx]
        records, rejected = ps.engine.reader.read(part)
        for j, reason in rejected:
            self._deadletter(out, reason, ps.partition, offsets[idx[j]], event=part[j])
        self._emit(ps, ps.engine.process_records(records), out)

    def _isolate(self, ps: PartitionState, events: list, offsets: list, out: BatchOutput, first: Exception):
        """The batch failed as a whole: go back to the state before it (the last committed state,
        ``ps.chain``) and split the batch in halves, processed in order, each part from a snapshot of the state before
        it, until the events that fail alone are found (``ISOLATION_TRIES`` attempts each); those are
        dead-lettered with ``processing error: <exception class>``. Output does not depend on how input is cut
        into batches, so the other events give what they give without the culprits. After
        ``ISOLATION_MAX_FAILURES`` failed attempts a part that fails is dead-lettered whole (bounded work)."""
        log.error("partition %s: batch of %d events failed (%s); isolating the culprit(s)", ps.partition,
                  len(events), type(first).__name__)
        out.pending.clear()
        self._restore(ps, *self.committed_state(ps))
        waited, ps.wait_for_aggregates = ps.wait_for_aggregates, True     # a part's failure must show in its attempt
        try:
            self._isolate_parts(ps, events, offsets, out)
        finally:
            ps.wait_for_aggregates = waited

    def _isolate_parts(self, ps: PartitionState, events: list, offsets: list, out: BatchOutput) -> None:
        failures, isolated = 1, 0

        def snapshot() -> st.StateRecord:     # encoded at once: the attempt changes the live objects
            rec = st.StateRecord.full_of(self._core_doc(ps, ps.seq, ps.offset, ps.flush_pending),
                                         self.state_tables(ps))
            st.encode_state(rec)
            return rec

        def run(idx: list[int], tries: int = 0) -> None:
            nonlocal failures, isolated
            snap, mark = snapshot(), len(out.messages)
            counts = dict(out.counts)
            try:
                self._attempt(ps, events, offsets, idx, out)
                return
            except Exception as exc:   # noqa: BLE001
                failures += 1
                del out.messages[mark:]
                out.counts.update(counts)
                self._restore(ps, *st.resolve_chain([snap.as_written()]))
                if failures > self.ISOLATION_MAX_FAILURES:
                    for i in idx:
                        self._deadletter(out, f"processing error: {type(exc).__name__} (isolation gave up after "
                                              f"{failures} failed attempts)", ps.partition, offsets[i],
                                         event=events[i])
                elif len(idx) > 1:
                    mid = len(idx) // 2
                    run(idx[:mid])
                    run(idx[mid:])
                elif tries + 1 < self.ISOLATION_TRIES:
                    run(idx, tries + 1)
                else:
                    isolated += 1
                    self._deadletter(out, f"processing error: {type(exc).__name__}", ps.partition, offsets[idx[0]],
                                     event=events[idx[0]])

        run(list(range(len(events))))
        log.error("partition %s: %d event(s) dead-lettered as processing errors after %d failed attempts",
                  ps.partition, isolated, failures)

    def _restore(self, ps: PartitionState, doc: dict | None, tables: dict) -> None:
        """Put the partition back into the state of ``doc`` and ``tables`` (None: a new partition), keeping its
        bookkeeping (committed chain, offsets)."""
        fresh = self.open_partition(ps.partition, doc, tables)
        self.parts[ps.partition] = ps
        ps.engine, ps.dp = fresh.engine, fresh.dp
        ps.next_full = True          # a restored engine's changes start from an empty base

    def _emit(self, ps: PartitionState, result, out: BatchOutput) -> None:
        for rel in result.releases:
            rel.kid = self.kid
            docs, c = self._release_docs(rel)
            out.messages.extend(docs)
            out.releases.append(rel)
            for k, v in c.items():
                out.counts[k] += v
            for reason, n in rel.suppressed.items():
                self.by_reason["suppressed"][reason] = self.by_reason["suppressed"].get(reason, 0) + n
            self.last_release[ps.partition] = {"ncp_mean": rel.ncp_mean, "deferred": len(rel.deferred_tokens),
                                               "counterfeit_records": rel.counterfeit_records,
                                               "window_end": rel.window_end}
        if ps.dp is not None and result.windows:
            released = ps.dp.messages(result.windows, dumps, TOPICS.metrics)
            if self.aggregates_process is None:
                msgs_dp, n = released
            elif not ps.wait_for_aggregates:
                out.pending.append((len(out.messages), released))      # collected by complete()
                return
            else:
                msgs_dp, n = released.result()
            out.messages.extend(msgs_dp)
            out.counts["aggregate_rows"] += n

    def complete(self, ps: PartitionState, out: BatchOutput, msgs=None) -> BatchOutput:
        """``out`` (of ``process(ps, msgs)``, or of ``flush(ps)`` when ``msgs`` is None) with the DP rows the
        aggregates process released for it, in place (the output as without the process). A release that failed
        there is the batch's failure: the partition goes back to its committed state and the batch (or the flush)
        runs again with every release waited for, so that the failure is caught where an engine failure is
        (isolation, dead letters). Without the process: ``out``."""
        if not out.pending:
            return out
        try:
            results = [(at, released.result()) for at, released in out.pending]
        except Exception as exc:   # noqa: BLE001 - one event never stops the partition
            log.error("partition %s: the aggregates process failed on the batch (%s); processing it again, "
                      "waiting for each release", ps.partition, type(exc).__name__)
            self._restore(ps, *self.committed_state(ps))
            for k, v in out.counts.items():          # the batch is accounted again when it runs again
                self.stats[k] -= v
            self.stats["batches"] -= 1
            ps.events_in -= out.counts["events_in"]
            ps.wait_for_aggregates = True
            try:
                return self.flush(ps) if msgs is None else self.process(ps, msgs)
            finally:
                ps.wait_for_aggregates = False
        out.pending = []
        for at, (msgs_dp, n) in reversed(results):
            out.messages[at:at] = msgs_dp
            out.counts["aggregate_rows"] += n
            self.stats["aggregate_rows"] += n
        return out

    def _deadletter(self, out: BatchOutput, reason: str, partition: int, source, raw=None, event=None,
                    opaque: bool = False) -> None:
        """``source``: the input offset, or (offset, index) of one event of a multi-event message."""
        offset, index = source if isinstance(source, tuple) else (source, None)
        out.messages.append(self._deadletter_doc(reason, partition, offset, raw=raw, event=event, index=index,
                                                 opaque=opaque))
        out.counts["dead_letters"] += 1
        key = reason.split(":", 1)[0]
        self.by_reason["dead_letters"][key] = self.by_reason["dead_letters"].get(key, 0) + 1

    def _account(self, ps: PartitionState, out: BatchOutput) -> None:
        for k, v in out.counts.items():
            self.stats[k] += v
        self.stats["batches"] += 1
        ps.events_in += out.counts["events_in"]
        if out.last_offset != ps.offset:
            ps.last_input = time.monotonic()
            ps.dirty_since_flush = ps.dirty_since_flush or out.engine_input

    # ---- without Kafka (tests, benchmarks, library use)
    def handle(self, messages) -> list:
        """``(partition, offset, value)`` messages in consumption order -> output messages, every partition
        batch's new state taken as committed (what the loop does with a transaction)."""
        by_part: dict[int, list] = {}
        for p, off, raw in messages:
            by_part.setdefault(p, []).append((off, raw))
        out = []
        for p, msgs in by_part.items():
            ps = self.parts.get(p) or self.open_partition(p)
            batch = self.complete(ps, self.process(ps, msgs), msgs)
            out.extend(batch.messages)
            self.committed(ps, batch.last_offset)
        return out

    def flush_all(self) -> list:
        """Flush every partition holding records (end of input), each flush taken as committed."""
        out = []
        for ps in list(self.parts.values()):
            if ps.dirty_since_flush:
                out.extend(self.complete(ps, self.flush(ps)).messages)
                self.committed(ps, ps.offset)
        return out

    def committed(self, ps: PartitionState, offset: int) -> st.StateRecord:
        """Record a commit of the partition's current state at ``offset`` (what the loop does with a
        transaction): its state record."""
        rec = self.state_record(ps, ps.seq + 1, offset)
        self.note_committed(ps, rec)
        return rec

    def idle_partitions(self, answered_at: float = math.inf, not_before: float = -math.inf) -> list[PartitionState]:
        """Partitions to flush: every partition of this worker has had no input for ``flush_when_idle_s``
        (judged over all partitions: one may wait in the fetch buffer while another is served, and flushing it
        early would change its releases), and this one holds records or an open window.

        With a broker (the Kafka loop): the quiet time counts from ``not_before`` at the earliest (the end of the
        last outage: a backlog is still to come) and must have been confirmed by the broker, i.e. a request sent
        at ``answered_at`` at least ``flush_when_idle_s`` after it was answered."""
        if not self.flush_when_idle_s or not self.parts:
            return []
        quiet_since = max(max(ps.last_input for ps in self.parts.values()), not_before)
        if min(time.monotonic(), answered_at) - quiet_since < self.flush_when_idle_s:
            return []
        return [ps for ps in self.parts.values() if ps.dirty_since_flush]

    def throughput_metric(self, positions: dict, highwaters: dict) -> dict:
        now = time.monotonic()
        t0, n0 = self._last_metric
        n = self.stats["events_in"]
        rate = (n - n0) / (now - t0) if now > t0 else 0.0
        self._last_metric = (now, n)
        lag = {}
        for p, hw in highwaters.items():
            pos = positions.get(p)
            if hw is not None and pos is not None:
                lag[str(p)] = max(0, hw - pos)
        return {"type": "throughput", "stream": self.stream, "partition": None, "ts": _now_iso(),
                "app_id": self.app_id, "pid": os.getpid(), "partitions": sorted(self.parts),
                "events_per_s": round(rate, 1), **{k: v for k, v in self.stats.items() if k != "started"},
                "committed": {str(p): ps.offset for p, ps in self.parts.items()},
                "lag_approx": lag, "lag_note": LAG_NOTE}


def composed_doc(doc: dict | None, tables: dict) -> dict | None:
    """A state (core and tables) as one document for tests and tools: the engine's tables composed into
    ``engine`` (:func:`stream_anon.engine.state.compose_state`); the DP core stays under ``dp`` with its ``dp/``
    tables under ``dp_tables``."""
    if doc is None:
        return None
    own = engine_tables(tables)
    engine = dict(doc["engine"])
    engine["pending"] = {w: {**p, "carried": plain_values(p["carried"])} for w, p in engine["pending"].items()}
    out = {**doc, "engine": compose_state(engine, own)}
    dp = {n: t for n, t in tables.items() if n not in own}
    if dp:
        out["dp_tables"] = dp
    return out


DP_PREFIX = "dp" + SEPARATOR        # the DP aggregates' tables among a partition's: dp/<their table>


def engine_tables(tables: dict) -> dict:
    """The engine's tables among a partition's."""
    return {n: t for n, t in tables.items() if not n.startswith(DP_PREFIX)}


def dp_tables(tables: dict) -> dict:
    """The DP aggregates' tables among a partition's, by their own names."""
    return {n[len(DP_PREFIX):]: t for n, t in tables.items() if n.startswith(DP_PREFIX)}


def as_dp_tables(tables: dict) -> dict:
    """The DP aggregates' tables (or changes) named as among a partition's."""
    return {DP_PREFIX + n: t for n, t in tables.items()}
