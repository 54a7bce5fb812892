"""Real formats through a real broker (Tansu and Apache Kafka), a worker subprocess and the independent audit: Tesla
Fleet Telemetry Payloads (protobuf and protojson interleaved on one topic, built from the bundled OBD-II readings) and
GTFS-realtime VehiclePositions feeds (one message per feed snapshot, built from the bundled Citi Bike trips), the raw
Oyster CSV replayed with ``stream-anon replay --file`` (configs/inputs/oyster-csv.toml: lookups, elapsed times), plus
unreadable messages. Accounting exact (worker and audit count a feed of N vehicles as N events), 0 identifiers out."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("google.transit")
sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import read_all  # noqa: E402

from stream_anon import crypto  # noqa: E402
from stream_anon.audit.kafka_source import audit_from_kafka, read_topic  # noqa: E402
from stream_anon.calibrate import toml_text  # noqa: E402
from stream_anon.config import load_config, with_files_beside  # noqa: E402
from stream_anon.inputs import Decoder  # noqa: E402
from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads, vin_of  # noqa: E402
from stream_anon.kafka.supervise import run_until_accounted  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.topics import ensure_topics  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.one_broker]     # one_broker: tests/conftest.py
ROOT = Path(__file__).resolve().parents[2]


def stream_copy(tmp_path, bundled: str, name: str, bootstrap: str, partitions: int):
    source = ROOT / "configs" / "inputs" / f"{bundled}.toml"
    raw = with_files_beside(tomllib.loads(source.read_text()), source.parent, tmp_path)   # its lookups, hierarchies
    raw["stream"].update(name=name, input_topic=f"raw.test.{name}")
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_text(raw))
    cfg = load_config(path)
    ensure_topics(bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records", "anon.releases",
                                    "anon.deadletter", "anon.metrics"],
                  default_partitions={cfg.stream.input_topic: partitions, f"anon.{name}.records": 1})
    return path, cfg


def outputs_blob(bootstrap, name) -> str:
    parts = []
    for topic in (f"anon.{name}.records", "anon.releases", "anon.deadletter", "anon.metrics"):
        parts += [value.decode("utf-8", "replace") for _src, value in read_topic(bootstrap, topic, idle_s=1.0)]
    return "\n".join(parts)


def _expected_events(cfg, messages) -> int:
    d = Decoder(cfg.input, cfg.limits.max_event_bytes)
    return sum(max(1, len(d.decode(m, "t", 0, i).events)) for i, m in enumerate(messages))


def run_and_audit(path, bootstrap, tmp_path, secret, expected: int):
    """A worker until ``expected`` events are accounted for, then the independent audit: (accounting, report,
    summary), with the accounting, the audit's verdict and its events-in equation asserted."""
    acc = run_until_accounted(path, bootstrap, tmp_path / "state", expected, timeout_s=150,
                              log_path=tmp_path / "worker.log")
    assert acc["accounted"] == expected
    report = audit_from_kafka(bootstrap, path, secret, idle_s=1.5)
    assert report.passed, report.format_text()
    s = report.summary
    assert s["events_in"] == expected == s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"]
    return acc, report, s


def test_tesla_fleet_telemetry_through_worker_and_audit(broker, tmp_path, secret_env):
    # one partition: the car's 19 drivers rarely overlap in time, so k = 3 needs them all in one engine
    path, cfg = stream_copy(tmp_path, "obd2-tesla", "tesla-e2e", broker.bootstrap, partitions=1)
    pb, js = tesla_payloads("protobuf")[::5], tesla_payloads("json")[::5]     # every 5th reading, all drivers
    n = len(pb)
    payloads = [pb[i] if i % 2 else js[i] for i in range(n)]
    vins = sorted({vin_of(f"s{i}") for i in range(1, 40)})
    dec = Decoder(cfg.input)
    keyed = []
    for i, m in enumerate(payloads):
        vin = dec.decode(m, "t", 0, i).events[0]["vehicle_id"]
        keyed.append((crypto.pseudonym(secret_env, vin).encode(), m))
    bad = [(None, b"\x08\x96\x01garbage"), (None, b'{"vin": 5, "data": "nope"}'), (None, b"x" * 5000)]
    rep = replay(broker.bootstrap, cfg.stream.input_topic, [], None, raw_payloads=keyed + bad, secret=secret_env,
                 progress=False)
    assert rep["raw"] == n + len(bad)
    expected = n + len(bad)
    acc, report, s = run_and_audit(path, broker.bootstrap, tmp_path, secret_env, expected)
    assert s["dead_lettered"] >= len(bad) + 1          # the bad messages + readings without a GPS fix
    assert s["published"] > 1000 and s["min_individuals"] >= 3
    deads = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.deadletter", stream="tesla-e2e")]
    assert any(d["reason"].startswith("latitude: missing (input Location.latitude)") for d in deads)
    assert any(d["reason"].startswith("oversized payload") for d in deads)
    blob = outputs_blob(broker.bootstrap, "tesla-e2e")
    present = [v for v in vins if any(v.encode() in m for m in payloads)]
    assert present, "no VIN in the input: the leak check below would be vacuous"
    assert not [v for v in present if v in blob], "a VIN reached an output topic"
    print("tesla e2e:", acc, "audit:", {k: s[k] for k in ("events_in", "published", "suppressed", "dead_lettered")})


def test_gtfs_realtime_feeds_through_worker_and_audit(broker, tmp_path, secret_env):
    path, cfg = stream_copy(tmp_path, "citibike-gtfs", "gtfs-e2e", broker.bootstrap, partitions=1)
    feeds = gtfs_feeds(limit=3000)
    from google.transit import gtfs_realtime_pb2 as rt
    alerts_only = rt.FeedMessage()
    alerts_only.header.gtfs_realtime_version = "2.0"
    alerts_only.entity.add(id="a").alert.header_text.translation.add(text="detour")
    bad = [alerts_only.SerializeToString(), b"\xff\xfe not a feed"]
    # a feed of 2 vehicles, the first without a position: its dead letter names the event's index (one bad
    # vehicle per message: stream_anon.kafka.supervise.OutputReader counts dead letters by (topic, partition, offset))
    mixed = rt.FeedMessage()
    mixed.header.gtfs_realtime_version = "2.0"
    for i in range(2):
        vp = mixed.entity.add(id=f"m{i}").vehicle
        vp.vehicle.id, vp.timestamp = f"bike-m{i}", 1484230000 + i     # after the feeds: in time
        if i:
            vp.position.latitude, vp.position.longitude = 40.72, -74.05
    messages = feeds + bad + [mixed.SerializeToString()]
    expected = _expected_events(cfg, messages)
    assert expected == 3000 + len(bad) + 2          # every vehicle one event; each unreadable message one event
    rep = replay(broker.bootstrap, cfg.stream.input_topic, [], None,
                 raw_payloads=[(b"feed", m) for m in messages], secret=secret_env, progress=False)
    assert rep["raw"] == len(messages)
    acc, report, s = run_and_audit(path, broker.bootstrap, tmp_path, secret_env, expected)
    assert s["dead_lettered"] == len(bad) + 1 and s["published"] > 2500
    deads = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.deadletter", stream="gtfs-e2e")]
    indexed = [d for d in deads if "index" in d["source"]]
    assert len(indexed) == 1 and indexed[0]["source"]["index"] == 0
    assert indexed[0]["reason"].startswith("latitude: missing (input position.latitude)")
    assert "bike-m0" not in outputs_blob(broker.bootstrap, "gtfs-e2e")      # the privacy unit is pseudonymized
    print("gtfs e2e:", acc, "audit:", {k: s[k] for k in ("events_in", "published", "suppressed", "dead_lettered")})


def test_oyster_csv_replayed_from_the_raw_file_through_worker_and_audit(broker, tmp_path, secret_env):
    """``stream-anon replay --file`` of the raw Oyster CSV (its first 3,000 records and a broken one), the worker
    and the audit on the mapped config: accounting exact, k in journeys, no journey id out (the audit's leak check
    looks for every raw journey id of 4+ characters in every output string)."""
    import gzip

    from stream_anon.cli import main
    path, cfg = stream_copy(tmp_path, "oyster-csv", "oyster-csv-e2e", broker.bootstrap, partitions=1)
    lines = gzip.open(ROOT / "data" / "oyster_slice.csv.gz", "rt", encoding="utf-8").read().splitlines()[:3001]
    lines.append("Mon,07:31,TELEPORT,1,LUL,Bank,,,N,0,0,,PAYG")           # an event type the lookup does not know
    raw_file = tmp_path / "taps.csv"
    raw_file.write_text("\n".join(lines) + "\n")
    assert main(["replay", "--file", str(raw_file), "--config", str(path), "--topic", cfg.stream.input_topic,
                 "--broker", broker.bootstrap, "--quiet"]) == 0
    expected = 3001
    acc, report, s = run_and_audit(path, broker.bootstrap, tmp_path, secret_env, expected)
    assert s["dead_lettered"] == 1 and s["published"] > 2500 and s["min_individuals"] >= cfg.anonymization.k
    assert report.checks["leaks"]["passed"]
    deads = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.deadletter", stream="oyster-csv-e2e")]
    assert [d["reason"] for d in deads] == ["event_type: 'TELEPORT' is not in lookup inline table (input event_type)"]
    print("oyster-csv e2e:", acc, "audit:", {k: s[k] for k in ("events_in", "published", "suppressed",
                                                               "dead_lettered")})
