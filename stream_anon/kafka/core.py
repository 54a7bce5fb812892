"""The worker's core, without faust or a Kafka client: a batch of input messages in, output messages and a
partition checkpoint out (the faust app in :mod:`stream_anon.kafka.app` feeds it; tests and benchmarks can too).

One :class:`~stream_anon.engine.Engine` per input partition (a release is one window's output of one partition).
Per batch:

1. per partition, in offset order: skip offsets <= the checkpointed one (already processed before a restart);
   size, JSON, kind and schema checks -> dead letter on failure; the engine's reader checks event type, privacy
   unit, time and quasi-identifiers once -> dead letter on failure; the records go to the partition's engine;
2. produce every release's records (``anon.<stream>.records``, key release_id), its manifest (``anon.releases``),
   a release metric (``anon.metrics``), the dead letters (``anon.deadletter``) and, for streams with DP aggregates,
   the rows of the windows the engine closed (``anon.aggregates``), and await their delivery;
3. write the partition checkpoint (engine state + DP state + last input offset) atomically;
4. only then may the caller acknowledge the batch (the faust app acks, and faust commits only acked offsets).
   An exception or a kill between 1 and 4 leaves the batch unacknowledged, and the restarted worker re-processes
   it from the checkpoint (same release ids, same content; consumers dedupe by release_id, dead letters by source
   offset).
"""
from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson

from stream_anon import crypto
from stream_anon.contract import topics
from stream_anon.engine import Engine, get_path
from stream_anon.events import schema_reason
from stream_anon.kafka import aggregates
from stream_anon.kafka import checkpoint as ckpt

log = logging.getLogger("stream_anon.worker")

TOPICS = topics()           # the topic contract (topics/topics.toml), shipped inside the package
LAG_NOTE = ("approximate: computed from the consumed position and the broker's reported end offset, which the "
            "Tansu broker under-reports for multi-record batches")
DEADLETTER_PAYLOAD_MAX = 4096   # characters of an oversized payload kept in its dead letter


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def dumps(obj) -> bytes:
    """Output serialization: orjson (compact UTF-8, numpy scalars and arrays natively; ~5x faster than json.dumps
    on the record path)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)



# --------------------------------------------------------------------------------------------- input checks
def check_payload(raw: bytes | None, config) -> tuple[str | None, dict | None]:
    """(reason, None) for bad input, (None, event) for an event the engine's reader may see: size, JSON, kind and
    the kind's schema. Event type, privacy unit, time and quasi-identifiers are checked once, by the reader
    (:class:`stream_anon.engine.RecordReader`)."""
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
    reason = schema_reason(event, kind)
    if reason:
        return f"schema: {reason}", None
    return None, event


# --------------------------------------------------------------------------------------------- partition state
@dataclass
class PartitionState:
    partition: int
    engine: object
    offset: int                    # last checkpointed input offset (-1: none)
    last_input: float = field(default_factory=time.monotonic)
    dirty_since_flush: bool = False
    events_in: int = 0
    dp: object = None              # stream_anon.kafka.aggregates.PartitionAggregates when the stream has [dp]


class WorkerCore:
    """Everything the faust agent does, independent of faust's plumbing (easier to read and test)."""

    def __init__(self, config, state_dir, app_id, secret: bytes, send, flush_when_idle_s: float | None = None,
                 raw_deadletters: bool = False):
        self.config = config
        self.state_dir = Path(state_dir)
        self.app_id = app_id
        self.secret = secret
        self.send = send                         # async (topic, key: bytes, value: bytes) -> awaitable delivery
        self.flush_when_idle_s = flush_when_idle_s
        self.raw_deadletters = raw_deadletters     # opt-in: keep payloads that are not JSON objects verbatim
        self.stream = config.stream.name
        self.topic = config.stream.input_topic
        self.parts: dict[int, PartitionState] = {}
        self.lock = asyncio.Lock()
        self.stats = {"events_in": 0, "skipped": 0, "dead_letters": 0, "releases": 0, "published": 0,
                      "suppressed": 0, "aggregate_rows": 0, "batches": 0, "started": time.time()}
        self._last_metric = (time.monotonic(), 0)

    # ---- engine per partition
    def part(self, partition: int) -> PartitionState:
        """The partition's state, loading its checkpoint (or starting a new engine) on first use."""
        ps = self.parts.get(partition)
        if ps is None:
            cp = ckpt.read_checkpoint(self.state_dir, self.app_id, self.stream, partition)
            ckpt.forget_writer(self.state_dir, self.app_id, self.stream, partition)   # next write: a snapshot
            carried = aggregates.needed_fields(self.config.dp, self.config.stream.event_time) \
                if self.config.dp is not None else ()
            if cp is None:
                engine = Engine(self.config, partition=partition, secret=self.secret, carried=carried)
                offset = -1
            else:
                engine = Engine.restore(self.config, partition, self.secret, cp.core, cp.tables, carried=carried)
                offset = cp.offset
            log.info("partition %s: %s", partition,
                     f"resumed from checkpoint offset {offset}" if cp else "no checkpoint, new engine")
            ps = self.parts[partition] = PartitionState(partition, engine, offset)
            ps.dp = aggregates.for_partition(self.config, self.state_dir, self.app_id, partition, self.secret,
                                             cp.core if cp else None)
            # records buffered in a checkpointed engine still need an idle flush (if enabled)
            ps.dirty_since_flush = bool(getattr(engine, "deferred", 0))
        return ps

    def assign(self, partitions) -> None:
        """Partitions assigned to this worker: load their checkpoints now (so an idle flush reaches them)."""
        for p in partitions:
            self.part(p)

    def drop(self, partitions) -> None:
        for p in partitions:
            if self.parts.pop(p, None) is not None:
                log.info("partition %s revoked: engine dropped (state is in its checkpoint)", p)

    def _fresh(self, ps: PartitionState, first_offset: int) -> PartitionState:
        """Guard against a stale checkpoint: if the first offset we are handed lies beyond our checkpoint + 1,
        another worker advanced this partition after we loaded it (it finished a batch during the rebalance),
        so reload the checkpoint from disk. A gap that remains means input that was never checkpointed was
        skipped, which the protocol excludes (faust commits only checkpointed offsets): it is logged loudly."""
        if first_offset <= ps.offset + 1:
            return ps
        self.parts.pop(ps.partition, None)
        ps = self.part(ps.partition)
        if first_offset > ps.offset + 1:
            self.stats["gaps"] = self.stats.get("gaps", 0) + 1
            log.error("partition %s: input starts at offset %s but the checkpoint covers only up to %s: "
                      "offsets in between were never processed by this app (checkpoint lost?)",
                      ps.partition, first_offset, ps.offset)
        return ps

    # ---- outputs
    def _deadletter_doc(self, reason, partition, offset, raw: bytes | None = None,
                        event: dict | None = None) -> tuple[str, bytes, bytes]:
        """A dead letter: reason, source coordinates, the event's audit token when it has an event id, and the
        payload with the identifier fields (privacy unit, ``identifiers.pseudonymize``) replaced by their keyed
        pseudonyms and ``identifiers.drop`` removed. A payload that is not a JSON object cannot be searched for
        identifiers: it is withheld (size and digest only) unless ``raw_deadletters`` was asked for."""
        doc = {"reason": reason, "stream": self.stream,
               "source": {"topic": self.topic, "partition": partition, "offset": offset},
               "received_at": _now_iso()}
        if event is None and raw is not None:
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
            text = orjson.dumps(self._redact(event), default=str).decode()
        elif self.raw_deadletters and raw is not None:
            text = raw.decode("utf-8", errors="replace")
        else:
            text = None
            if raw is not None:
                doc["payload_withheld"] = "not a JSON object: identifiers cannot be located"
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
        out = [(TOPICS.records(self.stream), key, dumps(r)) for r in rel.records]
        manifest = rel.manifest()
        out.append((TOPICS.releases, key, dumps(manifest)))
        metric = {"type": "release", "stream": self.stream, "partition": rel.partition, "ts": _now_iso(),
                  "release_id": rel.release_id, "seq": manifest.get("seq"), "published": manifest.get("published"),
                  "suppressed": manifest.get("suppressed"), "deferred": manifest.get("deferred"),
                  "ncp_mean": manifest.get("ncp_mean"), "suppression_ratio": manifest.get("suppression_ratio")}
        if "m" in manifest:     # m-invariance: counterfeit counts, as in the manifest (never which records)
            metric.update({name: manifest[name] for name in ("m", "counterfeit_individuals", "counterfeit_records")})
        out.append((TOPICS.metrics, self.stream.encode(), dumps(metric)))
        if manifest.get("suppression_limit_exceeded"):
            alert = {"type": "alert", "stream": self.stream, "partition": rel.partition, "ts": _now_iso(),
                     "alert": "suppression_limit_exceeded", "release_id": rel.release_id,
                     "suppression_ratio": manifest.get("suppression_ratio"),
                     "limit": self.config.anonymization.max_suppression_ratio}
            out.append((TOPICS.metrics, self.stream.encode(), dumps(alert)))
        counts = {"releases": 1, "published": manifest.get("published", 0),
                  "suppressed": sum((manifest.get("suppressed") or {}).values())}
        return out, counts

    def _compute(self, ps: PartitionState, msgs, flush: bool = False) -> dict:
        """Synchronous part of a batch for one partition (runs in a thread: keeps faust's loop and heartbeats
        responsive): input checks, engine, serialization of every output message."""
        out: list[tuple[str, bytes, bytes]] = []
        counts = {"skipped": 0, "events_in": 0, "dead_letters": 0, "releases": 0, "published": 0, "suppressed": 0,
                  "aggregate_rows": 0}
        good, offsets = [], []
        last = ps.offset
        for off, raw in sorted(msgs, key=lambda m: m[0]):
            if off <= last:
                counts["skipped"] += 1
                continue
            last = off
            counts["events_in"] += 1
            reason, event = check_payload(raw, self.config)
            if reason:
                out.append(self._deadletter_doc(reason, ps.partition, off, raw=raw))
                counts["dead_letters"] += 1
            else:
                good.append(event)
                offsets.append(off)
        result = None
        if good:
            records, rejected = ps.engine.reader.read(good)
            for i, reason in rejected:
                out.append(self._deadletter_doc(reason, ps.partition, offsets[i], event=good[i]))
            counts["dead_letters"] += len(rejected)
            result = ps.engine.process_records(records)
        elif flush:
            result = ps.engine.flush()
        if result is not None:
            for rel in result.releases:
                docs, c = self._release_docs(rel)
                out.extend(docs)
                for k, v in c.items():
                    counts[k] += v
            if ps.dp is not None:   # DP aggregates of the closed windows; the ledger is written before delivery
                msgs_dp, counts["aggregate_rows"] = ps.dp.messages(result.windows, dumps, TOPICS.metrics)
                out.extend(msgs_dp)
        return {"out": out, "counts": counts, "last": last, "engine_input": bool(good)}

    # ---- one batch: messages are (partition, offset, value bytes) in consumption order
    async def process_batch(self, messages) -> None:
        loop = asyncio.get_running_loop()
        async with self.lock:
            self.stats["batches"] += 1
            by_part: dict[int, list] = {}
            for p, off, raw in messages:
                by_part.setdefault(p, []).append((off, raw))
            out = []           # messages to produce
            advanced = {}      # partition -> (state, new last offset)
            for p, msgs in by_part.items():
                ps = self._fresh(self.part(p), min(off for off, _ in msgs))
                res = await loop.run_in_executor(None, self._compute, ps, msgs)
                for k, v in res["counts"].items():
                    self.stats[k] += v
                ps.events_in += res["counts"]["events_in"]
                out.extend(res["out"])
                if res["last"] != ps.offset:
                    ps.last_input = time.monotonic()
                    ps.dirty_since_flush = ps.dirty_since_flush or res["engine_input"]
                    advanced[p] = (ps, res["last"])
            await self._deliver(out)
            for ps, off in advanced.values():
                await self._checkpoint(ps, off)

    async def _deliver(self, messages) -> None:
        """Produce (topic, key, value) messages and wait until the broker acknowledged all of them (acks=all)."""
        futs = [await self.send(topic, key, value) for topic, key, value in messages]   # enqueue
        if futs:
            await asyncio.gather(*futs)     # raises if any delivery failed -> no checkpoint, no ack

    def _write_checkpoint(self, ps: PartitionState, offset: int) -> bool:
        existing = ckpt.checkpointed_offset(self.state_dir, self.app_id, self.stream, ps.partition)
        if existing > offset:
            # another worker owns this partition now and is ahead of us: never move its checkpoint back
            return False
        core = ps.engine.state_core()
        if ps.dp is not None:
            core["dp"] = ps.dp.state_dict()
        ckpt.write_state(self.state_dir, self.app_id, self.stream, self.topic, ps.partition, offset, core,
                         ps.engine.state_tables, ps.engine.state_changes)
        return True

    async def _checkpoint(self, ps: PartitionState, offset: int) -> None:
        loop = asyncio.get_running_loop()
        if await loop.run_in_executor(None, self._write_checkpoint, ps, offset):
            ps.offset = offset
        else:
            log.warning("partition %s: checkpoint on disk is ahead of ours (%s); not overwritten", ps.partition,
                        offset)
            if self.parts.get(ps.partition) is ps:
                self.parts.pop(ps.partition)      # reload from the newer checkpoint on the next event

    async def flush_idle(self) -> None:
        """Demo/end-of-input helper: once this worker has had no input on any partition for
        ``flush_when_idle_s``, flush the engines of its partitions.

        Not part of normal streaming (it closes the open window early); used by ``run_until_accounted`` so that
        every replayed event is published or suppressed. Idleness is judged over all partitions, not per partition:
        the consumer may serve one partition for seconds while another waits in its fetch buffer, and flushing
        that one early would change its releases. The flushed state is checkpointed at the same offset.
        """
        if not self.flush_when_idle_s:
            return
        loop = asyncio.get_running_loop()
        async with self.lock:
            now = time.monotonic()
            if now - max((ps.last_input for ps in self.parts.values()), default=now) < self.flush_when_idle_s:
                return
            for ps in list(self.parts.values()):
                if ps.dirty_since_flush:
                    res = await loop.run_in_executor(None, self._compute, ps, [], True)
                    for k, v in res["counts"].items():
                        self.stats[k] += v
                    await self._deliver(res["out"])
                    await self._checkpoint(ps, ps.offset)
                    ps.dirty_since_flush = False
                    log.info("partition %s idle for %.1fs: flushed (%d releases)", ps.partition,
                             now - ps.last_input, res["counts"]["releases"])

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
                "checkpointed": {str(p): ps.offset for p, ps in self.parts.items()},
                "lag_approx": lag, "lag_note": LAG_NOTE}


