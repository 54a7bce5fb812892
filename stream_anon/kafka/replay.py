"""Replay events onto a raw topic with kafka-python (acks=all, batched).

The Kafka key of every event is the keyed pseudonym (HMAC-SHA256, ``stream_anon.crypto.pseudonym``) of its privacy
unit, so all events of one individual land on one partition (and so reach one engine) in order, while the key itself
reveals nothing without the secret. ``raw_payloads`` produces bytes as they are (for bad-input tests).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sized
from pathlib import Path
from typing import Callable, Iterable, NotRequired, TypedDict, cast

import orjson

from stream_anon import crypto
from stream_anon.connection import as_connection

# an event's privacy-unit value (None: no key); a raw payload that is no JSON object is given as None
KeyFn = Callable[[dict | None], str | None]


class ReplayCounts(TypedDict):
    """What :func:`replay` returns (see there)."""
    events: int
    raw: int
    errors: int
    partitions: dict[int, int]
    seconds: NotRequired[float]
    events_per_s: NotRequired[float | None]


def _dotted(event: dict, path: str) -> object:
    cur: object = event
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def json_object(payload: bytes) -> dict | None:
    """The payload's JSON object, or None (not JSON, or not an object)."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def unit_key_fn(privacy_unit: str) -> KeyFn:
    """key_fn returning the value of the dotted ``privacy_unit`` path (e.g. ``cfg.stream.privacy_unit``)."""
    def key_fn(event: dict | None) -> str | None:
        v = _dotted(event, privacy_unit) if isinstance(event, dict) else None
        return None if v is None else str(v)
    return key_fn


def make_producer(bootstrap, **overrides):
    """kafka-python producer; ``bootstrap``: 'HOST:PORT' or a :class:`stream_anon.connection.KafkaConnection`."""
    from kafka import KafkaProducer

    settings = dict(
        **as_connection(bootstrap).kafka_python(),
        acks="all",
        linger_ms=20,
        batch_size=256 * 1024,
        max_request_size=8 * 1024 * 1024,
        compression_type=None,
        retries=5,
        # one request in flight per connection: retries cannot reorder one individual's events
        max_in_flight_requests_per_connection=1,
        client_id="stream-anon-replay",
    )
    settings.update(overrides)
    return KafkaProducer(**settings)


def encode_event(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def replay(bootstrap, topic: str, events: Iterable[dict], key_fn: KeyFn | str | None,
           progress: bool = True, raw_payloads: Iterable | None = None, secret: bytes | None = None,
           producer=None, total: int | None = None, flush_timeout_s: float = 120.0) -> ReplayCounts:
    """Produce ``events`` (JSON) and then ``raw_payloads`` (bytes, or ``(key, bytes)`` pairs) to ``topic``; a raw
    payload without a key that is a JSON object with a unit is keyed by it, as an event is.

    ``key_fn(event)`` returns the privacy-unit value (or None for no key); a string is taken as the dotted path of
    the privacy unit. The Kafka key is ``pseudonym(secret, unit)``; ``secret`` defaults to
    ``crypto.load_secret()`` (env STREAM_ANON_SECRET).

    Returns ``{"events", "raw", "errors", "partitions": {partition: count}, "seconds", "events_per_s"}``; every
    record has been acknowledged by the broker (acks=all) when it returns.
    """
    if isinstance(key_fn, str):
        key_fn = unit_key_fn(key_fn)
    if secret is None and key_fn is not None:
        secret = crypto.load_secret()
    if total is None and isinstance(events, Sized):
        total = len(events) + (len(raw_payloads) if isinstance(raw_payloads, Sized) else 0)
    own = producer is None
    producer = producer or make_producer(bootstrap)
    counts: ReplayCounts = {"events": 0, "raw": 0, "errors": 0, "partitions": {}}
    errors: list[str] = []
    lock = threading.Lock()

    def on_ok(md):
        with lock:
            counts["partitions"][md.partition] = counts["partitions"].get(md.partition, 0) + 1

    def on_err(exc):
        with lock:
            counts["errors"] += 1
            if len(errors) < 5:
                errors.append(repr(exc))

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"replay {topic}", unit="ev", mininterval=0.5,
                   disable=not sys.stderr.isatty())     # a bar only on a terminal, never in a log file
    cache: dict[str, bytes] = {}
    t0 = time.perf_counter()
    try:
        for event in events:
            key = None
            if key_fn is not None:
                assert secret is not None       # loaded above whenever there is a key_fn
                unit = key_fn(event)
                if unit is not None:
                    key = cache.get(unit)
                    if key is None:
                        key = crypto.pseudonym(secret, unit).encode()
                        if len(cache) < 1_000_000:
                            cache[unit] = key
            producer.send(topic, value=encode_event(event), key=key).add_callback(on_ok).add_errback(on_err)
            counts["events"] += 1
            if bar is not None:
                bar.update(1)
        for item in raw_payloads or ():
            key, value = item if isinstance(item, tuple) else (None, item)
            if isinstance(value, str):
                value = value.encode("utf-8")
            if isinstance(key, str):
                key = key.encode("utf-8")
            if key is None and key_fn is not None:     # a JSON object with a unit goes to the unit's partition
                assert secret is not None       # as above
                unit = key_fn(json_object(value))
                key = None if unit is None else crypto.pseudonym(secret, unit).encode()
            producer.send(topic, value=value, key=key).add_callback(on_ok).add_errback(on_err)
            counts["raw"] += 1
            if bar is not None:
                bar.update(1)
        producer.flush(timeout=flush_timeout_s)
    finally:
        if bar is not None:
            bar.close()
        if own:
            producer.close(timeout=10)
    seconds = time.perf_counter() - t0
    n = counts["events"] + counts["raw"]
    counts["seconds"] = round(seconds, 3)
    counts["events_per_s"] = round(n / seconds, 1) if seconds > 0 else None
    counts["partitions"] = dict(sorted(counts["partitions"].items()))
    if counts["errors"]:
        raise RuntimeError(f"replay to {topic}: {counts['errors']} of {n} records failed: {errors}")
    return counts


def read_jsonl(path: str | Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def replay_file(path: str | Path, topic: str, bootstrap: str, key_fn=None, **kwargs) -> ReplayCounts:
    """Replay a JSONL file (one event per line) with :func:`replay`."""
    return replay(bootstrap, topic, read_jsonl(path), key_fn, **kwargs)


def mapped_messages(path: str | Path, config, secret: bytes, limit: int | None = None, framing: str = "auto",
                    order: str = "name") -> list[tuple[bytes | None, bytes]]:
    """``(key, message)`` pairs of a file (or a directory of files) for a stream with a mapped ``[input]``: the
    messages go to the raw topic as they are in the file (a CSV record as one CSV line, a binary message as its
    bytes; framings: stream_anon/inputs/files.py), keyed by the keyed pseudonym of the privacy unit the mapping
    reads from them (no key when it cannot: the worker then dead-letters the message). A GTFS-realtime snapshot
    of several vehicles becomes one snapshot per vehicle (same header), each keyed by its vehicle.

    ValueError (naming the file) when the file cannot be read, or when not one of its messages is of the format
    (a framing mistake, e.g. a length-delimited file read as one message)."""
    from stream_anon.inputs import Decoder, file_messages
    from stream_anon.inputs.gtfs import split_feed
    from stream_anon.inputs.mapping import MULTI_EVENT_FORMATS

    decoder = Decoder(config.input, max_bytes=1 << 30, secret=secret)
    unit_path = config.stream.privacy_unit
    out: list[tuple[bytes | None, bytes]] = []
    cache: dict[str, bytes] = {}
    first_reason, readable = None, 0
    for n, raw in enumerate(file_messages(path, config.input, framing, order)):
        if limit is not None and n >= limit:
            break
        d = decoder.decode(raw, "replay", 0, n)
        if d.reason is None:
            readable += 1
        first_reason = first_reason or d.reason
        units = [None if (u := _dotted(e, unit_path)) is None else str(u) for e in d.events]
        # a message of several units' events (a GTFS-realtime snapshot) is cut into one message per unit, so each
        # unit's events land on one partition (one DP ledger, one class former); split_feed's groups are the units
        parts = cast("list[tuple[str | None, bytes]]", split_feed(raw, units)) \
            if len(set(units)) > 1 and config.input.format in MULTI_EVENT_FORMATS \
            else [(units[0] if units else None, raw)]
        for unit, message in parts:
            key = None
            if unit is not None:
                key = cache.get(unit)
                if key is None:
                    key = cache[unit] = crypto.pseudonym(secret, unit).encode()
            out.append((key, message))
    if out and not readable:
        raise ValueError(f"{path}: none of its {len(out)} messages is a {config.input.format} message (the first: "
                         f"{first_reason}); check the framing (--framing message|delimited|lines)")
    return out
