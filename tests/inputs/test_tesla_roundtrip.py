"""Tesla Payloads decode to the same record from protobuf and from protojson, for every Field of the proto, every
member of the ``Value`` oneof and every value of every enum a member takes; a value that cannot be decoded is a
dead letter naming the mapped field (also when the field is optional)."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("google.protobuf")

from google.protobuf import json_format  # noqa: E402

from stream_anon.inputs import Decoder, parse_input  # noqa: E402
from stream_anon.inputs import tesla  # noqa: E402
from stream_anon.inputs.proto import tesla_vehicle_data_pb2 as pb  # noqa: E402
from stream_anon.inputs.values import INVALID, Undecodable  # noqa: E402

VIN = "5YJ3E1EA7KF000001"
T0 = 1_700_000_000


def _payload(key, set_value) -> pb.Payload:
    p = pb.Payload(vin=VIN)
    p.created_at.seconds, p.created_at.nanos = T0, 123_456_000
    set_value(p.data.add(key=key).value)
    return p


def _both(p: pb.Payload) -> tuple[dict, dict]:
    js = json_format.MessageToJson(p, indent=None).encode()
    assert js[:1] == b"{"
    return tesla.payload_record(p.SerializeToString(), "auto"), tesla.payload_record(js, "auto")


def _samples(fd):
    """(setter, expected record value) for one Value member: every enum value, or representative values."""
    if fd.enum_type is not None:
        return [(lambda v, n=ev.number: setattr(v, fd.name, n), ev.name) for ev in fd.enum_type.values]
    if fd.name == "invalid":
        return [(lambda v: setattr(v, "invalid", True), INVALID)]
    if fd.message_type is not None:
        subs = fd.message_type.fields
        out = []
        for i, sub in enumerate(subs):         # one member set per sample, the rest at their defaults
            x = True if sub.type == sub.TYPE_BOOL else (-5.8321307 if sub.type == sub.TYPE_DOUBLE else 7 + i)

            def setter(v, sub=sub, x=x):
                setattr(getattr(v, fd.name), sub.name, x)
            out.append((setter, {s.name: (x if s is sub else s.default_value) for s in subs}))
        return out
    values = {fd.TYPE_STRING: ["", "CarTypeModel3 text", "ü"], fd.TYPE_INT32: [0, -7, 2 ** 31 - 1],
              fd.TYPE_INT64: [0, -(2 ** 62), 2 ** 63 - 1], fd.TYPE_FLOAT: [0.0, 0.1, -123.456, 3.4e38],
              fd.TYPE_DOUBLE: [0.0, 0.1, -5.8321307, 1e300], fd.TYPE_BOOL: [False, True]}[fd.type]
    return [(lambda v, x=x: setattr(v, fd.name, x), x) for x in values]


MEMBERS = [fd.name for fd in pb.Value.DESCRIPTOR.fields]


def test_the_proto_declares_the_whole_interface():
    """Field 0-257 and the Value members 1-54 (no 20) of the interface reference (see the proto's header)."""
    assert [v.number for v in pb.Field.DESCRIPTOR.values] == list(range(258))
    assert sorted(fd.number for fd in pb.Value.DESCRIPTOR.fields) == [n for n in range(1, 55) if n != 20]
    enums = {fd.enum_type.name for fd in pb.Value.DESCRIPTOR.fields if fd.enum_type is not None}
    assert len(enums) == 42 and "CarTypeValue" in enums


@pytest.mark.parametrize("member", MEMBERS)
def test_every_value_member_and_enum_value_decodes_alike(member):
    fd = pb.Value.DESCRIPTOR.fields_by_name[member]
    for setter, expected in _samples(fd):
        a, b = _both(_payload(pb.CarType, setter))
        assert a == b, (member, expected)
        got = a["CarType"]
        if isinstance(expected, float):
            assert got == expected and isinstance(got, float), (member, got)
        else:
            assert got == expected, (member, got)
        assert a["vin"] == VIN and a["created_at"] == "2023-11-14T22:13:20.123456+00:00"


def test_every_field_key_decodes_alike():
    for ev in pb.Field.DESCRIPTOR.values:
        a, b = _both(_payload(ev.number, lambda v: setattr(v, "string_value", "x")))
        assert a == b and a[ev.name] == "x", ev.name
    a, b = _both(_payload(999, lambda v: setattr(v, "int_value", 3)))    # a key newer than the proto
    assert a == b and a["Field999"] == 3


def test_float_values_are_the_float32_as_written():
    a, b = _both(_payload(pb.VehicleSpeed, lambda v: setattr(v, "float_value", 12.3)))
    assert a["VehicleSpeed"] == b["VehicleSpeed"] == 12.3
    for text, want in (("NaN", math.isnan), ("Infinity", lambda x: x == math.inf)):
        raw = ('{"vin":"V","data":[{"key":"VehicleSpeed","value":{"floatValue":"%s"}}]}' % text).encode()
        assert want(tesla.payload_record(raw)["VehicleSpeed"])


def _spec(optional: bool):
    return parse_input({"format": "tesla-fleet-telemetry", "fields": {
        "vehicle_id": "vin", "event_time": "created_at",
        "car": {"path": "CarType", "optional": optional},
        "door": {"path": "DoorState.DriverFront", "optional": True}}}, event_types=("telemetry",))


def _proto_with_raw_value(value_bytes: bytes) -> bytes:
    """A Payload whose CarType datum holds ``value_bytes`` (wire format) as its Value."""
    return _payload(pb.CarType, lambda v: v.MergeFromString(value_bytes)).SerializeToString()


@pytest.mark.parametrize("optional", [False, True])
def test_undecodable_value_is_a_dead_letter_naming_the_field(optional):
    d = Decoder(_spec(optional))
    ok = d.decode(_payload(pb.CarType, lambda v: setattr(v, "car_type_value", pb.CarTypeModel3))
                  .SerializeToString(), "t", 0, 0)
    assert ok.reasons == [None] and ok.events[0]["car"] == "CarTypeModel3"
    cases = {
        "enum number the proto does not name": _proto_with_raw_value(b"\x88\x01\x63"),  # member 17 = 99
        "a Value member the proto does not declare": _proto_with_raw_value(b"\xe0\x03\x01"),   # member 60
        "an enum name the proto does not name (JSON)":
            b'{"vin":"V","createdAt":"2024-01-01T00:00:00Z","data":[{"key":"CarType","value":'
            b'{"carTypeValue":"CarTypeModel9"}}]}',
        "a JSON value of the wrong type":
            b'{"vin":"V","createdAt":"2024-01-01T00:00:00Z","data":[{"key":"CarType","value":{"intValue":"x"}}]}',
        "a key repeated with different values":
            b'{"vin":"V","createdAt":"2024-01-01T00:00:00Z","data":[{"key":"CarType","value":{"carTypeValue":'
            b'"CarTypeModel3"}},{"key":"CarType","value":{"carTypeValue":"CarTypeModelY"}}]}',
    }
    for case, raw in cases.items():
        out = d.decode(raw, "t", 0, 1)
        assert out.reason is None, case
        r = out.reasons[0]
        assert r is not None and r.startswith("car: cannot decode the value: ") and r.endswith("(input CarType)"), \
            (case, r)
        assert "CarTypeModel9" not in r, "reasons never hold the raw value"
        assert "car" not in out.events[0]


def test_invalid_repeated_and_missing_created_at():
    base = b'{"vin":"V","createdAt":"2024-01-01T00:00:00Z","data":[%s]}'
    invalid = base % b'{"key":"CarType","value":{"invalid":true}}'
    assert Decoder(_spec(False)).decode(invalid, "t", 0, 0).reasons == [
        "car: the source marks the value invalid (input CarType)"]
    out = Decoder(_spec(True)).decode(invalid, "t", 0, 0)
    assert out.reasons == [None] and out.events[0]["car"] is None       # optional: null, not an error
    same_twice = base % (b'{"key":"CarType","value":{"carTypeValue":"CarTypeModel3"}},' * 2)[:-1]
    out = Decoder(_spec(False)).decode(same_twice, "t", 0, 0)
    assert out.reasons == [None] and out.events[0]["car"] == "CarTypeModel3"
    no_time = b'{"vin":"V","data":[{"key":"CarType","value":{"carTypeValue":"CarTypeModel3"}}]}'
    assert Decoder(_spec(False)).decode(no_time, "t", 0, 0).reasons == ["event_time: missing (input created_at)"]
    bad_time = b'{"vin":"V","createdAt":"yesterday","data":[]}'
    r = Decoder(_spec(True)).decode(bad_time, "t", 0, 0).reasons[0]
    assert r == "event_time: cannot decode the value: created_at is not an RFC 3339 time (input created_at)"
    assert isinstance(tesla.payload_record(bad_time)["created_at"], Undecodable)
