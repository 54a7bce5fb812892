"""Input events: flattening, event-time parsing and schema validation (docs/contracts.md section 1).

Validation runs once per event on the hot path, so each kind's JSON Schema (``topics/schemas/<kind>.schema.json``)
is loaded and compiled into a ``Draft202012Validator`` once and cached. A failure is reported as one short
reason naming the field (``"event_time: missing"``, ``"speed_kmh: expected number or null, got string"``),
which is what the dead-letter topic carries.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

EVENT_KINDS = ("fare", "vehicle")

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "topics" / "schemas"

_JSON_TYPE = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null",
              dict: "object", list: "array"}


def flatten(event: dict, prefix: str = "") -> dict:
    """Nested objects -> one flat dict with dotted keys (``{"signals": {"rpm": 1}}`` -> ``{"signals.rpm": 1}``).

    Config fields are dotted paths into the event, so this is how they are looked up. Lists stay values;
    an empty nested object contributes no key.
    """
    flat: dict = {}
    for key, value in event.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def parse_event_time(s) -> float:
    """ISO-8601 datetime with a UTC offset -> epoch seconds.

    A naive datetime is refused rather than guessed: the sources live in three time zones (London, New York,
    Natal), so a missing offset would silently shift events by hours.
    """
    if not isinstance(s, str):
        raise ValueError(f"event_time: expected an ISO-8601 string with offset, got {type(s).__name__}")
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(f"event_time: {s!r} is not an ISO-8601 datetime") from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"event_time: {s!r} has no UTC offset (expected e.g. '2009-11-09T07:31:00+00:00')")
    return dt.timestamp()


@lru_cache(maxsize=None)
def _validator(kind: str) -> Draft202012Validator:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r} (expected one of {EVENT_KINDS})")
    schema = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def validate_event(event: dict, kind: str) -> str | None:
    """None if ``event`` conforms to the ``kind`` schema, else a short reason naming the offending field.

    Beyond the schema's syntactic pattern, ``event_time`` must also be a real instant (no month 13).
    """
    validator = _validator(kind)
    if isinstance(event, dict) and "kind" in event and event["kind"] != kind:
        return f"kind: {event['kind']!r} is not {kind!r}"
    error = best_match(validator.iter_errors(event))
    if error is not None:
        return _reason(error)
    try:
        parse_event_time(event["event_time"])
    except ValueError as exc:
        return str(exc)
    return None


def _reason(error) -> str:
    path = ".".join(str(p) for p in error.absolute_path) or "event"
    instance = error.instance
    if error.validator == "required":
        missing = [name for name in error.validator_value if name not in instance]
        field = f"{path}.{missing[0]}" if path != "event" else missing[0]
        return f"{field}: missing"
    if error.validator == "additionalProperties":
        extra = sorted(set(instance) - set(error.schema.get("properties", {})))
        field = f"{path}.{extra[0]}" if path != "event" else extra[0]
        return f"{field}: unexpected field"
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return f"{path}: expected {expected}, got {_JSON_TYPE.get(type(instance), type(instance).__name__)}"
    if error.validator in ("enum", "const"):
        allowed = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"{path}: {instance!r} is not one of {allowed}"
    if error.validator == "pattern" and path == "event_time":
        return f"event_time: {instance!r} is not an ISO-8601 datetime with offset"
    if error.validator == "minLength":
        return f"{path}: empty"
    return f"{path}: {error.message}"
