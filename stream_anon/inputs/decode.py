"""One raw message (bytes) -> zero or more mapped events, or the reason it cannot be read.

A *source record* is what a format holds per event (a JSON object; a CSV record as ``{column: text}``; a Tesla
``Payload`` as ``{"vin", "created_at", "is_resend", "<Field name>": value}``; a GTFS-realtime vehicle as
``{"entity_id", "header_timestamp", "vehicle": {...}, "trip": {...}, "position": {...}, "timestamp", ...}``). The
mapping then picks, casts and converts the configured fields into a *mapped event*: a nested dict holding only the
mapped engine fields, ``event_id`` and ``event_type`` (never anything else of the source).

Accounting (the worker and the audit count alike): a message that cannot be read at all (oversized, not the
format, a feed without any vehicle) is ONE input event, dead-lettered at the message's source
``(topic, partition, offset)``; a message that holds N >= 1 events is N input events, each published,
suppressed, deferred or dead-lettered on its own. For gtfs-realtime (several events per message) an event's
dead letter names its position: source ``(topic, partition, offset, index)``.
"""
from __future__ import annotations

import csv
import hashlib
import hmac
import io
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache

import orjson

from stream_anon.inputs.files import file_messages
from stream_anon.inputs.mapping import RECORD_KEYS, FieldSpec, InputSpec
from stream_anon.inputs.values import Invalid, Undecodable


@dataclass
class Decoded:
    """The outcome for one message: ``reason`` (the whole message is unreadable), or ``events`` (N >= 1 mapped
    events, partial when their ``reasons[i]`` is set: the mapped fields that could be read, for the dead letter)."""
    reason: str | None
    events: list[dict]
    reasons: list[str | None]


class _Missing:
    pass


MISSING = _Missing()


def derived_event_id(topic: str, partition: int, offset: int, index: int | None = None) -> str:
    """``<topic>:<partition>:<offset>`` (``:<index>`` inside a multi-event message).

    >>> derived_event_id("raw.v", 2, 17), derived_event_id("feed", 0, 3, 5)
    ('raw.v:2:17', 'feed:0:3:5')
    """
    base = f"{topic}:{partition}:{offset}"
    return base if index is None else f"{base}:{index}"


class Decoder:
    """Decodes raw messages of one stream's ``[input]`` (not for the built-in JSON shape: the worker keeps its
    schema check for that)."""

    def __init__(self, spec: InputSpec, max_bytes: int = 65536, secret: bytes | None = None):
        """``secret``: keys the event ids of an ``event_key`` (the worker and the audit pass the stream's secret,
        so they derive the same ids; without it, e.g. calibrate and evaluate, a random key: ids of this decoder
        only)."""
        if spec.legacy:
            raise ValueError("the built-in JSON event shape has no mapping decoder (the worker checks its schema)")
        self.spec, self.max_bytes = spec, max_bytes
        self._key_secret = (secret or os.urandom(32)) if spec.event_key else None
        self._records = {"json": self._json_records, "csv": self._csv_records,
                         "tesla-fleet-telemetry": self._tesla_records,
                         "gtfs-realtime": self._gtfs_records}[spec.format]
        self._has_id = any(f.name == "event_id" for f in spec.fields)
        self._tables = {f.name: dict(f.lookup) for f in spec.fields if f.lookup is not None}

    # ---- one message
    def decode(self, raw: bytes | None, topic: str, partition: int, offset: int) -> Decoded:
        if raw is None:
            return Decoded("empty payload", [], [])
        if len(raw) > self.max_bytes:
            return Decoded(f"oversized payload: {len(raw)} bytes > limit {self.max_bytes}", [], [])
        try:
            records = self._records(raw)
        except ValueError as exc:
            return Decoded(str(exc), [], [])
        if not records:
            return Decoded(f"{self.spec.format}: message holds no event", [], [])
        multi = self.spec.multi
        events, reasons = [], []
        for i, rec in enumerate(records):
            event, reason = self.map_record(rec, derived_event_id(topic, partition, offset, i if multi else None))
            events.append(event)
            reasons.append(reason)
        return Decoded(None, events, reasons)

    def map_record(self, rec: dict, default_id: str) -> tuple[dict, str | None]:
        """(mapped event, first reason or None); the event holds every field that could be read."""
        event: dict = {}
        reason = None
        for f in self.spec.fields:
            value, why = self._value(f, rec)
            if why is not None:
                reason = reason or why
                continue
            _put(event, f.name, value)
        if self.spec.event_key:
            key_id, why = self._key_id(rec, event)
            event["event_id"] = key_id or default_id      # a failed key keeps the derived id (and its token)
            reason = reason or why
        elif not self._has_id:
            event["event_id"] = default_id
        elif not isinstance(event.get("event_id"), str):
            if "event_id" in event:
                event["event_id"] = str(event["event_id"])
        if self.spec.event_type is not None:
            event["event_type"] = self.spec.event_type
        return event, reason

    def _key_id(self, rec: dict, event: dict) -> tuple[str | None, str | None]:
        """The event id of a natural key: ``key:`` + keyed hash (HMAC-SHA256, 128 bits) of the key's values and of
        the mapped ``event``, so no identifier (a VIN) is in the id; or the reason the key cannot be read. A resend
        (same key, same mapped content, whatever else differs, e.g. ``is_resend``) has the first copy's id and is a
        duplicate; two readings under one key that differ in a mapped field (two positions in one second) are two
        events, never one dropped as the other's copy."""
        values = []
        for path, parts in self.spec.event_key:
            if path == RECORD_KEYS:
                values.append(sorted(rec))
                continue
            v = _find(rec, path, parts, False)
            if v is MISSING or v is None or isinstance(v, (Undecodable, Invalid)):
                what = "cannot be decoded" if isinstance(v, Undecodable) else "is missing"
                return None, f"event_id: event_key {path} {what} (input {path})"
            values.append(v)
        text = orjson.dumps([values, event], option=orjson.OPT_SORT_KEYS, default=str)
        assert self._key_secret is not None         # set with an event_key, the only case the key id is read
        return "key:" + hmac.new(self._key_secret, b"event:" + text, hashlib.sha256).hexdigest()[:32], None

    def _value(self, f: FieldSpec, rec: dict):
        value = f.const if f.has_const else _find(rec, f.source, f.parts, f.pointer)
        if isinstance(value, Undecodable):        # optional or not: absent is fine, unreadable is not
            return None, f"{f.name}: cannot decode the value: {value.why} (input {f.source})"
        if isinstance(value, Invalid):
            if f.optional:
                return None, None
            return None, f"{f.name}: the source marks the value invalid (input {f.source})"
        if self._is_null(value, f):
            if f.optional:
                return None, None
            return None, f"{f.name}: missing (input {f.source})"
        if f.lookup is not None:
            value, why = self._look_up(value, f)
            if why is not None or value is None:
                return None, why
        if f.time_format is not None:
            value, why = _time(value, f)
            if why is None and f.elapsed_parts:
                return self._add_elapsed(value, f, rec)
            return value, why
        if f.cast is not None:
            return _cast(value, f)
        if isinstance(value, (dict, list)):
            return None, f"{f.name}: expected a single value, got {'an object' if isinstance(value, dict) else 'a list'} " \
                         f"(input {f.source})"
        if isinstance(value, float) and not math.isfinite(value):
            return None, f"{f.name}: not a finite number (input {f.source})"
        return value, None

    def _is_null(self, value, f: FieldSpec) -> bool:
        nulls = self.spec.null_values if f.null_values is None else f.null_values
        return value is MISSING or value is None or (isinstance(value, str) and value in nulls)

    def _look_up(self, value, f: FieldSpec):
        """The value's entry in the field's lookup (keys are text: a JSON number is looked up as its text)."""
        if isinstance(value, (dict, list, bool)):
            return None, f"{f.name}: cannot look up {value!r} (input {f.source})"
        table = self._tables[f.name]
        key = value if isinstance(value, str) else str(value)
        if key in table:
            return table[key], None
        if f.unmatched == "keep":
            return value, None
        if f.unmatched == "null":
            return None, None
        return None, f"{f.name}: {value!r} is not in lookup {f.lookup_source} (input {f.source})"

    def _add_elapsed(self, iso: str, f: FieldSpec, rec: dict):
        raw = _find(rec, f.elapsed_source, f.elapsed_parts, False)
        if self._is_null(raw, f):
            if f.optional:
                return None, None
            return None, f"{f.name}: missing elapsed time (input {f.elapsed_source})"
        seconds = _duration_s(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else None
        if seconds is None:
            return None, f"{f.name}: expected an elapsed time H:MM[:SS] or seconds, got {raw!r} " \
                         f"(input {f.elapsed_source})"
        try:
            return _shifted(iso, seconds), None
        except (OverflowError, ValueError):       # beyond the years datetime holds: the event's problem, not ours
            return None, f"{f.name}: elapsed time {raw!r} leaves the calendar (input {f.elapsed_source})"

    # ---- formats -> source records
    def _json_records(self, raw: bytes) -> list[dict]:
        try:
            obj = orjson.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"malformed JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"malformed event: expected a JSON object, got {type(obj).__name__}")
        return [obj]

    def _csv_records(self, raw: bytes) -> list[dict]:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"csv: not UTF-8 text: {exc}") from None
        rows = list(csv.reader(io.StringIO(text), delimiter=self.spec.delimiter))
        rows = [r for r in rows if r]
        if len(rows) != 1:
            raise ValueError(f"csv: a message is one record, got {len(rows)}")
        row, cols = rows[0], self.spec.columns
        if len(row) != len(cols):
            raise ValueError(f"csv: expected {len(cols)} columns (input.columns), got {len(row)}")
        return [dict(zip(cols, row))]

    def _tesla_records(self, raw: bytes) -> list[dict]:
        from stream_anon.inputs import tesla
        return [tesla.payload_record(raw, self.spec.encoding)]

    def _gtfs_records(self, raw: bytes) -> list[dict]:
        from stream_anon.inputs import gtfs
        return gtfs.vehicle_records(raw)


# ---- field extraction
def _find(rec, source: str, parts: tuple[str, ...], pointer: bool):
    """The value at a dotted path (a key that itself contains dots first) or JSON pointer; MISSING if absent."""
    if not pointer and isinstance(rec, dict) and source in rec:
        return rec[source]
    cur = rec
    for part in parts:
        if isinstance(cur, (Undecodable, Invalid)):
            return cur
        if isinstance(cur, dict):
            if part not in cur:
                return MISSING
            cur = cur[part]
        elif isinstance(cur, list) and pointer and part.isdigit():
            i = int(part)
            if i >= len(cur):
                return MISSING
            cur = cur[i]
        else:
            return MISSING
    return cur


def _put(event: dict, name: str, value) -> None:
    parts = name.split(".")
    cur = event
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value


_TRUE, _FALSE = {"true", "1", "yes", "y", "t"}, {"false", "0", "no", "n", "f"}


def _cast(value, f: FieldSpec):
    bad = f"{f.name}: cannot cast {value!r} to {f.cast} (input {f.source})"
    if isinstance(value, (dict, list)):
        return None, bad
    if f.cast == "str":
        return (("true" if value else "false") if isinstance(value, bool) else str(value)), None
    if f.cast == "bool":
        if isinstance(value, bool):
            return value, None
        if isinstance(value, int) and value in (0, 1):
            return bool(value), None
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE, None
        return None, bad
    if isinstance(value, bool):
        return None, bad
    if f.number_text and isinstance(value, str):
        value = _number_text(value, f)
        if value is None:
            return None, bad
    try:
        if f.cast == "int":
            if isinstance(value, float):
                if not value.is_integer():
                    return None, bad
                return int(value), None
            return int(value.strip() if isinstance(value, str) else value), None
        x = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, TypeError, OverflowError):
        return None, bad
    if not math.isfinite(x):
        return None, f"{f.name}: not a finite number: {value!r} (input {f.source})"
    return x, None


def _time(value, f: FieldSpec):
    if isinstance(value, (str, int, float)):     # times repeat at the source's resolution: parse each once
        kind: type = type(value)                 # a key of the cache with the value (1 and 1.0 differ)
        return _time_cached(value, kind, f)
    return _time_parse(value, f)


@lru_cache(maxsize=65536)
def _time_cached(value, _type, f: FieldSpec):
    return _time_parse(value, f)


def _time_parse(value, f: FieldSpec):
    fmt = f.time_format
    assert fmt is not None                          # a time field's (_value decodes them only)
    try:
        if fmt in ("epoch_s", "epoch_ms") or (fmt == "auto" and isinstance(value, (int, float))
                                              and not isinstance(value, bool)):
            if isinstance(value, bool):
                raise ValueError
            if f.number_text and isinstance(value, str):
                value = _number_text(value, f)
            x = float(value)
            if fmt == "epoch_ms":
                x /= 1000.0
            if not math.isfinite(x):
                raise ValueError
            return datetime.fromtimestamp(x, tz=timezone.utc).isoformat(), None
        if not isinstance(value, str):
            raise ValueError
        dt = datetime.strptime(value.strip(), fmt) if "%" in fmt else datetime.fromisoformat(value.strip())
    except (ValueError, TypeError, OverflowError, OSError):
        want = "an ISO-8601 time" if fmt in ("auto", "iso") else f"a time in format {fmt!r}"
        return None, f"{f.name}: expected {want}, got {value!r} (input {f.source})"
    if dt.tzinfo is None or dt.utcoffset() is None:
        if f.tz is None:
            return None, f"{f.name}: time {value!r} has no UTC offset and input.timezone is not set " \
                         f"(input {f.source})"
        dt = dt.replace(tzinfo=f.tz)
    return dt.isoformat(), None


def _number_text(text: str, f: FieldSpec) -> str | None:
    """Number text as ``float()`` reads it: the unit removed, a decimal comma made a point, a lost decimal point
    put back after ``integer_digits`` digits; None when that leaves no number.

    >>> from stream_anon.inputs.mapping import FieldSpec
    >>> _number_text("74,50%", FieldSpec("x", "x", unit="%", decimal=","))
    '74.50'
    >>> _number_text("-3.520.429.461", FieldSpec("x", "x", integer_digits=2))
    '-35.20429461'
    """
    t = text.strip()
    if f.unit is not None and t.endswith(f.unit):
        t = t[:-len(f.unit)].rstrip()
    if f.integer_digits is not None:
        sign = t[:1] if t[:1] in "+-" else ""
        digits = t[len(sign):].replace(".", "").replace(",", "")
        if not digits.isdigit():
            return None
        n = f.integer_digits
        return f"{sign}{digits[:n]}.{digits[n:] or '0'}"
    if f.decimal == ",":
        if "." in t:                     # thousands separators are not read: refuse rather than guess
            return None
        t = t.replace(",", ".")
    return t


_DURATION = re.compile(r"(\d+):([0-5]\d)(?::([0-5]\d(?:\.\d+)?))?")


@lru_cache(maxsize=65536)
def _duration_s(value) -> float | None:
    """``"28:30"`` (H:MM, hours may pass 23) -> 102600.0; ``"00:03:02"`` -> 182.0; seconds as they are."""
    if isinstance(value, str):
        m = _DURATION.fullmatch(value.strip())
        if m:
            return int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3] or 0)
        try:
            value = float(value)
        except ValueError:
            return None
    return float(value) if math.isfinite(value) and value >= 0 else None


@lru_cache(maxsize=65536)
def _shifted(iso: str, seconds: float) -> str:
    """An ISO time plus elapsed seconds (real time: added in UTC), written in the time's own UTC offset."""
    dt = datetime.fromisoformat(iso)
    return (dt.astimezone(timezone.utc) + timedelta(seconds=seconds)).astimezone(dt.tzinfo).isoformat()


# ---- files (replay, evaluate, calibrate): stream_anon/inputs/files.py
def decode_file(path, spec: InputSpec, max_bytes: int = 1 << 30, topic: str | None = None,
                framing: str = "auto", order: str = "name", secret: bytes | None = None):
    """(events accepted by the mapping, [(message number, index, reason)] of the rest) for a whole file; derived
    event ids use ``topic`` (default: the file name), partition 0 and the message number as offset; ``secret``
    keys the ids of an ``event_key`` (:class:`Decoder`; a fixed one makes them the same in every run)."""
    from pathlib import Path

    topic = topic or Path(path).name
    decoder = Decoder(spec, max_bytes=max_bytes, secret=secret)
    events = []
    rejected: list[tuple[int, int | None, str]] = []       # (message number, index in it or None, reason)
    for n, raw in enumerate(file_messages(path, spec, framing, order)):
        d = decoder.decode(raw, topic, 0, n)
        if d.reason:
            rejected.append((n, None, d.reason))
            continue
        for i, (e, r) in enumerate(zip(d.events, d.reasons)):
            if r is None:
                events.append(e)
            else:
                rejected.append((n, i, r))
    return events, rejected
