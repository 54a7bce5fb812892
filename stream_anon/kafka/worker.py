"""The faust worker: a thin adapter between Kafka and the engine (no anonymization logic here).

One agent consumes the stream's input topic. Each input partition has its own :class:`~stream_anon.engine.Engine`
(a release is one window's output of one partition). Per batch (``stream.noack_take``):

1. per partition, in offset order: skip offsets <= the checkpointed one (already processed before a restart);
   size check, JSON parse, schema check, kind / event type check -> dead letter on failure; the good events go to
   the partition's engine (in a thread, so heartbeats keep flowing); engine rejections -> dead letter;
2. produce every release's records (``anon.<stream>.records``, key release_id), its manifest (``anon.releases``),
   a release metric (``anon.metrics``) and the dead letters (``anon.deadletter``), and await their delivery;
3. write the partition checkpoint (engine state + last input offset) atomically;
4. only then ack the batch's events to faust. faust commits only acked offsets (the contiguous acked prefix), so
   its committed offset never passes the checkpoint. ``noack_take`` never acks by itself: an exception or a kill
   between 1 and 4 leaves the events unacked, and the restarted worker re-processes them from the checkpoint
   (same release ids, same content; consumers dedupe by release_id, dead letters by source offset).

Run: ``STREAM_ANON_SECRET=... python -m stream_anon.kafka.worker --config configs/oyster.toml --broker HOST:PORT``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson

from stream_anon import crypto
from stream_anon.events import validate_event
from stream_anon.kafka import aggregates
from stream_anon.kafka import checkpoint as ckpt

log = logging.getLogger("stream_anon.worker")

DEADLETTER_TOPIC = "anon.deadletter"
RELEASES_TOPIC = "anon.releases"
METRICS_TOPIC = "anon.metrics"
LAG_NOTE = ("approximate: computed from the consumed position and the broker's reported end offset, which the "
            "Tansu broker under-reports for multi-record batches")
DEADLETTER_PAYLOAD_MAX = 4096   # characters of an oversized payload kept in its dead letter
# Test hook only: SIGKILL this worker after delivering the outputs of batch N, before checkpointing it.
_KILL_AFTER_BATCHES = int(os.environ.get("STREAM_ANON_TEST_KILL_AFTER_BATCHES", "0") or 0)


def records_topic(stream_name: str) -> str:
    return f"anon.{stream_name}.records"


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _dumps(obj) -> bytes:
    # orjson: compact UTF-8, numpy scalars and arrays natively; ~5x faster than json.dumps on the record path
    return orjson.dumps(obj, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# --------------------------------------------------------------------------------------------- input checks
def check_payload(raw: bytes | None, config, validate=None) -> tuple[str | None, dict | None]:
    """(reason, None) for bad input, (None, event) for an event the engine may see."""
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
    et = event.get("event_type")
    if isinstance(et, str) and et not in config.stream.event_types:
        return f"unknown event type: {et!r} (stream {config.stream.name} accepts {list(config.stream.event_types)})", None
    validate = validate or validate_event
    reason = validate(event, kind)
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

    def __init__(self, config, state_dir, app_id, secret: bytes, send, flush_when_idle_s: float | None = None):
        self.config = config
        self.state_dir = Path(state_dir)
        self.app_id = app_id
        self.secret = secret
        self.send = send                         # async (topic, key: bytes, value: bytes) -> awaitable delivery
        self.flush_when_idle_s = flush_when_idle_s
        self.stream = config.stream.name
        self.topic = config.stream.input_topic
        self.parts: dict[int, PartitionState] = {}
        self.validate = validate_event
        self.lock = asyncio.Lock()
        self.stats = {"events_in": 0, "skipped": 0, "dead_letters": 0, "releases": 0, "published": 0,
                      "suppressed": 0, "aggregate_rows": 0, "batches": 0, "started": time.time()}
        self._last_metric = (time.monotonic(), 0)

    # ---- engine per partition
    def _engine_cls(self):
        from stream_anon.engine import Engine
        return Engine

    def part(self, partition: int) -> PartitionState:
        """The partition's state, loading its checkpoint (or starting a new engine) on first use."""
        ps = self.parts.get(partition)
        if ps is None:
            Engine = self._engine_cls()
            cp = ckpt.read_checkpoint(self.state_dir, self.app_id, self.stream, partition)
            if cp is None:
                engine, offset = Engine(self.config, partition=partition, secret=self.secret), -1
            else:
                engine, offset = Engine.from_state(self.config, cp.state, secret=self.secret), cp.offset
            log.info("partition %s: %s", partition,
                     f"resumed from checkpoint offset {offset}" if cp else "no checkpoint, new engine")
            ps = self.parts[partition] = PartitionState(partition, engine, offset)
            ps.dp = aggregates.for_partition(self.config, self.state_dir, self.app_id, partition, self.secret,
                                             cp.state if cp else None)
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
    def _deadletter_doc(self, reason, partition, offset, raw: bytes | None) -> tuple[str, bytes, bytes]:
        text = "" if raw is None else raw.decode("utf-8", errors="replace")
        doc = {"reason": reason, "stream": self.stream,
               "source": {"topic": self.topic, "partition": partition, "offset": offset},
               "payload": text[:DEADLETTER_PAYLOAD_MAX], "received_at": _now_iso()}
        if len(text) > DEADLETTER_PAYLOAD_MAX:
            doc["payload_truncated"] = True
            doc["payload_bytes"] = len(raw)
        return DEADLETTER_TOPIC, self.stream.encode(), _dumps(doc)

    def _release_docs(self, rel) -> tuple[list[tuple[str, bytes, bytes]], dict]:
        """(messages to produce, counters) for one release: records, manifest, release metric, alert."""
        key = rel.release_id.encode()
        out = [(records_topic(self.stream), key, _dumps(r)) for r in rel.records]
        manifest = rel.manifest()
        out.append((RELEASES_TOPIC, key, _dumps(manifest)))
        metric = {"type": "release", "stream": self.stream, "partition": rel.partition, "ts": _now_iso(),
                  "release_id": rel.release_id, "seq": manifest.get("seq"), "published": manifest.get("published"),
                  "suppressed": manifest.get("suppressed"), "deferred": manifest.get("deferred"),
                  "ncp_mean": manifest.get("ncp_mean"), "suppression_ratio": manifest.get("suppression_ratio")}
        if "m" in manifest:     # m-invariance: counterfeit counts, as in the manifest (never which records)
            metric.update({name: manifest[name] for name in ("m", "counterfeit_individuals", "counterfeit_records")})
        out.append((METRICS_TOPIC, self.stream.encode(), _dumps(metric)))
        if manifest.get("suppression_limit_exceeded"):
            alert = {"type": "alert", "stream": self.stream, "partition": rel.partition, "ts": _now_iso(),
                     "alert": "suppression_limit_exceeded", "release_id": rel.release_id,
                     "suppression_ratio": manifest.get("suppression_ratio"),
                     "limit": self.config.anonymization.max_suppression_ratio}
            out.append((METRICS_TOPIC, self.stream.encode(), _dumps(alert)))
        counts = {"releases": 1, "published": manifest.get("published", 0),
                  "suppressed": sum((manifest.get("suppressed") or {}).values())}
        return out, counts

    def _compute(self, ps: PartitionState, msgs, flush: bool = False) -> dict:
        """Synchronous part of a batch for one partition (runs in a thread: keeps faust's loop and heartbeats
        responsive): input checks, engine, serialization of every output message."""
        out: list[tuple[str, bytes, bytes]] = []
        counts = {"skipped": 0, "events_in": 0, "dead_letters": 0, "releases": 0, "published": 0, "suppressed": 0,
                  "aggregate_rows": 0}
        good, sources = [], []
        last = ps.offset
        for off, raw in sorted(msgs, key=lambda m: m[0]):
            if off <= last:
                counts["skipped"] += 1
                continue
            last = off
            counts["events_in"] += 1
            reason, event = check_payload(raw, self.config, self.validate)
            if reason:
                out.append(self._deadletter_doc(reason, ps.partition, off, raw))
                counts["dead_letters"] += 1
            else:
                good.append(event)
                sources.append((off, raw))
        result = None
        if good:
            result = ps.engine.process(good)
        elif flush:
            result = ps.engine.flush()
        if result is not None:
            if result.rejected:
                by_id = {id(e): src for e, src in zip(good, sources)}
                by_eid: dict = {}
                for e, src in zip(good, sources):
                    by_eid.setdefault(e.get("event_id"), src)
                for rej in result.rejected:
                    src = by_id.get(id(rej.event))
                    if src is None and isinstance(rej.event, dict):
                        src = by_eid.get(rej.event.get("event_id"))
                    off, raw = src if src else (None, _dumps(rej.event))
                    out.append(self._deadletter_doc(rej.reason, ps.partition, off, raw))
                    counts["dead_letters"] += 1
            for rel in result.releases:
                docs, c = self._release_docs(rel)
                out.extend(docs)
                for k, v in c.items():
                    counts[k] += v
        if ps.dp is not None:     # DP aggregates: the ledger is written inside, before these are delivered
            msgs_dp, counts["aggregate_rows"] = ps.dp.messages(good, result.rejected if result else (), flush,
                                                               _dumps, METRICS_TOPIC)
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
            if _KILL_AFTER_BATCHES and self.stats["batches"] >= _KILL_AFTER_BATCHES:
                # test hook: die like kill -9 between delivery and checkpoint (the worst moment)
                log.warning("test hook: SIGKILL after delivering batch %d, before its checkpoint",
                            self.stats["batches"])
                os.kill(os.getpid(), signal.SIGKILL)
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
        state = ps.engine.state_dict()
        if ps.dp is not None:
            state["dp"] = ps.dp.state_dict()
        ckpt.write_checkpoint(self.state_dir, self.app_id, self.stream, self.topic, ps.partition, offset, state)
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


# --------------------------------------------------------------------------------------------- faust app
def make_app(config, bootstrap: str, state_dir, app_id: str | None = None, secret: bytes | None = None,
             batch_max: int = 10000, batch_within_s: float = 0.5, metrics_interval_s: float = 5.0,
             flush_when_idle_s: float | None = None, web_port: int | None = None):
    """A faust app with one agent on ``config.stream.input_topic`` (see the module docstring)."""
    import faust

    app_id = app_id or f"stream-anon-{config.stream.name}"
    secret = secret if secret is not None else crypto.load_secret()
    state_dir = Path(state_dir)
    (state_dir / app_id).mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=str(state_dir / app_id / "faust-data"),
        web_enabled=web_port is not None,
        web_port=web_port or 6066,
        web_bind="127.0.0.1",
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=6.0,
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger=0.005,
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=8 * 1024 * 1024,
        topic_partitions=4,
        topic_replication_factor=1,
        stream_wait_empty=True,
        Monitor="stream_anon.kafka.lean_monitor:LeanMonitor",   # no per-message statistics (see that module)
        table_standby_replicas=0,
    )
    in_topic = app.topic(config.stream.input_topic, key_type=bytes, value_type=bytes,
                         key_serializer="raw", value_serializer="raw")

    async def send(topic: str, key: bytes, value: bytes):
        return await app.producer.send(topic, key, value, None, None, None)

    core = WorkerCore(config, state_dir, app_id, secret, send, flush_when_idle_s=flush_when_idle_s)
    app.stream_anon_core = core  # for inspection

    @app.agent(in_topic, name=f"anonymize-{config.stream.name}", concurrency=1)
    async def anonymize(stream):
        async for events in stream.noack_take(batch_max, within=batch_within_s):
            msgs = [(e.message.partition, e.message.offset, e.message.value) for e in events]
            try:
                await core.process_batch(msgs)
            except Exception:
                # The engines may now hold state that is neither delivered nor checkpointed, and the batch is
                # unacked: a restarted agent in this process would never see it again. Exit hard (nothing of
                # this batch is acked or committed); the restarted worker resumes from the checkpoints.
                log.exception("batch failed: exiting so that a restart resumes from the last checkpoints")
                logging.shutdown()
                os._exit(70)
            # only now: every output delivered, every checkpoint on disk -> let faust commit these offsets
            for e in events:
                await stream.ack(e)

    @app.on_partitions_revoked.connect
    async def on_revoked(app_, revoked, **kwargs):
        core.drop([tp.partition for tp in revoked if tp.topic == config.stream.input_topic])

    @app.on_partitions_assigned.connect
    async def on_assigned(app_, assigned, **kwargs):
        core.assign([tp.partition for tp in assigned if tp.topic == config.stream.input_topic])

    @app.timer(metrics_interval_s)
    async def metrics():
        positions, highwaters = {}, {}
        try:
            for tp in app.consumer.assignment():
                if tp.topic != config.stream.input_topic:
                    continue
                highwaters[tp.partition] = app.consumer.highwater(tp)
                ps = core.parts.get(tp.partition)
                positions[tp.partition] = (ps.offset + 1) if ps else None
        except Exception:  # pragma: no cover - metrics never break processing
            pass
        doc = core.throughput_metric(positions, highwaters)
        try:
            await (await send(METRICS_TOPIC, core.stream.encode(), _dumps(doc)))
        except Exception as exc:  # pragma: no cover
            log.warning("metrics not delivered: %r", exc)

    if flush_when_idle_s:
        @app.timer(max(0.2, min(1.0, flush_when_idle_s / 2)))
        async def idle_flush():
            await core.flush_idle()

    return app


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")


def run_worker(config, bootstrap: str, state_dir, stop_when=None, app_id: str | None = None,
               secret: bytes | None = None, loglevel: str = "warning", check_interval_s: float = 0.5, **app_kwargs):
    """Run a faust worker in this process until SIGTERM/SIGINT or ``stop_when()`` returns true."""
    import faust

    app = make_app(config, bootstrap, state_dir, app_id=app_id, secret=secret, **app_kwargs)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False, override_logging=False)
    if stop_when is not None:
        @app.timer(check_interval_s)
        async def _stop_check():
            if stop_when():
                schedule = getattr(worker, "_schedule_shutdown", None)
                if schedule is not None:
                    schedule(signal.SIGTERM)
                else:  # pragma: no cover
                    os.kill(os.getpid(), signal.SIGTERM)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    return app


# --------------------------------------------------------------------------------------------- accounting
class OutputReader:
    """Incrementally reads anon.releases and anon.deadletter (from the beginning; no reliance on end offsets)."""

    def __init__(self, bootstrap: str, stream: str):
        from kafka import KafkaConsumer, TopicPartition

        self.stream = stream
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                      auto_offset_reset="earliest", client_id="stream-anon-accounting")
        tps = []
        for topic in (RELEASES_TOPIC, DEADLETTER_TOPIC):
            parts = self.consumer.partitions_for_topic(topic) or {0}
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        self.consumer.seek_to_beginning(*tps)
        self.manifests: dict[str, dict] = {}
        self.deadletters: dict[tuple, dict] = {}

    def poll(self, timeout_ms: int = 500) -> None:
        batch = self.consumer.poll(timeout_ms=timeout_ms, max_records=10000)
        for tp, recs in batch.items():
            for r in recs:
                try:
                    doc = json.loads(r.value)
                except ValueError:
                    continue
                if doc.get("stream") != self.stream:
                    continue
                if tp.topic == RELEASES_TOPIC:
                    self.manifests.setdefault(doc["release_id"], doc)
                else:
                    src = doc.get("source") or {}
                    key = (src.get("topic"), src.get("partition"), src.get("offset"))
                    if src.get("offset") is None:
                        key = key + (doc.get("reason"), doc.get("payload"))
                    self.deadletters.setdefault(key, doc)

    def accounting(self) -> dict:
        published = sum(m.get("published", 0) for m in self.manifests.values())
        suppressed = sum(sum((m.get("suppressed") or {}).values()) for m in self.manifests.values())
        latest: dict[int, dict] = {}
        for m in self.manifests.values():
            p = m.get("partition")
            if p not in latest or m.get("seq", -1) > latest[p].get("seq", -1):
                latest[p] = m
        deferred = sum(m.get("deferred", 0) for m in latest.values())
        dead = len(self.deadletters)
        return {"releases": len(self.manifests), "published": published, "suppressed": suppressed,
                "deferred": deferred, "dead_lettered": dead,
                "accounted": published + suppressed + deferred + dead}

    def close(self) -> None:
        self.consumer.close()


def worker_command(config_path, bootstrap: str, state_dir, app_id: str | None = None,
                   flush_when_idle_s: float | None = None, extra: list[str] | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "stream_anon.kafka.worker", "--config", str(config_path), "--broker", bootstrap,
           "--state-dir", str(state_dir)]
    if app_id:
        cmd += ["--app-id", app_id]
    if flush_when_idle_s:
        cmd += ["--flush-when-idle", str(flush_when_idle_s)]
    return cmd + list(extra or [])


def start_worker_process(config_path, bootstrap: str, state_dir, app_id: str | None = None,
                         flush_when_idle_s: float | None = None, log_path=None, env=None, extra=None):
    """Start ``python -m stream_anon.kafka.worker`` as a subprocess (own process group)."""
    cmd = worker_command(config_path, bootstrap, state_dir, app_id, flush_when_idle_s, extra)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env or os.environ.copy(), start_new_session=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    if log_path:
        out.close()
    return proc


def stop_worker_process(proc, timeout_s: float = 20.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


def run_until_accounted(config, bootstrap: str, state_dir, expected_events: int, timeout_s: float = 120.0,
                        app_id: str | None = None, flush_when_idle_s: float = 2.0, log_path=None,
                        progress: bool = False) -> dict:
    """Run a worker subprocess until every input event is accounted for, then stop it.

    ``config`` is the path of the stream's TOML (or a StreamConfig with ``.source``). Accounted = published +
    suppressed (over manifests deduped by release_id) + deferred (latest manifest per partition) + dead-lettered
    (deduped by source offset), read back from ``anon.releases`` and ``anon.deadletter``. The worker flushes a
    partition's engine after ``flush_when_idle_s`` without input (end of a replay). Returns the accounting plus
    ``seconds`` and ``events_per_s``; raises TimeoutError (with the accounting) when not reached in time.
    """
    config_path = getattr(config, "source", None) or config
    cfg = config if hasattr(config, "stream") else _load_config(config_path)
    t0 = time.monotonic()
    proc = start_worker_process(config_path, bootstrap, state_dir, app_id, flush_when_idle_s, log_path)
    reader = OutputReader(bootstrap, cfg.stream.name)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=expected_events, desc=f"accounted {cfg.stream.name}", unit="ev")
    try:
        acc = reader.accounting()
        while time.monotonic() - t0 < timeout_s:
            reader.poll(500)
            acc = reader.accounting()
            if bar is not None:
                bar.n = min(acc["accounted"], expected_events)
                bar.refresh()
            if acc["accounted"] >= expected_events and acc["deferred"] == 0:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with code {proc.returncode} before all events were accounted "
                                   f"for: {acc}" + (f" (log: {log_path})" if log_path else ""))
        else:
            raise TimeoutError(f"not all {expected_events} events accounted for within {timeout_s}s: {acc}")
        acc["seconds"] = round(time.monotonic() - t0, 3)
        acc["events_per_s"] = round(expected_events / acc["seconds"], 1) if acc["seconds"] else None
        acc["expected"] = expected_events
        return acc
    finally:
        if bar is not None:
            bar.close()
        reader.close()
        stop_worker_process(proc)


def _load_config(path):
    from stream_anon.config import load_config
    return load_config(path)


# --------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stream-anon worker", description="Run the faust anonymization worker.")
    p.add_argument("--config", required=True, help="stream configuration (TOML)")
    p.add_argument("--broker", required=True, help="bootstrap server HOST:PORT")
    p.add_argument("--state-dir", default="state", help="checkpoint directory (default: state)")
    p.add_argument("--app-id", default=None, help="faust app id / consumer group (default: stream-anon-<stream>)")
    p.add_argument("--batch-max", type=int, default=10000)
    p.add_argument("--batch-within", type=float, default=0.5, help="seconds to wait to fill a batch")
    p.add_argument("--metrics-interval", type=float, default=5.0)
    p.add_argument("--flush-when-idle", type=float, default=None,
                   help="flush a partition's engine after this many seconds without input (end of a replay/demo)")
    p.add_argument("--no-create-topics", action="store_true", help="do not apply topics/*.toml at start")
    p.add_argument("--loglevel", default="warning")
    return p


def worker_main(argv=None) -> int:
    """``stream-anon worker --config FILE --broker HOST:PORT [--state-dir state] [--app-id ID]``."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.loglevel)
    try:
        secret = crypto.load_secret()
    except crypto.SecretError as exc:
        print(f"stream-anon worker: {exc}", file=sys.stderr)
        return 2
    try:
        config = _load_config(args.config)
    except (OSError, ValueError) as exc:     # ConfigError is a ValueError
        print(f"stream-anon worker: {args.config}: {exc}", file=sys.stderr)
        return 2
    if not args.no_create_topics:
        from stream_anon.kafka.topics import ensure_topics
        ensure_topics(args.broker, names=[config.stream.input_topic, records_topic(config.stream.name),
                                          RELEASES_TOPIC, DEADLETTER_TOPIC, METRICS_TOPIC]
                      + ([aggregates.AGGREGATES_TOPIC] if config.dp is not None else []),
                      default_partitions={config.stream.input_topic: 4, records_topic(config.stream.name): 1})
    run_worker(config, args.broker, args.state_dir, app_id=args.app_id, secret=secret, loglevel=args.loglevel,
               batch_max=args.batch_max, batch_within_s=args.batch_within, metrics_interval_s=args.metrics_interval,
               flush_when_idle_s=args.flush_when_idle)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
