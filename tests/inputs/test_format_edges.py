"""The defined edge cases of the binary formats (docs/inputs.md, "Edge cases"): each has a test here (the Tesla
ones that concern values: tests/inputs/test_tesla_roundtrip.py) and a line in the docs, checked below."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("google.transit")

from google.transit import gtfs_realtime_pb2 as rt  # noqa: E402

from stream_anon.inputs import Decoder, parse_input  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GTFS_FIELDS = {"vehicle_id": "vehicle.id", "event_time": "timestamp", "latitude": "position.latitude",
               "longitude": "position.longitude"}


def _decoder(**fields):
    return Decoder(parse_input({"format": "gtfs-realtime", "fields": {**GTFS_FIELDS, **fields}},
                               event_types=("position",)))


def _feed(incrementality=rt.FeedHeader.FULL_DATASET) -> rt.FeedMessage:
    feed = rt.FeedMessage()
    feed.header.gtfs_realtime_version = "2.0"
    feed.header.incrementality = incrementality
    feed.header.timestamp = 1_700_000_100
    return feed


def _vehicle(feed, i, timestamp=True, lat=40.7128, lon=-74.006):
    ent = feed.entity.add(id=f"e{i}")
    vp = ent.vehicle
    vp.vehicle.id = f"bus-{i}"
    if timestamp:
        vp.timestamp = 1_700_000_000 + i
    vp.position.latitude, vp.position.longitude = lat, lon
    return ent


def test_gtfs_non_vehicle_entities_are_not_events():
    feed = _feed()
    feed.entity.add(id="alert").alert.header_text.translation.add(text="detour")
    feed.entity.add(id="tu").trip_update.trip.trip_id = "t1"
    _vehicle(feed, 1)
    out = _decoder().decode(feed.SerializeToString(), "f", 0, 0)
    assert out.reason is None and len(out.events) == 1 and out.events[0]["vehicle_id"] == "bus-1"
    assert out.events[0]["event_id"] == "f:0:0:0"          # the index counts vehicle entities only
    only_alerts = _feed()
    only_alerts.entity.add(id="alert").alert.header_text.translation.add(text="detour")
    assert _decoder().decode(only_alerts.SerializeToString(), "f", 0, 1).reason == \
        "gtfs-realtime: message holds no event"


def test_gtfs_differential_feed_and_deleted_entities():
    feed = _feed(rt.FeedHeader.DIFFERENTIAL)
    _vehicle(feed, 1)
    gone = _vehicle(feed, 2)
    gone.is_deleted = True
    out = _decoder().decode(feed.SerializeToString(), "f", 0, 0)
    assert out.reasons == [None] and [e["vehicle_id"] for e in out.events] == ["bus-1"]
    full = _feed()
    _vehicle(full, 1)
    assert _decoder().decode(full.SerializeToString(), "f", 0, 0).events == out.events   # read alike


def test_gtfs_missing_vehicle_timestamp_dead_letters_or_takes_the_header_time():
    feed = _feed()
    _vehicle(feed, 1, timestamp=False)
    out = _decoder().decode(feed.SerializeToString(), "f", 0, 0)
    assert out.reasons == ["event_time: missing (input timestamp)"]
    header_time = _decoder(event_time="header_timestamp").decode(feed.SerializeToString(), "f", 0, 0)
    assert header_time.reasons == [None] and header_time.events[0]["event_time"] == "2023-11-14T22:15:00+00:00"


def test_gtfs_float32_coordinates_are_the_decimal_sent():
    feed = _feed()
    _vehicle(feed, 1, lat=40.7128, lon=-74.006)
    feed.entity[0].vehicle.position.speed = 4.2
    out = _decoder(speed="position.speed").decode(feed.SerializeToString(), "f", 0, 0)
    e = out.events[0]
    assert (e["latitude"], e["longitude"], e["speed"]) == (40.7128, -74.006, 4.2)
    assert feed.entity[0].vehicle.position.latitude != 40.7128      # what the float32 widens to


EDGE_CASES = {      # the phrase docs/inputs.md states each outcome with
    "tesla-fleet-telemetry": ["no `created_at`", "`invalid`", "repeated key", "unknown enum", "`is_resend`"],
    "gtfs-realtime": ["non-vehicle entities", "`DIFFERENTIAL`", "`is_deleted = true`", "no `vehicle.timestamp`",
                      "float32"],
}


def test_every_edge_case_has_a_line_in_the_docs():
    text = (ROOT / "docs" / "inputs.md").read_text()
    section = {fmt: text.split(f"## `{fmt}`", 1)[1].split("\n## ", 1)[0] for fmt in EDGE_CASES}
    for fmt, phrases in EDGE_CASES.items():
        lines = [ln for ln in section[fmt].splitlines() if ln.startswith("| ")]
        for phrase in phrases:
            assert any(phrase in ln for ln in lines), (fmt, phrase)
