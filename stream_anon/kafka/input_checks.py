"""The checks a raw JSON message passes before the engine's reader sees it: size, JSON, object, kind and the
kind's schema (docs/contracts.md section 1). Streams with an ``[input]`` mapping are decoded by
:mod:`stream_anon.inputs` instead. A failed check is the message's dead-letter reason; nothing here raises."""
from __future__ import annotations

import orjson

from stream_anon.events import schema_ok_batch, schema_reason


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


class InputBatch:
    """A partition batch's messages as events: the built-in JSON shape (checked here) or a mapped ``[input]``
    format (``decoder``: :class:`stream_anon.inputs.Decoder`). ``events``/``sources``: the events the engine's
    reader sees and where each came from (the offset, or ``(offset, index)`` in a message holding several);
    ``rejected``: ``(source, reason, raw, event, opaque)`` for the dead letters; ``n``: events counted in."""

    __slots__ = ("events", "sources", "rejected", "n")

    def __init__(self, messages: list, config, decoder, topic: str, partition: int):
        self.events, self.sources, self.rejected, self.n = [], [], [], 0
        if decoder is None:
            for (off, raw), (reason, event) in zip(messages, check_payloads([raw for _, raw in messages], config)):
                if reason:
                    self.rejected.append((off, reason, raw, None, False))
                else:
                    self.events.append(event)
                    self.sources.append(off)
            self.n = len(messages)
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
