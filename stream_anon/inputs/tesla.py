"""Tesla Fleet Telemetry vehicle records (``<namespace>_V`` topics): ``telemetry.vehicle_data.Payload`` as protobuf,
or as its protojson form (the server's ``transmit_decoded_records = true``), -> one source record per Payload:

``{"vin": ..., "created_at": ISO-8601 text, "is_resend": bool, "<Field enum name>": value, ...}``

Both encodings of one Payload give the same record (tests/inputs/test_tesla_roundtrip.py covers every Field and every
member of the ``Value`` oneof). A value is, by its ``Value`` member:

- strings, ints (``int_value``, ``long_value``: protojson's int64 text is read as a number), doubles and booleans
  as they are; ``float_value`` (a float32) as the shortest decimal of that float32 (``0.1``, not
  ``0.10000000149``); protojson's ``"NaN"``/``"Infinity"`` as floats (a mapped field refuses them as not finite);
- an enum member (``shift_state_value``, ``car_type_value``, ... every enum of the proto) as its enum name
  (``ShiftStateD``, ``CarTypeModel3``); protojson may give the name or the number;
- ``location_value`` as ``{"latitude", "longitude"}``; ``door_value``, ``tire_location_value`` and
  ``time_value`` as an object of all their members (unset ones at their default: false, 0), addressed with a
  dotted path (``DoorState.DriverFront``, ``ChargePortColdWeatherMode.hour``).

Edge cases (docs/configuration.md, "tesla-fleet-telemetry"):

- ``invalid``: the vehicle has no value; a mapped field is then missing (a dead letter naming the field, or null
  when the field is ``optional``);
- a value that cannot be read (an enum number the proto does not name, a member this proto does not declare, a
  wrong JSON type, an unreadable ``created_at``) is :class:`~stream_anon.inputs.values.Undecodable`: a mapped
  field of it dead-letters, naming the field, even when ``optional``;
- a key repeated in one Payload: one value when every copy is equal, else undecodable;
- no ``created_at``: the record has none (an event time mapped to it is missing: a dead letter).

A key number the proto does not name is addressed as ``Field<number>``. The protobuf classes come from
``proto/tesla_vehicle_data.proto`` (the wire interface; see its header).
"""
from __future__ import annotations

import math

import orjson

from stream_anon.inputs.values import INVALID, Undecodable, float32

_PB = None
_NAMES: dict[int, str] = {}
_JSON_MEMBERS: dict = {}          # protojson or proto name of a Value member -> its FieldDescriptor
_TYPE_NAMES = {9: "a string", 8: "a boolean", 5: "a 32-bit integer", 3: "a 64-bit integer", 2: "a float",
               1: "a double"}       # FieldDescriptor.TYPE_* numbers
_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _pb():
    global _PB
    if _PB is None:
        from stream_anon.inputs.proto import tesla_vehicle_data_pb2
        _PB = tesla_vehicle_data_pb2
        for fd in _PB.Value.DESCRIPTOR.fields:
            _JSON_MEMBERS[fd.name] = _JSON_MEMBERS[fd.json_name] = fd
    return _PB


def field_name(number: int) -> str:
    """Enum name of a Field number (``Field<number>`` for one the proto does not name)."""
    name = _NAMES.get(number)
    if name is None:
        try:
            name = _pb().Field.Name(number)
        except ValueError:
            name = f"Field{number}"
        _NAMES[number] = name
    return name


def payload_record(raw: bytes, encoding: str = "auto") -> dict:
    if encoding == "json" or (encoding == "auto" and raw.lstrip()[:1] == b"{"):
        return _json_record(raw)
    return _proto_record(raw)


def _put(rec: dict, name: str, value) -> None:
    """A key repeated in one Payload keeps one value when the copies agree, else it is undecodable."""
    if name in rec and rec[name] != value:
        value = Undecodable("the key is repeated in one Payload with different values")
    rec[name] = value


# ---- protobuf
def _proto_record(raw: bytes) -> dict:
    from google.protobuf.message import DecodeError

    pb = _pb()
    try:
        p = pb.Payload.FromString(raw)
    except (DecodeError, RuntimeWarning) as exc:
        raise ValueError(f"tesla-fleet-telemetry: not a Payload protobuf: {exc}") from None
    if not p.vin and not p.data and not p.HasField("created_at"):
        raise ValueError("tesla-fleet-telemetry: empty Payload (no vin, no data)")
    rec: dict = {"is_resend": p.is_resend}
    if p.vin:
        rec["vin"] = p.vin
    if p.HasField("created_at"):
        try:
            rec["created_at"] = p.created_at.ToDatetime(tzinfo=_utc()).isoformat()
        except (ValueError, OverflowError, OSError):
            rec["created_at"] = Undecodable("created_at is not a time")
    for d in p.data:
        _put(rec, field_name(int(d.key)), _proto_value(d.value))
    return rec


def _proto_value(value):
    kind = value.WhichOneof("value")
    if kind is None:
        return Undecodable("no value of a type the proto declares (a newer Value member, or none)")
    if kind == "invalid":
        return INVALID
    fd = value.DESCRIPTOR.fields_by_name[kind]
    v = getattr(value, kind)
    if fd.enum_type is not None:
        ev = fd.enum_type.values_by_number.get(v)
        return Undecodable(f"{fd.enum_type.name} has no value number {v}") if ev is None else ev.name
    if fd.message_type is not None:
        return {sub.name: getattr(v, sub.name) for sub in fd.message_type.fields}
    if fd.type == fd.TYPE_FLOAT:
        return float32(v)
    return v


# ---- protojson
def _json_record(raw: bytes) -> dict:
    try:
        obj = orjson.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"tesla-fleet-telemetry: malformed JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("tesla-fleet-telemetry: expected a JSON object (protojson Payload)")
    _pb()
    resend = obj.get("isResend", obj.get("is_resend", False))
    rec: dict = {"is_resend": resend if isinstance(resend, bool) else Undecodable("is_resend is not a boolean")}
    vin = obj.get("vin")
    if vin is not None and vin != "":
        rec["vin"] = vin if isinstance(vin, str) else Undecodable("vin is not a string")
    created = obj.get("createdAt", obj.get("created_at"))
    if created is not None:
        rec["created_at"] = _json_time(created)
    data = obj.get("data", [])
    if not isinstance(data, list):
        raise ValueError("tesla-fleet-telemetry: 'data' is not a list of datums")
    for d in data:
        if not isinstance(d, dict):
            raise ValueError("tesla-fleet-telemetry: a datum is not an object")
        key = d.get("key", "Unknown")
        name = field_name(key) if isinstance(key, int) and not isinstance(key, bool) else str(key)
        _put(rec, name, _json_value(d.get("value")))
    return rec


def _json_time(text):
    from google.protobuf.timestamp_pb2 import Timestamp

    if not isinstance(text, str):
        return Undecodable("created_at is not RFC 3339 text")
    ts = Timestamp()
    try:
        ts.FromJsonString(text)
        return ts.ToDatetime(tzinfo=_utc()).isoformat()
    except (ValueError, OverflowError, OSError):
        return Undecodable("created_at is not an RFC 3339 time")


def _json_value(value):
    if not isinstance(value, dict) or len(value) != 1:
        return Undecodable("a datum value is not an object with one member")
    (kind, v), = value.items()
    fd = _JSON_MEMBERS.get(kind)
    if fd is None:
        return Undecodable(f"value member {kind!r} is not in the proto")
    if fd.name == "invalid":
        return INVALID
    if fd.enum_type is not None:
        return _json_enum(fd.enum_type, v)
    if fd.message_type is not None:
        return _json_message(fd.message_type, v)
    return _json_scalar(fd, v)


def _json_enum(enum_type, v):
    if isinstance(v, str) and v in enum_type.values_by_name:
        return v
    if isinstance(v, int) and not isinstance(v, bool) and v in enum_type.values_by_number:
        return enum_type.values_by_number[v].name
    return Undecodable(f"not a value of {enum_type.name}")


def _json_message(message_type, v):
    if not isinstance(v, dict):
        return Undecodable(f"{message_type.name} is not an object")
    by_json = {}
    for sub in message_type.fields:
        by_json[sub.name] = by_json[sub.json_name] = sub
    out = {sub.name: sub.default_value for sub in message_type.fields}
    for k, x in v.items():
        sub = by_json.get(k)
        if sub is None:
            return Undecodable(f"{message_type.name} has no member {k!r}")
        x = _json_scalar(sub, x)
        if isinstance(x, Undecodable):
            return x
        out[sub.name] = x
    return out


def _json_scalar(fd, v):
    """A protojson scalar of the member's type (ints may be text, floats may be text or NaN/Infinity)."""
    t = fd.type
    bad = Undecodable(f"{fd.name} is not {_TYPE_NAMES.get(t, 'a value of its type')}")
    if t == fd.TYPE_STRING:
        return v if isinstance(v, str) else bad
    if t == fd.TYPE_BOOL:
        return v if isinstance(v, bool) else bad
    if isinstance(v, bool):
        return bad
    if t in (fd.TYPE_INT32, fd.TYPE_INT64):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, str):
            try:
                v = int(v)
            except ValueError:
                return bad
        limit = 2 ** 31 if t == fd.TYPE_INT32 else 2 ** 63
        return v if isinstance(v, int) and -limit <= v < limit else bad
    if isinstance(v, str):
        if v in _SPECIAL:
            v = _SPECIAL[v]
        else:
            try:
                v = float(v)
            except ValueError:
                return bad
    if not isinstance(v, (int, float)):
        return bad
    v = float(v)
    if t == fd.TYPE_FLOAT:
        if math.isfinite(v) and abs(v) > 3.4028234663852886e38:
            return bad
        return float32(v)
    return v


def _utc():
    from datetime import timezone
    return timezone.utc
