"""Read the raw input and the published outputs from a Kafka broker for the audit (kafka-python).

No consumer group and no committed offsets: every partition is assigned and read from the beginning. The end of
a topic is decided by quiet time, never by end offsets / high watermark (Tansu reports wrong ones): we poll
until no new message arrived for ``idle_s`` seconds, then poll one more ``idle_s`` period and stop only if the
number of consumed messages did not change (bounded by ``max_wait_s``). The audit reads its topics ``complete``: a
read still receiving messages at ``max_wait_s`` raises :class:`IncompleteRead` instead of returning a prefix (a
prefix of the raw topic made correct output look like dead letters of unknown sources and records of unknown
events: 972 of 100,000 fuzzed messages, 700 MB, were cut off at 120 s).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from stream_anon.connection import as_connection, seek_to_first
from stream_anon.contract import topics
from stream_anon.progress import bar as progress_bar

from .config import AuditConfig
from .inputs import AuditOutputs, raw_decoder
from .report import AuditReport
from .run import audit


class IncompleteRead(TimeoutError):
    """A topic was still delivering messages when the read's time bound ran out."""


def _partitions(consumer: Any, topic: str, wait_s: float) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if time.monotonic() >= deadline:
            return []
        time.sleep(0.3)


def read_topic(bootstrap, topic: str, idle_s: float = 3.0, max_wait_s: float = 120.0,
               metadata_wait_s: float = 5.0, with_timestamps: bool = False,
               complete: bool = False, progress=None) -> list[tuple]:
    """Every message of ``topic`` as ``((topic, partition, offset), value_bytes)``, ordered by source
    (with ``with_timestamps``: ``(source, value_bytes, timestamp_ms)``).

    Read committed only (``read_committed``): a broker that hides aborted transactions (Apache Kafka) never shows the
    audit, or any reader of ours, a record a fenced or killed worker wrote and did not commit. Tansu shows them all
    the same (a defect of that broker: docs/brokers.md), so what is read must still tolerate them.
    A topic that does not exist (no metadata within ``metadata_wait_s``) yields ``[]``. ``complete``: raise
    :class:`IncompleteRead` when ``max_wait_s`` runs out before the topic went quiet (else: what was read).
    ``progress``: a bar (:func:`stream_anon.progress.bar`) counting the messages read.
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**as_connection(bootstrap).kafka_python(), group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", client_id="stream-anon-audit",
                             isolation_level="read_committed",
                             allow_auto_create_topics=False)  # reading must not create topics
    try:
        parts = _partitions(consumer, topic, metadata_wait_s)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        seek_to_first(consumer, tps)
        seen: dict[tuple[str, int, int], tuple[bytes, int]] = {}
        start = last_new = time.monotonic()
        confirmed_count = -1
        quiet = False
        while time.monotonic() - start < max_wait_s:
            batch = consumer.poll(timeout_ms=500)
            before = len(seen)
            for tp_records in batch.values():
                for msg in tp_records:
                    seen.setdefault((msg.topic, msg.partition, msg.offset), (msg.value, msg.timestamp))
            now = time.monotonic()
            if progress is not None and len(seen) != before:
                progress.update(len(seen) - before)
            if len(seen) != before:
                last_new = now
                confirmed_count = -1
            elif now - last_new >= idle_s:
                if confirmed_count == len(seen):
                    quiet = True
                    break  # two quiet periods in a row with an unchanged count
                confirmed_count = len(seen)
                last_new = now
        if complete and not quiet:
            raise IncompleteRead(f"{topic}: {len(seen)} messages read in {max_wait_s:g} s and more still arriving: "
                                 "the audit needs the whole topic (raise max_wait_s, or stop the producers)")
        if with_timestamps:
            return [(src, value, ts) for src, (value, ts) in sorted(seen.items())]
        return [(src, value) for src, (value, _ts) in sorted(seen.items())]
    finally:
        consumer.close()


def _decode(value: Any) -> Any:
    try:
        obj = json.loads(value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else value)
    except (UnicodeDecodeError, ValueError, TypeError, AttributeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _parallel(calls: dict) -> dict:
    """Run ``name -> (function, args, kwargs)`` each in its own thread (one consumer each): the reads wait for
    quiet topics, so reading them side by side takes the longest read's time, not the sum."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="audit-read") as pool:
        futures = {name: pool.submit(fn, *args, **kwargs) for name, (fn, args, kwargs) in calls.items()}
        return {name: f.result() for name, f in futures.items()}


def _output_reads(bootstrap, stream: str, idle_s: float, max_wait_s: float, dp: bool) -> dict:
    names = topics()
    read = {"idle_s": idle_s, "max_wait_s": max_wait_s, "complete": True}
    return {"records": (read_topic, (bootstrap, names.records(stream)), read),
            "manifests": (read_topic, (bootstrap, names.releases), read),
            "deadletters": (read_topic, (bootstrap, names.deadletter), read),
            "aggregates": (read_topic, (bootstrap, names.aggregates),
                           {**read, "metadata_wait_s": 5.0 if dp else 1.0})}


def _outputs_of(read: dict, stream: str) -> AuditOutputs:
    out = AuditOutputs()
    for part, filter_stream in (("records", False), ("manifests", True), ("deadletters", True)):
        target = getattr(out, part)
        for _src, value in read[part]:
            obj = _decode(value)
            if obj is None:
                out.malformed.append(value)
            elif not filter_stream or obj.get("stream") == stream:
                target.append(obj)
    for _src, value in read["aggregates"]:
        obj = _decode(value)
        if obj is not None and obj.get("stream") == stream and "row_id" in obj:
            out.aggregates.append(obj)
    return out


def read_outputs(bootstrap, stream: str, idle_s: float = 3.0, max_wait_s: float = 120.0,
                 dp: bool = True) -> AuditOutputs:
    """Records of ``anon.<stream>.records`` and this stream's manifests, dead letters and committed DP rows of
    anon.aggregates (duplicates kept), the topics read side by side. ``dp`` False: a stream without ``[dp]``,
    whose aggregates topic may not exist: waited for 1 s only (rows found there still fail the DP check)."""
    return _outputs_of(_parallel(_output_reads(bootstrap, stream, idle_s, max_wait_s, dp)), stream)


# anon.metrics is written every few seconds by a running worker: it never goes quiet. The alerts are health
# figures, never the verdict, so that read is bounded instead of complete.
ALERTS_MAX_WAIT_S = 10.0


@dataclass
class KafkaInputs:
    """What the audit (and ``stream-anon report``) reads from the broker for one stream: its config, the raw
    messages (decoded for a mapped ``[input]``), the outputs and the stream's messages on anon.metrics (None: not
    read); ``reread(config)``: the raw messages as another config reads them (the audit's ``reread``)."""
    config: AuditConfig
    raw: list
    outputs: AuditOutputs
    metrics: list[dict] | None
    reread: Callable | None = None


def read_inputs(bootstrap, config_path: str | Path, secret: bytes | str, raw_topic: str | None = None,
                idle_s: float = 3.0, max_wait_s: float = 120.0, metrics: bool = True,
                allow_outside_paths: bool = False) -> KafkaInputs:
    """Read the raw topic and the outputs (every topic side by side; complete reads) and, with ``metrics``,
    anon.metrics for at most :data:`ALERTS_MAX_WAIT_S`. Raises :class:`IncompleteRead` when the raw or an output
    topic is still growing after ``max_wait_s``. ``allow_outside_paths``: the files the config names may lie
    outside its directory tree."""
    cfg = AuditConfig.from_toml(config_path, allow_outside_paths)
    if raw_topic is None:
        raw_topic = cfg.input_topic
    if raw_topic is None:
        raise ValueError(f"{config_path}: [stream] input_topic is required to find the raw topic")
    if cfg.stream is None:
        raise ValueError(f"{config_path}: [stream] name is required to find the output topics")
    calls = _output_reads(bootstrap, cfg.stream, idle_s, max_wait_s, cfg.dp is not None)
    calls["raw"] = (read_topic, (bootstrap, raw_topic), {"idle_s": idle_s, "max_wait_s": max_wait_s,
                                                         "complete": True})
    if metrics:
        calls["metrics"] = (read_metrics, (bootstrap, cfg.stream),
                            {"idle_s": idle_s, "max_wait_s": min(max_wait_s, ALERTS_MAX_WAIT_S)})
    # the reads end only after idle_s of quiet on every topic: a bar shows them working meanwhile
    with progress_bar(f"reading {cfg.stream}'s topics (until quiet for {idle_s:g} s)", unit="msg") as bar:
        for _fn, _args, kwargs in calls.values():
            kwargs["progress"] = bar
        read = _parallel(calls)
    messages = raw = read["raw"]
    secret = secret.encode() if isinstance(secret, str) else secret
    # a mapped [input] (csv, tesla-fleet-telemetry, gtfs-realtime, ...)
    decode = raw_decoder(config_path, secret, allow_outside_paths)
    if decode is not None:
        raw = decode(raw)

    def reread(config: AuditConfig) -> list:
        other = raw_decoder(config.source, secret, allow_outside_paths) if config.source else None
        return other(messages) if other is not None else messages

    return KafkaInputs(cfg, raw, _outputs_of(read, cfg.stream), read.get("metrics"), reread)


def audit_from_kafka(bootstrap, config_path: str | Path, secret: bytes | str, raw_topic: str | None = None,
                     idle_s: float = 3.0, max_wait_s: float = 120.0, health: bool = True,
                     max_prosecutor_risk: float | None = None, previous_secrets=(),
                     allow_outside_paths: bool = False, earlier_configs=()) -> AuditReport:
    """Read raw input and outputs from the broker (:func:`read_inputs`) and audit them against the stream
    config. ``health``: also read anon.metrics (for at most :data:`ALERTS_MAX_WAIT_S`) for the alerts of the
    report's health figures. Raises :class:`IncompleteRead` when the raw or an output topic is still growing after
    ``max_wait_s`` (a verdict on part of a topic would be wrong). ``max_prosecutor_risk``: the ``risk`` check
    (:class:`.risk.MaxProsecutorRisk`). ``previous_secrets``: the secrets before key rotations (:mod:`.lineages`).
    ``allow_outside_paths``: the files the config names may lie outside its directory tree. ``earlier_configs``:
    the configs (paths, or :class:`.config.AuditConfig`) in force before accepted configuration changes
    (``--earlier-config``: :mod:`.in_force`)."""
    earlier = [c if isinstance(c, AuditConfig) else AuditConfig.from_toml(c, allow_outside_paths)
               for c in earlier_configs]
    read = read_inputs(bootstrap, config_path, secret, raw_topic, idle_s, max_wait_s, metrics=health,
                       allow_outside_paths=allow_outside_paths)
    secret = secret.encode() if isinstance(secret, str) else secret
    return audit(read.raw, read.outputs, secret, read.config, alerts=read.metrics,
                 max_prosecutor_risk=max_prosecutor_risk, previous_secrets=previous_secrets, earlier_configs=earlier,
                 reread=read.reread)


def read_metrics(bootstrap, stream: str, idle_s: float = 3.0, max_wait_s: float = 120.0,
                 progress=None) -> list[dict]:
    """The messages of ``stream`` on anon.metrics (release metrics, alerts, DP window figures, ...)."""
    out = []
    for _src, value in read_topic(bootstrap, topics().metrics, idle_s=idle_s, max_wait_s=max_wait_s,
                                  progress=progress):
        obj = _decode(value)
        if obj is not None and obj.get("stream") == stream:
            out.append(obj)
    return out


def read_alerts(bootstrap, stream: str, idle_s: float = 3.0, max_wait_s: float = 120.0) -> list[dict]:
    """Alert messages (``type == "alert"``) of ``stream`` on anon.metrics."""
    return [m for m in read_metrics(bootstrap, stream, idle_s, max_wait_s) if m.get("type") == "alert"]
