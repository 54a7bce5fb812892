"""GTFS-realtime VehiclePositions: one ``FeedMessage`` (a feed snapshot) -> one source record per
``FeedEntity`` that carries a ``vehicle``:

``{"entity_id", "header_timestamp", "vehicle": {"id", "label", "license_plate"}, "trip": {"trip_id", "route_id",
"direction_id", "start_date", "start_time"}, "position": {"latitude", "longitude", "bearing", "odometer", "speed"},
"timestamp", "current_stop_sequence", "stop_id", "current_status", "congestion_level", "occupancy_status"}``

with only the fields the feed sets (an unset one is missing: a mapped field of it dead-letters, naming the field).
Paths are relative to the entity's ``VehiclePosition`` (``position.latitude``, ``vehicle.id``, ``timestamp``), plus
``entity_id`` and ``header_timestamp``. Edge cases (docs/inputs.md):

- entities without a vehicle (trip updates, alerts) and entities with ``is_deleted = true`` (a DIFFERENTIAL feed
  withdrawing a vehicle) are no position events and are not mapped; a feed with no vehicle at all is one
  unreadable message (dead-lettered);
- a DIFFERENTIAL feed is read like a FULL_DATASET one: each vehicle entity it carries is one event;
- float32 members (``position.latitude``, ``longitude``, ``bearing``, ``speed``) are given as the shortest decimal
  that is the same float32 (``40.7128``, not ``40.712799072265625``).

Classes: ``gtfs-realtime-bindings`` (``google.transit.gtfs_realtime_pb2``).
"""
from __future__ import annotations

from stream_anon.inputs.values import float32

_SUBS = {"vehicle": ("id", "label", "license_plate"),
         "trip": ("trip_id", "route_id", "direction_id", "start_date", "start_time"),
         "position": ("latitude", "longitude", "bearing", "odometer", "speed")}
_TOP = ("timestamp", "current_stop_sequence", "stop_id")
_ENUMS = ("current_status", "congestion_level", "occupancy_status")


def vehicle_records(raw: bytes) -> list[dict]:
    from google.protobuf.message import DecodeError
    from google.transit import gtfs_realtime_pb2 as rt

    feed = rt.FeedMessage()
    try:
        feed.ParseFromString(raw)
    except (DecodeError, RuntimeWarning) as exc:
        raise ValueError(f"gtfs-realtime: not a FeedMessage: {exc}") from None
    out = []
    header_ts = feed.header.timestamp if feed.header.HasField("timestamp") else None
    for ent in feed.entity:
        if not ent.HasField("vehicle") or ent.is_deleted:
            continue
        vp = ent.vehicle
        rec: dict = {"entity_id": ent.id}
        if header_ts is not None:
            rec["header_timestamp"] = header_ts
        for sub, names in _SUBS.items():
            if vp.HasField(sub):
                msg = getattr(vp, sub)
                rec[sub] = {n: _value(msg, n) for n in names if msg.HasField(n)}
        for n in _TOP:
            if vp.HasField(n):
                rec[n] = getattr(vp, n)
        for n in _ENUMS:
            if vp.HasField(n):
                desc = vp.DESCRIPTOR.fields_by_name[n].enum_type
                rec[n] = desc.values_by_number[getattr(vp, n)].name
        out.append(rec)
    return out


def split_feed(raw: bytes, groups: list) -> list[tuple[object, bytes]]:
    """``raw`` cut into one FeedMessage per group (same header): ``groups`` gives the group of each vehicle entity
    :func:`vehicle_records` reads, in order; entities it does not read (no vehicle, deleted) go with the first
    group, so the cut adds and drops no event. ``(group, message)`` in the order of each group's first entity."""
    from google.transit import gtfs_realtime_pb2 as rt

    feed = rt.FeedMessage.FromString(raw)
    order: list = []
    parts: dict = {}
    others = []
    it = iter(groups)
    for ent in feed.entity:
        if not ent.HasField("vehicle") or ent.is_deleted:
            others.append(ent)
            continue
        g = next(it)
        if g not in parts:
            order.append(g)
            parts[g] = rt.FeedMessage(header=feed.header)
        parts[g].entity.append(ent)
    if not order:
        return [(None, raw)]
    parts[order[0]].entity.extend(others)
    return [(g, parts[g].SerializeToString()) for g in order]


def _value(msg, name: str):
    v = getattr(msg, name)
    return float32(v) if msg.DESCRIPTOR.fields_by_name[name].type == 2 else v     # 2: FieldDescriptor.TYPE_FLOAT
