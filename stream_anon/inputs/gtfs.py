"""GTFS-realtime VehiclePositions: one ``FeedMessage`` (a feed snapshot) -> one source record per
``FeedEntity`` that carries a ``vehicle``:

``{"entity_id", "header_timestamp", "vehicle": {"id", "label", "license_plate"}, "trip": {"trip_id", "route_id",
"direction_id", "start_date", "start_time"}, "position": {"latitude", "longitude", "bearing", "odometer", "speed"},
"timestamp", "current_stop_sequence", "stop_id", "current_status", "congestion_level", "occupancy_status"}``

with only the fields the feed sets (an unset one is missing). Entities without a vehicle (trip updates, alerts)
are no events of a positions stream and are not mapped; a feed with no vehicle at all is one unreadable message
(dead-lettered). Classes: ``gtfs-realtime-bindings`` (``google.transit.gtfs_realtime_pb2``).
"""
from __future__ import annotations

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
        if not ent.HasField("vehicle"):
            continue
        vp = ent.vehicle
        rec: dict = {"entity_id": ent.id}
        if header_ts is not None:
            rec["header_timestamp"] = header_ts
        for sub, names in _SUBS.items():
            if vp.HasField(sub):
                msg = getattr(vp, sub)
                rec[sub] = {n: getattr(msg, n) for n in names if msg.HasField(n)}
        for n in _TOP:
            if vp.HasField(n):
                rec[n] = getattr(vp, n)
        for n in _ENUMS:
            if vp.HasField(n):
                desc = vp.DESCRIPTOR.fields_by_name[n].enum_type
                rec[n] = desc.values_by_number[getattr(vp, n)].name
        out.append(rec)
    return out
