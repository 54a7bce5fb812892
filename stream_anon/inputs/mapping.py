"""The ``[input]`` table of a stream config: which format the raw topic carries and where each engine field comes
from (every key: docs/configuration.md). Validated here with stream_anon.validation (errors name the key, e.g.
``input.fields.speed_kmh.cast: ...``; unknown keys are refused), without the engine's config module: the audit
parses the same table to decode the raw topic on its own.

::

    [input]
    format = "csv"                      # json (default) | csv | tesla-fleet-telemetry | gtfs-realtime
    columns = ["tripduration", "starttime", ...]   # csv: the column names of each record (the file's header)
    null_values = ["", "NULL"]          # strings that mean "no value" (csv default [""], else [])
    timezone = "America/New_York"       # default zone of times written without a UTC offset
    event_type = "trip"                 # constant event type (default: the stream's only event type)

    [input.fields]                      # engine field = source (a dotted path, or a table)
    vehicle_id = "bikeid"
    event_time = { path = "starttime", time_format = "%Y-%m-%d %H:%M:%S" }
    latitude = { path = "start station latitude", cast = "float" }
    "signals.birth_year" = { path = "birth year", cast = "float", optional = true }
    rpm = { pointer = "/signals/engine~1rpm", cast = "float" }

A field table takes ``path`` (dotted; a key that itself contains dots is found first) or ``pointer`` (RFC 6901
JSON pointer), or ``value`` (a constant); ``cast`` (int, float, str, bool); ``optional`` (a missing value is null
instead of a dead letter); ``null_values`` (this field's own, instead of the input's); for times ``time_format``
(``iso``, ``epoch_s``, ``epoch_ms`` or a ``strptime`` pattern) and ``timezone``. The stream's event time is always
a time field (default format: ISO-8601 text, or epoch seconds when the value is a number); another field becomes
one by naming a ``time_format``.

What real exports need besides (each applied in this order, all optional):

- ``lookup``: the value is replaced by its entry in a table: an inline table ``{BEGINTRIP = "tap_in", ...}`` or
  a CSV file (path relative to the config file; header line, then ``source value,result`` per line; further
  columns ignored). ``unmatched``: what a value without an entry becomes: ``"reject"`` (default: a dead letter
  naming the field), ``"keep"`` (the value as it is: for tables of corrections such as station spellings) or
  ``"null"``.
- Number text (with ``cast`` int/float, or an epoch ``time_format``): ``unit`` (a unit written after the number,
  ``"48km/h"``, removed when present), ``decimal = ","`` (a decimal comma, ``"74,50"``; also in exponent notation,
  ``"1,51336E+12"``), ``integer_digits`` (the number lost its decimal point to thousands separators, as a
  spreadsheet in a locale with a decimal comma writes ``-5.8321307`` as ``-58.321.307``: every separator is
  dropped and the point put back after this many digits).
- ``elapsed`` (time fields): the path of a duration added to the time (``H:MM`` or ``H:MM:SS``, hours may pass 23,
  as in GTFS stop times and service-day clocks; or a number of seconds), e.g. a constant service date plus a
  column ``"28:30"``, or a recording's start plus the engine runtime. Elapsed time: added in UTC, so a day with a
  clock change still counts real hours.

``format = "json"`` with no ``[input.fields]`` is the built-in event shape (docs/contracts.md section 1): the kind's
JSON Schema, no mapping. Every other case is a mapped input: only mapped fields (plus ``event_id`` and
``event_type``) reach the engine; nothing else of the source is passed through.

Event ids: a mapped ``event_id`` field, else derived from where the message was read,
``<topic>:<partition>:<offset>`` (and ``:<index>`` for formats whose message holds several events, i.e.
gtfs-realtime), so the worker and the audit derive the same id, hence the same audit token.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import tzinfo

from stream_anon.errors import ConfigError
from stream_anon.validation import ConfigDir, Table, check_number

FORMATS = ("json", "csv", "tesla-fleet-telemetry", "gtfs-realtime")
MULTI_EVENT_FORMATS = ("gtfs-realtime",)          # one message may hold several events
CASTS = ("int", "float", "str", "bool")
TIME_FORMATS = ("iso", "epoch_s", "epoch_ms")
EPOCH_FORMATS = ("epoch_s", "epoch_ms")
UNMATCHED = ("reject", "keep", "null")
TESLA_ENCODINGS = ("auto", "protobuf", "json")
MAX_INTEGER_DIGITS = 18                           # a float holds no more significant digits
# the keys of [input] and of a field's table (docs/configuration.md lists the same)
INPUT_KEYS = ("format", "fields", "columns", "delimiter", "null_values", "timezone", "event_type", "encoding",
              "event_key")
RECORD_KEYS = "$keys"                             # event_key entry: the sorted key names of the source record
FIELD_KEYS = ("path", "pointer", "value", "cast", "optional", "time_format", "timezone", "null_values", "lookup",
              "unmatched", "unit", "decimal", "integer_digits", "elapsed")


@dataclass(frozen=True)
class FieldSpec:
    name: str                                 # engine field (dotted path of the event the engine reads)
    source: str                               # as written in the config, for reasons
    parts: tuple[str, ...] = ()               # path segments (dotted path) or pointer tokens
    pointer: bool = False
    const: object = None
    has_const: bool = False
    cast: str | None = None
    optional: bool = False
    time_format: str | None = None            # set for time fields
    tz: tzinfo | None = None                  # ZoneInfo for naive times
    null_values: frozenset | None = None      # this field's own (None: the input's)
    lookup: tuple[tuple[str, object], ...] | None = None    # (source value, result) pairs
    lookup_source: str = ""                   # the CSV file or "inline table", for reasons
    unmatched: str = "reject"
    unit: str | None = None                   # number text: trailing unit, decimal separator, lost decimal point
    decimal: str = "."
    integer_digits: int | None = None
    elapsed_parts: tuple[str, ...] = ()       # path of a duration added to the time
    elapsed_source: str = ""

    @property
    def number_text(self) -> bool:
        """Number text is rewritten before the cast (unit, decimal comma, lost decimal point)."""
        return self.unit is not None or self.decimal != "." or self.integer_digits is not None


@dataclass(frozen=True)
class InputSpec:
    format: str = "json"
    fields: tuple[FieldSpec, ...] = ()
    columns: tuple[str, ...] = ()
    delimiter: str = ","
    null_values: frozenset = frozenset()
    event_type: str | None = None             # constant, when event_type is not a mapped field
    encoding: str = "auto"                    # tesla-fleet-telemetry: protobuf, json or auto (by first byte)
    event_key: tuple[tuple[str, tuple[str, ...]], ...] = ()   # (source path, its parts): the natural event key
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def legacy(self) -> bool:
        """The built-in JSON event shape (schema-checked, no mapping): today's behaviour."""
        return self.format == "json" and not self.fields

    @property
    def multi(self) -> bool:
        return self.format in MULTI_EVENT_FORMATS

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)


def _pointer_tokens(ptr: str, key: str) -> tuple[str, ...]:
    if ptr == "":
        return ()
    if not ptr.startswith("/"):
        raise ConfigError(f"{key}: a JSON pointer starts with '/', got {ptr!r}")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in ptr[1:].split("/"))


def _source(t: Table) -> dict:
    """Where a field's value comes from: exactly one of ``path``, ``pointer`` or ``value``."""
    given = [k for k in ("path", "pointer", "value") if k in t]
    if len(given) != 1:
        raise ConfigError(f"{t.path}: give exactly one of path, pointer or value")
    if given[0] == "path":
        path = t.text("path")
        return {"source": path, "parts": tuple(path.split("."))}
    if given[0] == "pointer":
        ptr = t.get("pointer")
        if not isinstance(ptr, str):
            raise ConfigError(f"{t.key('pointer')}: expected a JSON pointer, got {ptr!r}")
        return {"source": ptr, "parts": _pointer_tokens(ptr, t.key("pointer")), "pointer": True}
    value = t.get("value")
    if not isinstance(value, (str, int, float, bool)):
        raise ConfigError(f"{t.key('value')}: expected a constant string, number or boolean, got {value!r}")
    if isinstance(value, float):
        check_number(value, t.key("value"))
    return {"source": f"constant {value!r}", "const": value, "has_const": True}


def _parse_field(name: str, spec, default_tz, is_time: bool, base_dir) -> FieldSpec:
    key = f"input.fields.{name}"
    if isinstance(spec, str):
        spec = {"pointer": spec} if spec.startswith("/") else {"path": spec}
    if not isinstance(spec, dict):
        raise ConfigError(f"{key}: expected a source path or a table, got {type(spec).__name__}")
    t = Table(spec, key, FIELD_KEYS)
    kw = _source(t)
    cast = t.choice("cast", CASTS, None)
    optional = t.boolean("optional", False)
    tf = t.get("time_format", None)
    if tf is not None:
        if not isinstance(tf, str) or not (tf in TIME_FORMATS or "%" in tf):
            raise ConfigError(f"{t.key('time_format')}: expected one of {', '.join(TIME_FORMATS)} or a strptime "
                              f"pattern such as '%Y-%m-%d %H:%M:%S', got {tf!r}")
        is_time = True
    tz = t.timezone("timezone", None)
    is_time = is_time or tz is not None
    if is_time and cast is not None:
        raise ConfigError(f"{t.key('cast')}: a time field is converted by time_format, not cast")
    nulls = t.strings("null_values", None, allow_empty=True)
    if nulls is not None:
        kw["null_values"] = frozenset(nulls)
    if "lookup" in t:
        kw.update(_parse_lookup(t.get("lookup"), t.key("lookup"), base_dir))
        kw["unmatched"] = t.choice("unmatched", UNMATCHED, "reject")
    elif "unmatched" in t:
        raise ConfigError(f"{t.key('unmatched')}: only with a lookup")
    kw.update(_parse_number_text(t, cast, tf))
    if "elapsed" in t:
        if not is_time:
            raise ConfigError(f"{t.key('elapsed')}: only for a time field (the event time, or a field with a "
                              f"time_format)")
        path = t.text("elapsed")
        kw.update(elapsed_parts=tuple(path.split(".")), elapsed_source=path)
    t.done()
    return FieldSpec(name=name, cast=cast, optional=optional, time_format=(tf or "auto") if is_time else None,
                     tz=tz if tz is not None else default_tz, **kw)


def _parse_lookup(table, key: str, base_dir) -> dict:
    """An inline table, or a CSV file (relative to the config's directory): ``lookup`` and ``lookup_source``."""
    if isinstance(table, dict):
        for k, v in table.items():
            if not isinstance(v, (str, int, float, bool)):
                raise ConfigError(f"{key}.{_quote(k)}: expected a string, number or boolean, got {v!r}")
        return {"lookup": tuple(sorted(table.items())), "lookup_source": "inline table"}
    if not isinstance(table, str) or not table:
        raise ConfigError(f"{key}: expected an inline table or the path of a CSV file, got {table!r}")
    path = ConfigDir.of(base_dir).resolve(table, key)       # inside the config's directory tree unless allowed
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{key}: cannot read {table!r} ({path}): {exc}") from None
    entries: dict[str, str] = {}
    for n, row in enumerate(rows[1:], start=2):      # rows[0]: the header
        if not row:
            continue
        if len(row) < 2:
            raise ConfigError(f"{key}: {table}: line {n}: expected source value,result")
        if row[0] in entries:
            raise ConfigError(f"{key}: {table}: line {n}: {row[0]!r} appears twice")
        entries[row[0]] = row[1]
    if not entries:
        raise ConfigError(f"{key}: {table}: no entries (a header line, then source value,result per line)")
    return {"lookup": tuple(sorted(entries.items())), "lookup_source": str(table)}


def _parse_number_text(t: Table, cast, tf) -> dict:
    given = [k for k in ("unit", "decimal", "integer_digits") if k in t]
    if not given:
        return {}
    if cast not in ("int", "float") and tf not in EPOCH_FORMATS:
        raise ConfigError(f"{t.key(given[0])}: only for numbers: with cast int or float, or an epoch time_format")
    kw: dict = {}
    if "unit" in t:
        unit = t.get("unit")
        if not isinstance(unit, str) or not unit.strip() or any(c.isdigit() for c in unit):
            raise ConfigError(f"{t.key('unit')}: expected the unit written after the number (no digits), got "
                              f"{unit!r}")
        kw["unit"] = unit
    if "decimal" in t:
        kw["decimal"] = t.choice("decimal", (".", ","))
    if "integer_digits" in t:
        if cast != "float":
            raise ConfigError(f"{t.key('integer_digits')}: only with cast float (the decimal point is put back)")
        kw["integer_digits"] = t.integer("integer_digits", 1, MAX_INTEGER_DIGITS)
    return kw


def parse_input(table, event_time: str = "event_time", event_types: tuple[str, ...] = (),
                required: dict[str, str] | None = None, base_dir=None) -> InputSpec:
    """Validate an ``[input]`` table (None: the built-in JSON shape). ``base_dir``: the config file's directory
    (or its :class:`~stream_anon.validation.ConfigDir`), where the CSV files of lookups are found and whose tree
    they must lie in (default: the working directory).

    ``required``: engine field -> its role (``"privacy unit"``, ``"quasi-identifier time"``, ...): each must be
    mapped, and a mapped field must be one of them (a field nobody reads is refused, so nothing is carried that
    the stream does not need). The audit passes None (the engine's config has checked it).

    >>> parse_input({"format": "csv", "colums": ["a"]})
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: input.colums: unknown key; did you mean columns?
    """
    if table is None:
        return InputSpec()
    t = Table(table, "input", INPUT_KEYS)
    fmt = t.choice("format", FORMATS, "json")
    default_tz = t.timezone("timezone", None)
    raw_fields = t.mapping("fields", {})
    if fmt != "json" and not raw_fields:
        raise ConfigError(f"input.fields: format {fmt!r} needs a mapping: [input.fields] engine field = source")
    fields = _parse_fields(raw_fields, event_time, default_tz, base_dir)
    columns = t.strings("columns", (), allow_empty=True)
    if fmt == "csv":
        _check_columns(columns, fields)
    elif columns:
        raise ConfigError("input.columns: only for format 'csv'")
    delimiter = t.get("delimiter", ",")
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise ConfigError(f"input.delimiter: expected one character, got {delimiter!r}")
    nulls = t.strings("null_values", ("",) if fmt == "csv" else (), allow_empty=True)
    if "encoding" in t and fmt != "tesla-fleet-telemetry":
        raise ConfigError(f"input.encoding: only for format 'tesla-fleet-telemetry': one of "
                          f"{', '.join(TESLA_ENCODINGS)}")
    encoding = t.choice("encoding", TESLA_ENCODINGS, "auto")
    event_type = _event_type(t, fmt, fields, event_types, required)
    event_key = _event_key(t, fmt, fields, columns)
    t.done()
    return InputSpec(format=fmt, fields=tuple(fields), columns=tuple(columns), delimiter=delimiter,
                     null_values=frozenset(nulls), event_type=event_type, encoding=encoding, event_key=event_key,
                     raw=dict(table))


def _event_key(t: Table, fmt: str, fields: list[FieldSpec], columns) -> tuple:
    """``event_key``: source paths whose values identify an event (``"$keys"``: the record's key names, e.g. a
    Tesla Payload's field set). Its keyed hash with the mapped event becomes the event id (``Decoder._key_id``),
    so a copy of an event (a resend) is a ``duplicate_event`` within the duplicate horizon, whatever its offset."""
    if "event_key" not in t:
        return ()
    if fmt == "json" and not fields:
        raise ConfigError("input.event_key: only with a mapping ([input.fields]) or another format than json")
    if any(f.name == "event_id" for f in fields):
        raise ConfigError("input.event_key: give event_key or map input.fields.event_id, not both")
    paths = t.strings("event_key", min_items=1)
    if len(set(paths)) != len(paths):
        raise ConfigError("input.event_key: a path appears twice")
    for p in paths:
        if not p or p.startswith(".") or p.endswith(".") or ".." in p:
            raise ConfigError(f"input.event_key: {p!r} is not a source path (dotted, or \"{RECORD_KEYS}\")")
        if fmt == "csv" and p != RECORD_KEYS and p not in columns:
            raise ConfigError(f"input.event_key: column {p!r} is not in input.columns")
    return tuple((p, tuple(p.split("."))) for p in paths)


def _parse_fields(raw_fields: dict, event_time: str, default_tz, base_dir) -> list[FieldSpec]:
    """[input.fields]: engine field = source, in name order; no field inside another."""
    names = sorted(raw_fields)
    for i, a in enumerate(names):       # "a" and "a.b" cannot both be fields of one nested event
        for b in names[i + 1:]:
            if b.startswith(a + "."):
                raise ConfigError(f"input.fields.{b}: conflicts with input.fields.{a} (one is inside the other)")
    fields = []
    for name in names:
        if not name or name.startswith(".") or name.endswith(".") or ".." in name:
            raise ConfigError(f"input.fields.{name}: engine field names are dotted paths")
        fields.append(_parse_field(name, raw_fields[name], default_tz, is_time=(name == event_time),
                                   base_dir=base_dir))
    return fields


def _check_columns(columns: tuple[str, ...], fields: list[FieldSpec]) -> None:
    """format csv: the columns are given, distinct, and every mapped source is one of them."""
    if not columns:
        raise ConfigError("input.columns: required for format 'csv': the column names of each record (the header "
                          "line of your file)")
    if len(set(columns)) != len(columns):
        raise ConfigError("input.columns: duplicate column names")
    for f in fields:
        if not f.has_const and (f.parts[0] if f.pointer else f.source) not in columns:
            raise ConfigError(f"input.fields.{f.name}: column {f.source!r} is not in input.columns")
        if f.elapsed_source and f.elapsed_source not in columns:
            raise ConfigError(f"input.fields.{f.name}.elapsed: column {f.elapsed_source!r} is not in input.columns")


def _event_type(t: Table, fmt: str, fields: list[FieldSpec], event_types, required) -> str | None:
    """The constant event type of a mapped input (or None when mapped as a field); the mapped fields are exactly
    the ones the stream reads (``required``)."""
    event_type = t.get("event_type", None)
    by_name = {f.name: f for f in fields}
    if fmt == "json" and not fields:
        if event_type is not None:
            raise ConfigError("input.event_type: only with a mapping ([input.fields]) or another format than json")
        return None
    if event_type is not None and "event_type" in by_name:
        raise ConfigError("input.event_type: give a constant event_type or map input.fields.event_type, not both")
    if event_type is None and "event_type" not in by_name:
        if len(event_types) != 1:
            raise ConfigError(f"input.event_type: the stream accepts several event types {list(event_types)}: map "
                              "input.fields.event_type or give a constant")
        event_type = event_types[0]
    if event_type is not None and not isinstance(event_type, str):
        raise ConfigError(f"input.event_type: expected a string, got {event_type!r}")
    if required is not None:
        for name, role in required.items():
            if name not in by_name and name not in ("event_id", "event_type"):
                raise ConfigError(f"input.fields: {role} {name!r} is not mapped (add input.fields.{_quote(name)})")
        for name in by_name:
            if name not in required and name not in ("event_id", "event_type"):
                raise ConfigError(f"input.fields.{name}: not read by the stream (not its privacy unit, event time, "
                                  "a quasi-identifier, a sensitive or an aggregate field): unmapped fields are "
                                  "dropped, so leave it out")
    return event_type


def _quote(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


# texts kept for reasons only: their content is in other fields (parts, pointer, const, lookup, elapsed_parts)
_TEXTS = ("raw", "source", "lookup_source", "elapsed_source")


def _content(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _content(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in _TEXTS}
    if isinstance(value, (list, tuple)):
        return [_content(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_content(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if isinstance(value, dict):
        return {str(k): _content(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def input_digest(spec: InputSpec, event_time: str) -> str:
    """How a stream reads its raw messages, as ``sha256:`` and 16 hex digits: the ``[input]`` mapping's content
    (lookup tables included, the names they were read from not) and the event time field. Release manifests state
    it (``input_digest``); the audit computes it from its own reading of the config, and decodes each lineage's raw
    messages through the config that has it.

    >>> a, b = input_digest(InputSpec(), "event_time"), input_digest(InputSpec(), "tapped_at")
    >>> a == input_digest(InputSpec(), "event_time") != b
    True
    """
    text = json.dumps({"event_time": event_time, "input": _content(spec)}, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
