"""``[input] event_key``: the natural key of an event becomes its (keyed) event id, so a copy of an event (a
fleet-telemetry resend, ``is_resend``, or the same snapshot replayed) is a ``duplicate_event`` dead letter within
the duplicate horizon whatever its offset; the worker core and the independent audit agree. A broker run of the
same: tests/kafka/test_kafka_replay_binary.py::test_resends_through_worker_and_audit."""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("google.transit")
sys.path.insert(0, str(Path(__file__).parents[1]))
from test_inputs import SECRET, _audit, _run_core  # noqa: E402

from stream_anon.calibrate import toml_text  # noqa: E402
from stream_anon.config import ConfigError, load_config, parse_input, with_files_beside  # noqa: E402
from stream_anon.inputs import Decoder  # noqa: E402
from stream_anon.inputs.proto import tesla_vehicle_data_pb2 as pb  # noqa: E402
from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TESLA_KEY = ["vin", "created_at", "$keys"]


def config_with_key(tmp_path, bundled: str, event_key) -> Path:
    source = ROOT / "configs" / "inputs" / f"{bundled}.toml"
    raw = with_files_beside(tomllib.loads(source.read_text()), source.parent, tmp_path)
    if event_key is not None:
        raw["input"]["event_key"] = event_key
    path = tmp_path / f"{bundled}-{'key' if event_key else 'offsets'}.toml"
    path.write_text(toml_text(raw))
    return path


def resent(message: bytes) -> bytes:
    p = pb.Payload.FromString(message)
    p.is_resend = True
    return p.SerializeToString()


def with_resends(originals: list[bytes], lag: int = 20) -> tuple[list[bytes], int]:
    """Each original, then its copy marked ``is_resend`` ``lag`` messages later; (messages, copies)."""
    out: list[bytes] = []
    for i, m in enumerate(originals):
        out.append(m)
        if i >= lag:
            out.append(resent(originals[i - lag]))
    return out, len(originals) - lag


def _deadletter_reasons(out) -> list[str]:
    return [json.loads(v)["reason"] for t, _, v in out if t == "anon.deadletter"]


def test_resent_payloads_are_duplicates_with_event_key(tmp_path):
    originals = tesla_payloads("protobuf", limit=1200)
    messages, copies = with_resends(originals)
    counts = {}
    for event_key in (None, TESLA_KEY):
        path = config_with_key(tmp_path, "obd2-tesla", event_key)
        cfg = load_config(path)
        out, c = _run_core(cfg, messages, tmp_path / str(bool(event_key)))
        report = _audit(path, cfg, messages, out)
        assert report.passed, json.dumps({k: v for k, v in report.checks.items() if not v.get("passed")},
                                         default=str)[:2000]
        counts[bool(event_key)] = (c, _deadletter_reasons(out), report.summary)
    (plain, plain_dead, _), (keyed, keyed_dead, s) = counts[False], counts[True]
    assert plain_dead.count("duplicate_event") == 0            # offsets as ids: every resend is a new event
    readable = sum(1 for i in range(len(originals) - 20)
                   if Decoder(load_config(ROOT / "configs" / "inputs" / "obd2-tesla.toml").input)
                   .decode(originals[i], "t", 0, i).reasons == [None])
    assert readable > 0.8 * copies
    print("resends:", copies, "readable:", readable, "duplicate_event:", keyed_dead.count("duplicate_event"),
          "published plain/keyed:", plain["published"], keyed["published"])
    assert keyed_dead.count("duplicate_event") == readable      # every copy of an accepted event, once
    assert keyed["published"] + keyed["suppressed"] + keyed.get("deferred", 0) == \
        plain["published"] + plain["suppressed"] + plain.get("deferred", 0) - readable
    assert s["dead_lettered"] == len(keyed_dead)


def test_gtfs_snapshot_replayed_twice_counts_each_vehicle_once(tmp_path):
    feeds = gtfs_feeds(limit=1500)
    messages = feeds[:40] + feeds[:40] + feeds[40:]          # the first snapshots sent again
    path = config_with_key(tmp_path, "citibike-gtfs", ["vehicle.id", "timestamp"])
    cfg = load_config(path)
    out, c = _run_core(cfg, messages, tmp_path)
    report = _audit(path, cfg, messages, out)
    assert report.passed
    again = sum(len(Decoder(cfg.input, secret=SECRET).decode(f, "t", 0, 0).events) for f in feeds[:40])
    assert again > 40 and _deadletter_reasons(out).count("duplicate_event") == again


def test_event_key_ids_are_keyed_and_missing_parts_dead_letter():
    spec = parse_input({"format": "tesla-fleet-telemetry", "event_key": TESLA_KEY,
                        "fields": {"vehicle_id": "vin", "event_time": "created_at"}}, event_types=("t",))
    m = tesla_payloads("protobuf", limit=1)[0]
    js = tesla_payloads("json", limit=1)[0]
    a = Decoder(spec, secret=SECRET).decode(m, "t", 0, 0).events[0]["event_id"]
    assert a.startswith("key:") and len(a) == 36
    assert Decoder(spec, secret=SECRET).decode(resent(m), "t", 5, 99).events[0]["event_id"] == a
    assert Decoder(spec, secret=SECRET).decode(js, "t", 1, 7).events[0]["event_id"] == a    # either encoding
    assert Decoder(spec, secret=b"another secret 0123456789abcdef").decode(m, "t", 0, 0).events[0]["event_id"] != a
    p = pb.Payload.FromString(m)
    p.ClearField("created_at")
    out = Decoder(spec, secret=SECRET).decode(p.SerializeToString(), "t", 0, 3)
    assert out.reasons[0] in ("event_time: missing (input created_at)",)
    vinless = pb.Payload.FromString(m)
    vinless.vin = ""
    out = Decoder(spec, secret=SECRET).decode(vinless.SerializeToString(), "t", 0, 4)
    assert out.events[0]["event_id"] == "t:0:4"       # the derived id: the dead letter keeps its audit token
    assert out.reasons[0].startswith("vehicle_id: missing")
    spec2 = parse_input({"format": "tesla-fleet-telemetry", "event_key": ["vin", "Odometer"],
                         "fields": {"vehicle_id": "vin", "event_time": "created_at"}}, event_types=("t",))
    assert Decoder(spec2, secret=SECRET).decode(m, "t", 0, 5).reasons == [
        "event_id: event_key Odometer is missing (input Odometer)"]


@pytest.mark.parametrize("table,message", [
    ({"event_key": []}, "input.event_key"),
    ({"event_key": ["vin", "vin"]}, "a path appears twice"),
    ({"event_key": ["a..b"]}, "is not a source path"),
    ({"event_key": ["vin"], "fields": {"vehicle_id": "vin", "event_time": "created_at", "event_id": "vin"}},
     "not both"),
])
def test_event_key_errors_name_the_key(table, message):
    base = {"format": "tesla-fleet-telemetry", "fields": {"vehicle_id": "vin", "event_time": "created_at"}}
    with pytest.raises(ConfigError, match=message):
        parse_input({**base, **table}, event_types=("t",))


def test_two_readings_under_one_key_are_two_events_and_a_resend_is_one():
    """Two readings of one vehicle in one second at two positions share the key (vin, created_at, $keys); they
    differ in a mapped field, so both are events; a resend (``is_resend``, same content) is the first's copy."""
    spec = parse_input({"format": "tesla-fleet-telemetry", "event_key": TESLA_KEY,
                        "fields": {"vehicle_id": "vin", "event_time": "created_at",
                                   "lat": "Location.latitude", "lon": "Location.longitude"}}, event_types=("t",))
    m = next(x for x in tesla_payloads("protobuf", limit=200)
             if Decoder(spec, secret=SECRET).decode(x, "t", 0, 0).reasons == [None])
    moved = pb.Payload.FromString(m)
    loc = next(d for d in moved.data if d.key == pb.Location)
    loc.value.location_value.latitude += 0.001
    dec = Decoder(spec, secret=SECRET)
    first, second, again = (dec.decode(x, "t", 0, i).events[0] for i, x in
                            enumerate([m, moved.SerializeToString(), resent(m)]))
    assert first["event_time"] == second["event_time"] and first["lat"] != second["lat"]
    assert first["event_id"] != second["event_id"] and again["event_id"] == first["event_id"]


def test_gtfs_replay_cuts_each_snapshot_into_one_message_per_vehicle(tmp_path):
    """A GTFS-realtime snapshot holds many vehicles; keyed by its first vehicle, 4 partitions spread most vehicles
    over several (their DP charges and classes then split). Replay cuts it into one snapshot per vehicle, keyed by
    it: every vehicle on one partition, the same events in all."""
    from stream_anon.worker.placement import partitions_for
    from stream_anon.kafka.replay import mapped_messages

    feeds = gtfs_feeds(limit=1500)[:60]
    folder = tmp_path / "feeds"
    folder.mkdir()
    for i, f in enumerate(feeds):
        (folder / f"{i:04d}.pb").write_bytes(f)
    cfg = load_config(config_with_key(tmp_path, "citibike-gtfs", None))
    pairs = mapped_messages(folder, cfg, SECRET)
    unit = cfg.stream.privacy_unit

    def units_of(message):
        return {e[unit] for e in Decoder(cfg.input, secret=SECRET).decode(message, "t", 0, 0).events}

    before = [Decoder(cfg.input, secret=SECRET).decode(f, "t", 0, 0).events for f in feeds]
    assert sum(len(units_of(f)) > 1 for f in feeds) > 0.8 * len(feeds)
    assert all(len(units_of(m)) == 1 for _, m in pairs)
    after = [e for _, m in pairs for e in Decoder(cfg.input, secret=SECRET).decode(m, "t", 0, 0).events]
    strip = lambda e: {k: v for k, v in e.items() if k != "event_id"}      # ids carry the offset and index
    assert sorted(map(repr, map(strip, after))) == sorted(map(repr, (strip(e) for ev in before for e in ev)))
    where: dict = {}
    for (key, m), p in zip(pairs, partitions_for([k for k, _ in pairs], 4).tolist()):
        for u in units_of(m):
            where.setdefault(u, set()).add(p)
    assert all(len(ps) == 1 for ps in where.values())
    naive: dict = {}                    # keyed by the snapshot's first vehicle, as before
    from stream_anon import crypto
    keys = [crypto.pseudonym(SECRET, str(before[i][0][unit])).encode() for i in range(len(feeds))]
    for ev, p in zip(before, partitions_for(keys, 4).tolist()):
        for e in ev:
            naive.setdefault(e[unit], set()).add(p)
    spread = sum(len(ps) > 1 for ps in naive.values()) / len(naive)
    print(f"vehicles on several of 4 partitions: keyed by snapshot {spread:.0%}, cut per vehicle 0%")
    assert spread > 0.3
