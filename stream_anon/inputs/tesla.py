"""Tesla Fleet Telemetry vehicle records (``<namespace>_V`` topics): ``telemetry.vehicle_data.Payload`` as protobuf,
or as its protojson form (the server's ``transmit_decoded_records = true``), -> one source record per Payload:

``{"vin": ..., "created_at": ISO-8601 text, "is_resend": bool, "<Field enum name>": value, ...}``

where a ``Location`` value is ``{"latitude": .., "longitude": ..}``, a gear (``shift_state_value``) its enum name
(``ShiftStateD``), numbers stay numbers and strings stay strings (the vehicle sends many numbers as strings: give
the field ``cast = "float"``). A datum the vehicle marks ``invalid``, or whose value type this decoder does not read,
is absent (a mapped field of that key is then missing and dead-letters, naming the field). A key the bundled
proto subset does not name is addressed as ``Field<number>``. If a key repeats in one Payload the last value wins.

The protobuf classes come from ``proto/tesla_vehicle_data.proto`` (our wire-compatible subset; see its header).
"""
from __future__ import annotations

import orjson

_LOCATION_KEYS = ("locationValue", "location_value")


_PB = None
_NAMES: dict[int, str] = {}


def _pb():
    global _PB
    if _PB is None:
        from stream_anon.inputs.proto import tesla_vehicle_data_pb2
        _PB = tesla_vehicle_data_pb2
    return _PB


def field_name(number: int) -> str:
    """Enum name of a Field number (``Field<number>`` for one the proto subset does not name)."""
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
        rec["created_at"] = p.created_at.ToDatetime(tzinfo=_utc()).isoformat()
    for d in p.data:
        name = field_name(int(d.key))
        kind = d.value.WhichOneof("value")
        if kind is None or kind == "invalid":
            rec.pop(name, None)
            continue
        v = getattr(d.value, kind)
        if kind == "location_value":
            v = {"latitude": v.latitude, "longitude": v.longitude}
        elif kind == "shift_state_value":
            v = _SHIFT.get(v, int(v))
        elif kind == "float_value":
            v = float(v)
        rec[name] = v
    return rec


def _json_record(raw: bytes) -> dict:
    try:
        obj = orjson.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"tesla-fleet-telemetry: malformed JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("tesla-fleet-telemetry: expected a JSON object (protojson Payload)")
    rec: dict = {"is_resend": bool(obj.get("isResend", obj.get("is_resend", False)))}
    vin = obj.get("vin")
    if vin is not None:
        rec["vin"] = vin
    created = obj.get("createdAt", obj.get("created_at"))
    if created is not None:
        rec["created_at"] = created
    data = obj.get("data", [])
    if not isinstance(data, list):
        raise ValueError("tesla-fleet-telemetry: 'data' is not a list of datums")
    for d in data:
        if not isinstance(d, dict):
            raise ValueError("tesla-fleet-telemetry: a datum is not an object")
        key = d.get("key", "Unknown")
        name = field_name(key) if isinstance(key, int) else str(key)
        value = d.get("value")
        if not isinstance(value, dict) or len(value) != 1:
            rec.pop(name, None)
            continue
        (kind, v), = value.items()
        if kind == "invalid":
            rec.pop(name, None)
            continue
        if kind in _LOCATION_KEYS and isinstance(v, dict):
            v = {"latitude": v.get("latitude", 0.0), "longitude": v.get("longitude", 0.0)}
        elif kind in ("longValue", "long_value") and isinstance(v, str):
            try:
                v = int(v)              # protojson writes int64 as a string
            except ValueError:
                pass
        rec[name] = v
    return rec


_SHIFT = {0: "ShiftStateUnknown", 1: "ShiftStateInvalid", 2: "ShiftStateP", 3: "ShiftStateR", 4: "ShiftStateN",
          5: "ShiftStateD", 6: "ShiftStateSNA"}     # the proto's ShiftState (checked by tests/test_inputs.py)


def _utc():
    from datetime import timezone
    return timezone.utc
