"""The checks a raw JSON message passes before the engine's reader sees it: size, JSON, object, kind and the
kind's schema (docs/contracts.md section 1). Streams with an ``[input]`` mapping are decoded by
:mod:`stream_anon.inputs` instead. A failed check is the message's dead-letter reason; nothing here raises."""
from __future__ import annotations

from collections.abc import Sequence
from operator import methodcaller

import orjson

from stream_anon.events import decoded_columns, schema_columns, schema_ok_batch, schema_reason

_KIND = methodcaller("get", "kind")


def check_payload(raw: bytes | None, config) -> tuple[str | None, dict | None]:
    """(reason, None) for bad input, (None, event) for an event the engine's reader may see: size, JSON, kind and
    the kind's schema. Event type, privacy unit, time and quasi-identifiers are checked once, by the reader
    (:class:`stream_anon.engine.RecordReader`). Never raises: an exception while checking one payload is its
    reason (``unreadable payload: <exception class>``)."""
    reason, event = parse_payload(raw, config)
    if reason or event is None:          # parse_payload gives an event exactly when it gives no reason
        return reason, None
    return check_payload_schema(event, config)


def check_payloads(raws: list, config) -> list[tuple[str | None, dict | None]]:
    """:func:`check_payload` of each payload of a batch (:func:`check_batch`, one result per payload)."""
    events, rejected, _ = check_batch(raws, config)
    out: list[tuple[str | None, dict | None]] = []
    it, reasons = iter(events), dict(rejected)
    for i in range(len(raws)):
        reason = reasons.get(i)
        out.append((reason, None) if reason else (None, next(it)))
    return out


def check_batch(raws: list, config) -> tuple[Sequence[dict], list[tuple[int, str]], dict | None]:
    """(events, rejected, columns): the events of the payloads that pass :func:`check_payload`, in order;
    ``(position, reason)`` of the others, in order; and, when the schema check could give them, the events' columns
    (property -> values, aligned with ``events``; :func:`stream_anon.events.schema_columns`) for the engine's
    reader. A batch of complete, valid events is decoded straight to columns (:func:`decoded_columns`; its events
    are parsed when read: :class:`ParsedOnRead`); otherwise the batch is parsed as a whole and checked a field at a
    time, and payload by payload only where that fails."""
    kind = config.stream.kind
    if _all_within(raws, config.limits.max_event_bytes):
        columns = decoded_columns(raws, kind)
        if columns is not None:
            return ParsedOnRead(raws), [], columns
    events, rejected = parse_payloads(raws, config)
    try:
        columns = schema_columns(events, kind)
        all_valid = columns is not None or schema_ok_batch(events, kind)
    except Exception:   # noqa: BLE001 - the per-event checks decide (and name the reason)
        columns, all_valid = None, False
    if all_valid:
        return events, rejected, columns
    refused = {i for i, _ in rejected}
    positions = [i for i in range(len(raws)) if i not in refused]
    valid = []
    for i, event in zip(positions, events):
        reason, _ = check_payload_schema(event, config)
        if reason:
            rejected.append((i, reason))
        else:
            valid.append(event)
    rejected.sort(key=lambda r: r[0])
    return valid, rejected, None


class ParsedOnRead(Sequence):
    """The events of payloads already checked, each parsed (``orjson.loads``, as :func:`parse_payloads`) when it
    is first read: a batch decoded to columns is read through them, and only its events that are dead-lettered or
    isolated later are parsed again."""

    __slots__ = ("_raws", "_parsed")

    def __init__(self, raws: list):
        self._raws = raws
        self._parsed: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self._raws)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self._raws))[i]
        event = self._parsed.get(i)
        if event is None:
            event = self._parsed[i] = orjson.loads(self._raws[i])
        return event


def parse_payloads(raws: list, config) -> tuple[list[dict], list[tuple[int, str]]]:
    """(events, rejected): :func:`parse_payload` of each payload, the parsed events in order and ``(position,
    reason)`` of the payloads refused. A batch of payloads that all pass (the usual one) is parsed in C-level
    passes; any doubt sends it payload by payload, which gives the reasons."""
    kind = config.stream.kind
    try:
        events = _parse_all(raws, config.limits.max_event_bytes)
        if events is not None and set(map(type, events)) <= {dict} and set(map(_KIND, events)) <= {kind}:
            return events, []
    except Exception:   # noqa: BLE001 - malformed or unhashable: decided payload by payload
        pass
    events, rejected = [], []
    for i, raw in enumerate(raws):
        reason, event = parse_payload(raw, config)
        if reason:
            rejected.append((i, reason))
        else:
            events.append(event)
    return events, rejected


def _parse_all(raws: list, limit: int) -> list | None:
    """Every payload parsed (raises on malformed JSON); None when one is missing or over ``limit`` bytes."""
    return list(map(orjson.loads, raws)) if _all_within(raws, limit) else None


def _all_within(raws: list, limit: int) -> bool:
    """Every payload present and at most ``limit`` bytes."""
    return None not in raws and max(map(len, raws), default=0) <= limit


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


class InputBatch:
    """A partition batch's messages as events: the built-in JSON shape (checked here) or a mapped ``[input]``
    format (``decoder``: :class:`stream_anon.inputs.Decoder`). ``events``/``sources``: the events the engine's
    reader sees and where each came from (the offset, or ``(offset, index)`` in a message holding several);
    ``columns``: the events' fields as columns when the checks could give them (:func:`check_batch`), else None;
    ``rejected``: ``(source, reason, raw, event, opaque)`` for the dead letters; ``n``: events counted in."""

    __slots__ = ("events", "sources", "columns", "rejected", "n")

    def __init__(self, messages: list, config, decoder, topic: str, partition: int):
        self.events: Sequence[dict] = []
        self.sources: list = []
        self.columns: dict | None = None
        self.rejected: list = []
        self.n = 0
        if decoder is None:
            offsets = [off for off, _ in messages]
            raws = [raw for _, raw in messages]
            self.events, rejected, self.columns = check_batch(raws, config)
            self.n = len(messages)
            if not rejected:
                self.sources = offsets
                return
            refused = set()
            for i, reason in rejected:
                refused.add(i)
                self.rejected.append((offsets[i], reason, raws[i], None, False))
            self.sources = [off for i, off in enumerate(offsets) if i not in refused]
            return
        multi = config.input.multi
        for off, raw in messages:
            # an unreadable message is one event (dead letter at its offset); a message of N events is N events
            # (stream_anon.inputs.decode), each dead-lettered on its own (with its index when the format holds
            # several per message)
            d = decoder.decode(raw, topic, partition, off)
            if d.reason:
                self.n += 1
                self.rejected.append((off, d.reason, raw, None, True))
                continue
            for i, (event, reason) in enumerate(zip(d.events, d.reasons)):
                self.n += 1
                source = (off, i) if multi else off
                if reason:
                    self.rejected.append((source, reason, None, event, False))
                else:
                    self.events.append(event)
                    self.sources.append(source)
