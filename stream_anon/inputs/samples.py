"""Sample messages in the real formats, built from the bundled real data (tests, benchmarks, the guide).

- :func:`tesla_payloads`: the OBD-II readings (data/obd2_19drivers.csv.gz: one car, 19 drivers, Natal 2017) as
  Tesla Fleet Telemetry ``Payload`` messages, protobuf or protojson. Each driver is one vehicle with a VIN made
  up from the driver id (``5YJ3S11`` + driver, padded: not a real VIN). Data: ``Location`` (the GPS fix; omitted
  when the reading has none, 859 readings), ``VehicleSpeed`` (double, km/h), ``PedalPosition`` (the throttle
  position, sent as a string as older firmware does), ``Gear`` (``ShiftStateD`` when moving, else
  ``ShiftStateP``: derived from the speed, the OBD-II log has no gear); ``created_at`` = the reading's time.
- :func:`gtfs_feeds`: the Citi Bike Jersey City trips (data/citibike_slice.csv.gz) as GTFS-realtime
  VehiclePositions feeds: one feed snapshot per ``slot_s`` of start times, one entity per trip starting in it
  (``vehicle.id`` = bike id, position = start station, ``timestamp`` = start time, ``trip.route_id`` = the end
  station id (bikes have no routes; it stands in), ``position.speed`` = straight-line distance / duration, m/s).
"""
from __future__ import annotations

import hashlib
import math
from datetime import datetime
from typing import Any


def vin_of(driver: str) -> str:
    """A 17-character made-up VIN for an OBD-II driver id (deterministic)."""
    tail = hashlib.sha256(driver.encode()).hexdigest().upper()[:10]
    return ("5YJ3S11" + tail)[:17]


def tesla_payloads(encoding: str = "protobuf", limit: int | None = None) -> list[bytes]:
    from google.protobuf import json_format

    from stream_anon.datasets import load_events
    from stream_anon.inputs.proto import tesla_vehicle_data_pb2

    pb: Any = tesla_vehicle_data_pb2        # protoc's classes and enum values are made at run time: none typed

    out = []
    for e in load_events("obd2", limit=limit):
        p = pb.Payload(vin=vin_of(e["vehicle_id"]))
        p.created_at.FromDatetime(datetime.fromisoformat(e["event_time"]))
        if e["latitude"] is not None and e["longitude"] is not None:
            d = p.data.add(key=pb.Location)
            d.value.location_value.latitude = e["latitude"]
            d.value.location_value.longitude = e["longitude"]
        if e["speed_kmh"] is not None:
            p.data.add(key=pb.VehicleSpeed).value.double_value = e["speed_kmh"]
        throttle = e["signals"].get("throttle_pos_pct")
        if throttle is not None:
            p.data.add(key=pb.PedalPosition).value.string_value = f"{throttle:.2f}"
        moving = (e["speed_kmh"] or 0) > 0
        p.data.add(key=pb.Gear).value.shift_state_value = pb.ShiftStateD if moving else pb.ShiftStateP
        if encoding == "protobuf":
            out.append(p.SerializeToString())
        else:   # protojson, as fleet-telemetry writes it with transmit_decoded_records
            out.append(json_format.MessageToJson(p, indent=None).encode())
    return out


def _metres(lat1, lon1, lat2, lon2) -> float:
    r = 6371000.0
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * r * math.asin(math.sqrt(a))


def gtfs_feeds(slot_s: int = 900, limit: int | None = None) -> list[bytes]:
    """Serialized FeedMessages in time order; every trip of the slice is one entity of exactly one feed."""
    import csv
    import gzip

    from google.transit import gtfs_realtime_pb2 as rt

    from stream_anon import contract
    from stream_anon.datasets.citibike import local_time

    feeds: dict[int, list] = {}
    with gzip.open(contract.data_path("citibike_slice.csv.gz"), "rt", encoding="utf-8", newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            if limit is not None and i >= limit:
                break
            t = int(datetime.fromisoformat(local_time(row["starttime"])).timestamp())
            feeds.setdefault(t // slot_s, []).append((i, t, row))
    out = []
    for slot in sorted(feeds):
        feed = rt.FeedMessage()
        feed.header.gtfs_realtime_version = "2.0"
        feed.header.incrementality = rt.FeedHeader.FULL_DATASET
        feed.header.timestamp = (slot + 1) * slot_s
        for i, t, row in feeds[slot]:
            ent = feed.entity.add(id=f"trip-{i}")
            vp = ent.vehicle
            vp.vehicle.id = row["bikeid"]
            vp.trip.route_id = row["end station id"]
            lat, lon = float(row["start station latitude"]), float(row["start station longitude"])
            vp.position.latitude, vp.position.longitude = lat, lon
            dist = _metres(lat, lon, float(row["end station latitude"]), float(row["end station longitude"]))
            vp.position.speed = dist / max(float(row["tripduration"]), 1.0)
            vp.timestamp = t
        out.append(feed.SerializeToString())
    return out
