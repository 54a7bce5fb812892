"""Input events: flattening, event-time parsing and schema validation (docs/contracts.md section 1).

Validation runs once per event on the hot path. Each kind's JSON Schema (``topics/schemas/<kind>.schema.json``)
is compiled once into a plain-Python predicate covering the keywords our schemas use (type, required, properties,
additionalProperties, const, enum, minLength, pattern): about 20 times faster than ``jsonschema``'s general
validator, which measured ~100 us per event and capped the worker near 2,000 events/s. The predicate only
decides *valid or not*; an invalid event is re-checked by ``jsonschema`` (``Draft202012Validator``), which
produces the reason, so the schema file stays the single source of truth and both agree (tested on mutated
events). The worker's usual batch (payloads of complete events of a flat schema) is decoded and checked in one
msgspec pass instead (:func:`decoded_columns`, :mod:`stream_anon.schema_decoder`), sound against these checks.
A failure is reported as one short reason naming the field (``"event_time: missing"``,
``"speed_kmh: expected number or null, got string"``), which is what the dead-letter topic carries.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from operator import itemgetter

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from stream_anon import contract
from stream_anon.schema_decoder import compile_schema_decoder, row_properties

# the carried "field" of accepted events' keyed 64-bit unit ids (``RecordReader.unit_ids``), for window consumers
# that count the same individuals (the DP aggregates' unit window table): no second hash of the unit, no raw id kept
UNIT_IDS = "@unit_ids"
EVENT_KINDS = ("fare", "vehicle")

SCHEMA_DIR = contract.topics_dir() / "schemas"   # read through contract.schema; kept for tests/inputs/test_events.py

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
    schema = contract.schema(kind)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


# -- fast path: the schema compiled to a predicate ----------------------------------------------------------
_SUPPORTED = {"type", "required", "properties", "additionalProperties", "const", "enum", "minLength", "pattern",
              "$schema", "$id", "title", "description"}


def _json_equal(a, b) -> bool:
    # JSON Schema equality: true is not 1, 1 equals 1.0
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


_EXACT_TYPES = {"string": (str,), "null": (type(None),), "boolean": (bool,), "number": (int, float),
                "object": (dict,), "array": (list,), "integer": (int,)}


def compile_schema(schema: dict):
    """A predicate ``value -> bool`` for ``schema``, restricted to the keywords in ``_SUPPORTED`` (raises
    ``NotImplementedError`` on any other, and the caller then uses jsonschema).

    Sound, not complete: ``True`` implies the value is valid; a few valid values may get ``False`` (a float
    equal to an integer where ``integer`` is expected, a subclass such as numpy's float64), which only sends
    them to the slower reference validator. Type checks compare exact Python types, which is what
    ``json.loads`` produces, and which keeps ``true`` out of ``integer``/``number``.
    """
    if schema is True or schema == {}:
        return lambda v: True
    if schema is False:
        return lambda v: False
    unknown = set(schema) - _SUPPORTED
    if unknown:
        raise NotImplementedError(f"schema keywords {sorted(unknown)}")
    checks: list[Callable[..., bool]] = []     # each takes a value (some with defaults bound)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        types = frozenset(t for n in names for t in _EXACT_TYPES[n])
        checks.append(lambda v, types=types: type(v) in types)
    if "const" in schema:
        checks.append(lambda v, c=schema["const"]: _json_equal(v, c))
    if "enum" in schema:
        if all(isinstance(e, str) or e is None for e in schema["enum"]):
            allowed = frozenset(schema["enum"])    # strings and null: a set lookup is exact
            checks.append(lambda v, a=allowed: (v is None or type(v) is str) and v in a)
        else:
            checks.append(lambda v, e=tuple(schema["enum"]): any(_json_equal(v, x) for x in e))
    if "minLength" in schema:
        checks.append(lambda v, n=schema["minLength"]: not isinstance(v, str) or len(v) >= n)
    if "pattern" in schema:
        rx = re.compile(schema["pattern"])
        checks.append(lambda v, rx=rx: not isinstance(v, str) or rx.search(v) is not None)
    if {"required", "properties", "additionalProperties"} & set(schema):
        required = tuple(schema.get("required", ()))
        props = {k: compile_schema(v) for k, v in schema.get("properties", {}).items()}
        extra = schema.get("additionalProperties", True)
        extra_check = (None if extra is True else (lambda v: False) if extra is False else compile_schema(extra))

        def check_object(v, required=required, props=props, extra_check=extra_check):
            if type(v) is not dict:
                return not isinstance(v, dict)         # object keywords ignore non-objects
            for name in required:
                if name not in v:
                    return False
            get = props.get
            for name, value in v.items():
                sub = get(name)
                if sub is not None:
                    if not sub(value):
                        return False
                elif extra_check is not None and not extra_check(value):
                    return False
            return True
        checks.append(check_object)
    if len(checks) == 1:
        return checks[0]
    all_checks = tuple(checks)

    def check_all(v):
        for c in all_checks:
            if not c(v):
                return False
        return True
    return check_all


def compile_schema_batch(schema: dict):
    """A predicate ``values -> bool`` for a list of values: True only if :func:`compile_schema`'s predicate holds
    for every one of them (sound, like it; a False sends the caller to the per-value checks, which name the
    offending value). The checks run a column at a time (an object schema checks each property over every object
    at once), so a batch of events of one producer costs a few C-level passes per field instead of closures per
    value. Raises ``NotImplementedError`` where :func:`compile_schema` does."""
    if schema is True or schema == {}:
        return lambda vs: True
    if schema is False:
        return lambda vs: not vs
    unknown = set(schema) - _SUPPORTED
    if unknown:
        raise NotImplementedError(f"schema keywords {sorted(unknown)}")
    one = compile_schema(schema)

    def each(vs) -> bool:                       # the per-value predicate, for what a column check cannot decide
        return all(map(one, vs))

    checks: list[Callable[..., bool]] = []     # each takes a list of values
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        types = frozenset(t for n in names for t in _EXACT_TYPES[n])
        checks.append(lambda vs, types=types: set(map(type, vs)) <= types)
    text_or_null = (str, type(None))
    if "const" in schema:
        c = schema["const"]
        if isinstance(c, str):
            checks.append(lambda vs, c=c: set(map(type, vs)) <= {str} and set(vs) <= {c})
        else:
            checks.append(each)
    if "enum" in schema:
        if all(isinstance(e, str) or e is None for e in schema["enum"]):
            allowed = frozenset(schema["enum"])
            checks.append(lambda vs, a=allowed: set(map(type, vs)) <= set(text_or_null) and set(vs) <= a)
        else:
            checks.append(each)
    if "minLength" in schema:
        n = schema["minLength"]
        checks.append(lambda vs, n=n: min(map(len, vs), default=n) >= n if set(map(type, vs)) <= {str}
                      else each(vs))
    if "pattern" in schema:
        rx = re.compile(schema["pattern"])

        def pattern(vs, rx=rx):
            if not set(map(type, vs)) <= {str}:
                return each(vs)
            return all(rx.search(v) is not None for v in set(vs))      # each distinct text once
        checks.append(pattern)
    if {"required", "properties", "additionalProperties"} & set(schema):
        required = tuple(schema.get("required", ()))
        props = {k: compile_schema_batch(v) for k, v in schema.get("properties", {}).items()}
        extra = schema.get("additionalProperties", True)

        def check_objects(vs, required=required, props=props, extra=extra):
            kinds = set(map(type, vs))
            if kinds != {dict}:
                if any(t is not dict and issubclass(t, dict) for t in kinds):
                    return False                       # a dict subclass: the per-value check decides
                vs = [v for v in vs if type(v) is dict]     # object keywords ignore non-objects
                if not vs:
                    return True
            present = 0
            for name, check in props.items():
                try:
                    column = list(map(itemgetter(name), vs))
                except KeyError:
                    if name in required:
                        return False
                    column = [v[name] for v in vs if name in v]
                present += len(column)
                if column and not check(column):
                    return False
            for name in required:
                if name not in props and not all(name in v for v in vs):
                    return False
            if present != sum(map(len, vs)) and extra is not True:    # keys beyond the properties
                return each(vs)
            return True
        checks.append(check_objects)
    if len(checks) == 1:
        return checks[0]
    all_checks = tuple(checks)
    return lambda vs: all(c(vs) for c in all_checks)


def compile_schema_columns(schema: dict):
    """For an object schema: ``events -> columns or None``. When every event is a plain dict holding exactly the
    schema's properties (a batch of one producer writing every field) and each property's values pass their column
    check (:func:`compile_schema_batch`), the batch is valid and the result is its columns (property name -> tuple
    of the values, in event order); otherwise None, and the caller decides with the general checks. Sound as they
    are: such events meet ``required`` (a subset of the properties), ``additionalProperties`` (no other key) and
    ``type``. Each event is read once for all its properties (one C-level ``itemgetter`` call), about half the cost
    of a pass per property, and the columns serve the engine's reader too. Raises ``NotImplementedError`` for a
    schema outside that shape (:func:`stream_anon.schema_decoder.row_properties`)."""
    props = row_properties(schema)
    names = tuple(props)
    checks = tuple(compile_schema_batch(props[name]) for name in names)
    row, width = itemgetter(*names), len(names)

    def columns(events):
        if not events:
            return {name: () for name in names}
        if set(map(type, events)) != {dict} or sum(map(len, events)) != width * len(events):
            return None
        try:
            cols = tuple(zip(*map(row, events)))
        except KeyError:
            return None
        for check, col in zip(checks, cols):
            if not check(col):
                return None
        return dict(zip(names, cols))
    return columns


@lru_cache(maxsize=None)
def _compiled(kind: str, compiler):
    """``compiler`` applied to the ``kind`` schema once (the kind checked and the schema verified by
    :func:`_validator`); None where the schema uses what the compilers do not cover (the validator decides)."""
    _validator(kind)
    try:
        return compiler(contract.schema(kind))
    except NotImplementedError:
        return None


def _fast_columns(kind: str):
    return _compiled(kind, compile_schema_columns)


def schema_columns(events: list, kind: str) -> dict | None:
    """The columns of the ``kind`` schema's properties (name -> tuple of values) when every event is valid and
    holds all of them (:func:`compile_schema_columns`); None when not shown that way: :func:`schema_ok_batch` and
    :func:`schema_reason` then decide."""
    columns = _fast_columns(kind)
    return None if columns is None else columns(events)


def compile_decoded_columns(schema: dict):
    """``payloads -> columns or None``: :func:`stream_anon.schema_decoder.compile_schema_decoder`, whose columns
    then pass the ``pattern`` checks of :func:`compile_schema_batch` (each distinct text once)."""
    decode = compile_schema_decoder(schema)
    patterns = tuple((name, compile_schema_batch({"pattern": prop["pattern"]}))
                     for name, prop in schema["properties"].items() if "pattern" in prop)

    def columns(payloads: list) -> dict | None:
        cols = decode(payloads)
        if cols is None or not all(check(cols[name]) for name, check in patterns):
            return None
        return cols
    return columns


def decoded_columns(payloads: list, kind: str) -> dict | None:
    """The columns of a batch of JSON payloads decoded and checked against the ``kind`` schema
    (:func:`compile_decoded_columns`): property name -> tuple of values, when every payload is a valid event holding
    every property; None when not shown that way (the general checks decide)."""
    columns = _compiled(kind, compile_decoded_columns)
    return None if columns is None else columns(payloads)


def _fast_batch_check(kind: str):
    return _compiled(kind, compile_schema_batch)


def schema_ok_batch(events: list, kind: str) -> bool:
    """True if every event of the list conforms to the ``kind`` schema (checked a field at a time); False means
    some may not: :func:`schema_reason` then decides each."""
    check = _fast_batch_check(kind)
    return check is not None and check(events)


def _fast_check(kind: str):
    return _compiled(kind, compile_schema)


def schema_reason(event: dict, kind: str) -> str | None:
    """None if ``event`` conforms to the ``kind`` schema, else a short reason naming the offending field (the
    schema only: the engine's reader parses the event time)."""
    fast = _fast_check(kind)                                   # raises on an unknown kind
    if isinstance(event, dict) and "kind" in event and event["kind"] != kind:
        return f"kind: {event['kind']!r} is not {kind!r}"
    if fast is None or not fast(event):
        error = best_match(_validator(kind).iter_errors(event))
        if error is not None:
            return _reason(error)
    return None


def validate_event(event: dict, kind: str) -> str | None:
    """:func:`schema_reason`, and ``event_time`` must also be a real instant (no month 13)."""
    reason = schema_reason(event, kind)
    if reason:
        return reason
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
