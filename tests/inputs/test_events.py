"""stream_anon.events: flattening, event-time parsing, schema validation reasons."""
from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from stream_anon.events import EVENT_KINDS, SCHEMA_DIR, flatten, parse_event_time, validate_event


def fare(**over):
    event = {"event_id": "oy-mon-1", "kind": "fare", "event_type": "tap_in", "event_time": "2009-11-09T07:31:00+00:00",
             "journey_id": "893986", "card_id": None, "subsystem": "LUL", "station": "Bank", "bus_route": None,
             "fare_product": "PAYG", "product_category": "payg", "full_fare_pence": 180,
             "discounted_fare_pence": 180, "daily_capping": False}
    event.update(over)
    return event


def vehicle(**over):
    event = {"event_id": "cb-0", "kind": "vehicle", "event_type": "trip", "event_time": "2017-01-01T00:21:00-05:00",
             "vehicle_id": "24575", "trip_id": "cb-trip-0", "latitude": 40.71, "longitude": -74.04, "speed_kmh": None,
             "event_name": "trip", "signals": {"birth_year": 1983.0, "trip_duration_s": 148.0},
             "payload": {"end_station": "City Hall", "gender": 1, "nested": {"free": ["form"]}}}
    event.update(over)
    return event


def without(event, key):
    return {k: v for k, v in event.items() if k != key}


def test_flatten_dotted_paths():
    flat = flatten(vehicle())
    assert flat["signals.birth_year"] == 1983.0
    assert flat["payload.end_station"] == "City Hall"
    assert flat["payload.nested.free"] == ["form"]
    assert "signals" not in flat and "payload" not in flat
    assert flatten({"a": {}, "b": 1}) == {"b": 1}


@pytest.mark.parametrize("text, epoch", [
    ("2009-11-09T07:31:00+00:00", 1257751860.0),
    ("2009-11-09T07:31:00Z", 1257751860.0),
    ("2017-01-01T00:21:00-05:00", 1483248060.0),
    ("2017-12-15T17:49:42.5+00:00", 1513360182.5),
])
def test_parse_event_time(text, epoch):
    assert parse_event_time(text) == epoch


@pytest.mark.parametrize("bad, message", [
    ("2009-11-09T07:31:00", "no UTC offset"),
    ("Mon 07:31", "not an ISO-8601"),
    ("2009-13-09T07:31:00+00:00", "not an ISO-8601"),
    (1257751860, "expected an ISO-8601 string"),
    (None, "expected an ISO-8601 string"),
])
def test_parse_event_time_rejects(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_event_time(bad)


def test_schemas_are_valid_and_follow_the_contract():
    required = {"fare": "journey_id", "vehicle": "vehicle_id"}
    for kind in EVENT_KINDS:
        schema = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["additionalProperties"] is False
        assert set(schema["required"]) == {"event_id", "kind", "event_type", "event_time", required[kind]}


def test_valid_events_pass():
    assert validate_event(fare(), "fare") is None
    assert validate_event(vehicle(), "vehicle") is None
    minimal = {k: fare()[k] for k in ("event_id", "kind", "event_type", "event_time", "journey_id")}
    assert validate_event(minimal, "fare") is None
    assert validate_event(vehicle(signals={}, payload={}), "vehicle") is None


@pytest.mark.parametrize("event, kind, reason", [
    (without(fare(), "event_time"), "fare", "event_time: missing"),
    (without(fare(), "journey_id"), "fare", "journey_id: missing"),
    (without(vehicle(), "vehicle_id"), "vehicle", "vehicle_id: missing"),
    (vehicle(speed_kmh="48km/h"), "vehicle", "speed_kmh: expected number or null, got string"),
    (vehicle(signals={"engine_rpm": "2124RPM"}), "vehicle", "signals.engine_rpm: expected number or null, got string"),
    (vehicle(signals={"flag": True}), "vehicle", "signals.flag: expected number or null, got boolean"),
    (fare(full_fare_pence=1.5), "fare", "full_fare_pence: expected integer or null, got number"),
    (fare(daily_capping="Y"), "fare", "daily_capping: expected boolean or null, got string"),
    (fare(zvppt="Z0102"), "fare", "zvppt: unexpected field"),
    (fare(event_type="BEGINTRIP"), "fare", "event_type: 'BEGINTRIP' is not one of"),
    (fare(product_category="student"), "fare", "product_category: 'student' is not one of"),
    (fare(event_time="2009-11-09 07:31"), "fare", "event_time: '2009-11-09 07:31' is not an ISO-8601 datetime with"),
    (fare(event_time="2009-11-09T07:31:00"), "fare", "event_time: '2009-11-09T07:31:00' is not an ISO-8601"),
    (fare(event_time="2009-02-30T07:31:00+00:00"), "fare", "event_time: '2009-02-30T07:31:00+00:00' is not an ISO"),
    (fare(event_id=""), "fare", "event_id: empty"),
    (vehicle(), "fare", "kind: 'vehicle' is not 'fare'"),
    (["not", "an", "object"], "fare", "event: expected object, got array"),
])
def test_invalid_events_name_the_field(event, kind, reason):
    got = validate_event(event, kind)
    assert got is not None and got.startswith(reason), got


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown event kind"):
        validate_event(fare(), "bus")


# The fast predicate decides "valid" on the hot path; jsonschema is the reference. The predicate must be sound
# (it never accepts what the schema refuses, including JSON Schema's corner cases: true is not an integer), and
# validate_event as a whole must give the reference's verdict (1.0 is an integer: the fallback accepts it).
_ODD_VALUES = [None, True, False, 0, 1, -3, 1.0, 2.5, "", "x", "tap_in", "2009-11-09T07:31:00+00:00",
               "2009-11-09 07:31", [], [1], {}, {"a": 1}, {"rpm": None}, {"rpm": "x"}]


def _mutations(event: dict, kind: str):
    schema = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())
    yield event
    for key in list(event):
        yield without(event, key)
        for v in _ODD_VALUES:
            yield {**event, key: v}
    for v in _ODD_VALUES:
        yield {**event, "unexpected": v}
    for key in schema["properties"]:
        for v in _ODD_VALUES:
            yield {**event, key: v}
    yield [event]
    yield "not an object"


@pytest.mark.parametrize("kind,base", [("fare", fare()), ("vehicle", vehicle()),
                                       ("vehicle", vehicle(signals={"rpm": 900, "coolant": None},
                                                           payload={"any": ["thing"]}))])
def test_fast_validator_agrees_with_jsonschema(kind, base):
    from stream_anon.events import _fast_check
    fast = _fast_check(kind)
    assert fast is not None, "our schemas use only keywords the fast path compiles"
    reference = Draft202012Validator(json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text()))
    n = fast_accepts = 0
    for e in _mutations(base, kind):
        valid = reference.is_valid(e)
        if fast(e):
            assert valid, e
            fast_accepts += 1
        if isinstance(e, dict) and valid:
            assert validate_event(e, kind) is None or "event_time" in validate_event(e, kind), e
        elif isinstance(e, dict):
            assert validate_event(e, kind) is not None, e
        n += 1
    assert n > 300 and fast_accepts > 50


@pytest.mark.parametrize("kind,base", [("fare", fare()), ("vehicle", vehicle()),
                                       ("vehicle", vehicle(signals={"rpm": 900, "coolant": None},
                                                           payload={"any": ["thing"]}))])
def test_batch_schema_check_accepts_a_batch_only_when_every_event_is_valid(kind, base):
    """The column-at-a-time check (the worker's hot path) is sound: a batch holding any event the schema refuses
    (each mutation, among valid events) is sent to the per-event checks; a batch of valid events passes."""
    import random

    from stream_anon.events import _fast_check, schema_ok_batch
    reference = Draft202012Validator(json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text()))
    mutations = [e for e in _mutations(base, kind)]
    valid = [e for e in mutations if isinstance(e, dict) and _fast_check(kind)(e)]     # the per-event fast path's
    assert len(valid) > 20 and schema_ok_batch(valid, kind) and schema_ok_batch([base] * 50, kind)
    rng = random.Random(0)
    refused = 0
    for e in mutations:
        batch = rng.sample(valid, 5) + [e] + rng.sample(valid, 5)
        if schema_ok_batch(batch, kind):
            assert all(reference.is_valid(x) for x in batch if isinstance(x, dict)), e
        else:
            refused += 1
    assert refused > 100


@pytest.mark.parametrize("kind,base", [("fare", fare()), ("vehicle", vehicle())])
def test_batch_columns_only_for_valid_batches_of_complete_events(kind, base):
    """The row-wise check (the worker's usual batch: every event holds every property) gives the batch's columns
    only when every event is valid, and they are the events' values; an event the schema refuses, a missing or an
    extra key sends the batch to the other checks (None)."""
    import random

    from stream_anon.events import _fast_check, schema_columns
    reference = Draft202012Validator(json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text()))
    names = list(json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())["properties"])
    assert sorted(base) == sorted(names), "the base event holds every property"
    complete = [e for e in _mutations(base, kind) if isinstance(e, dict) and sorted(e) == sorted(names)
                and _fast_check(kind)(e)]       # valid, and not a case only the reference accepts (1.0 as integer)
    assert len(complete) > 20
    columns = schema_columns(complete, kind)
    assert columns is not None and list(columns) == names
    assert all(list(columns[n]) == [e[n] for e in complete] for n in names)
    rng = random.Random(1)
    given = refused = 0
    for e in _mutations(base, kind):
        batch = rng.sample(complete, 5) + [e] + rng.sample(complete, 5)
        got = schema_columns(batch, kind)
        if got is None:
            refused += 1
            continue
        given += 1
        assert all(reference.is_valid(x) for x in batch), e
        assert all(list(got[n]) == [x[n] for x in batch] for n in names)
    assert given > 20 and refused > 100


def test_worker_batch_payload_checks_equal_the_per_message_checks():
    from pathlib import Path

    from stream_anon.config import load_config
    from stream_anon.worker.input_checks import check_payload, check_payloads
    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "oyster.toml")
    base = fare()
    raws = [json.dumps(e).encode() if not isinstance(e, bytes) else e
            for e in list(_mutations(base, "fare"))[:400]] + [b"{not json", None, b"[]", b"x" * 70000]
    for start in range(0, len(raws), 37):
        chunk = raws[start:start + 37]
        assert check_payloads(chunk, config) == [check_payload(r, config) for r in chunk]
    clean = [json.dumps(base).encode()] * 20
    assert check_payloads(clean, config) == [check_payload(r, config) for r in clean]


def test_worker_batch_check_gives_the_reader_its_columns():
    """``check_batch`` of a batch of valid, complete events (the fast path) holds the events of the per-message
    checks and their columns; one bad payload among them is dead-lettered alone, at its position."""
    from pathlib import Path

    from stream_anon.config import load_config
    from stream_anon.worker.input_checks import check_batch, check_payload
    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "oyster.toml")
    raws = [json.dumps(fare(event_id=f"e{i}", station=None if i % 3 else "Bank")).encode() for i in range(30)]
    events, rejected, columns = check_batch(raws, config)
    assert list(events) == [check_payload(r, config)[1] for r in raws] and rejected == []
    assert columns is not None and list(columns["event_id"]) == [f"e{i}" for i in range(30)]
    for bad in (b"{not json", json.dumps(fare(kind="vehicle")).encode(), json.dumps(fare(event_time=3)).encode(),
                json.dumps(fare(extra=1)).encode(), None, b"x" * 70000):
        mixed = raws[:7] + [bad] + raws[7:]
        events, rejected, _ = check_batch(mixed, config)
        assert [i for i, _ in rejected] == [7] and rejected[0][1] == check_payload(bad, config)[0]
        assert list(events) == [check_payload(r, config)[1] for r in raws]


# payloads where a JSON parser's reading may differ from orjson's: integers beyond 64 bits (orjson: a float),
# numbers written as floats, duplicate keys (the last one counts), escapes, surrogates, invalid UTF-8, whitespace
_ODD_PAYLOAD_PARTS = [b'"full_fare_pence":18446744073709551615', b'"full_fare_pence":9223372036854775808',
                      b'"full_fare_pence":-9223372036854775809', b'"full_fare_pence":9223372036854775807',
                      b'"full_fare_pence":123456789012345678901234567890', b'"full_fare_pence":1.0',
                      b'"full_fare_pence":1e2', b'"full_fare_pence":-0', b'"full_fare_pence":true',
                      b'"station":"\\u00e9\\ud83d\\ude00"', b'"station":"\\ud800"', b'"station":"\\udc00x"',
                      b'"station":"\xed\xa0\x80"', b'"station":"\xc0\xaf"', b'"station":"a\x00b"',
                      b'"station":"tab\tin"', b'"event_id":"x","event_id":"y"', b'"event_id":""',
                      b'"event_id":"\\u0000"', b'"kind":"fare","kind":"vehicle"', b'"kind":"vehicle","kind":"fare"',
                      b'"journey_id":"\xc3\xa9"', b'"event_time":"2009-11-09T07:31:00+00:00\\n"',
                      b'"product_category":"payg "', b'"daily_capping":0', b'"card_id":{}', b' "card_id" : null ']


def _odd_payloads(base: dict):
    """Payloads of ``base`` with one part replaced or added (each part above), and some framing variants."""
    text = json.dumps(base).encode()
    for part in _ODD_PAYLOAD_PARTS:
        key = part.split(b":")[0].strip()
        start = text.index(key)
        end = text.index(b",", start) if b"," in text[start:] else len(text) - 1
        yield text[:start] + part + text[end:]              # replaced
        yield text[:-1] + b"," + part + b"}"                 # added after (a duplicate key: the last one counts)
    yield from (b" " + text + b"\n", text + b"x", b"\xef\xbb\xbf" + text, text[:-1], text.replace(b'"', b"'"))


def test_decoded_columns_are_the_general_checks_columns_or_none():
    """The msgspec decoder (the worker's usual batch) is sound against the general path: a batch it decodes is one
    the general parse and schema accept, with the same columns (values and types); any payload it does not decode
    (mutated events, payloads a parser may read differently) sends the batch back (None)."""
    import random
    from pathlib import Path

    from stream_anon.config import load_config
    from stream_anon.events import _fast_check, decoded_columns, schema_columns
    from stream_anon.worker.input_checks import parse_payloads
    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "oyster.toml")
    reference = Draft202012Validator(json.loads((SCHEMA_DIR / "fare.schema.json").read_text()))
    base = fare()
    complete = [json.dumps(e).encode() for e in _mutations(base, "fare")
                if isinstance(e, dict) and sorted(e) == sorted(base) and _fast_check("fare")(e)]   # not 1.0 as integer
    assert len(complete) > 20 and decoded_columns(complete, "fare") is not None
    odd = [json.dumps(e).encode() for e in _mutations(base, "fare")] + list(_odd_payloads(base))
    rng = random.Random(2)
    decoded = refused = 0
    for raw in odd:
        batch = rng.sample(complete, 5) + [raw] + rng.sample(complete, 5)
        got = decoded_columns(batch, "fare")
        if got is None:
            refused += 1
            continue
        decoded += 1
        events, rejected = parse_payloads(batch, config)
        assert rejected == [] and all(reference.is_valid(e) for e in events), raw
        expected = schema_columns(events, "fare")
        assert expected is not None, raw
        assert {n: [(type(v), v) for v in c] for n, c in got.items()} == \
               {n: [(type(v), v) for v in c] for n, c in expected.items()}, raw
    assert decoded > 30 and refused > 200


def test_the_decoder_leaves_schemas_beyond_flat_scalars_to_the_general_checks():
    from stream_anon.schema_decoder import compile_schema_decoder
    vehicle_schema = json.loads((SCHEMA_DIR / "vehicle.schema.json").read_text())    # objects and numbers
    with pytest.raises(NotImplementedError):
        compile_schema_decoder(vehicle_schema)
    columns = compile_schema_decoder(json.loads((SCHEMA_DIR / "fare.schema.json").read_text()))
    assert columns([]) is not None and columns([b"{}"]) is None


def test_a_decoded_batch_parses_an_event_only_when_it_is_read():
    from stream_anon.worker.input_checks import ParsedOnRead
    raws = [json.dumps(fare(event_id=f"e{i}")).encode() for i in range(4)] + [b"{not json"]
    events = ParsedOnRead(raws)
    assert len(events) == 5 and events[1]["event_id"] == "e1" and events[-2]["event_id"] == "e3"
    assert events[1] is events[1] and [e["event_id"] for e in events[:4]] == ["e0", "e1", "e2", "e3"]
