"""The [input] mapping (stream_anon.inputs): parsing with keyed errors, the four formats, reasons that name the
field, and the worker core and the audit agreeing on the accounting of multi-event messages (in process, no broker;
tests/kafka/test_kafka_inputs.py runs the same through a real broker)."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("google.protobuf")
pytest.importorskip("google.transit")

from stream_anon.config import ConfigError, load_config, parse_config  # noqa: E402
from stream_anon.inputs import Decoder, decode_file, parse_input  # noqa: E402
from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads, vin_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
INPUT_CONFIGS = CONFIGS / "inputs"      # the mapped configs (configs/inputs/*.toml)
SECRET = b"test-secret-0123456789abcdef0123456789"


def _raw(name):
    return tomllib.loads((INPUT_CONFIGS / f"{name}.toml").read_text())


# ------------------------------------------------------------------------------------------------ parsing
def test_bundled_configs_keep_the_builtin_json_shape():
    for name in ("oyster", "citibike", "obd2", "oyster-cards"):
        assert load_config(CONFIGS / f"{name}.toml").input.legacy


@pytest.mark.parametrize("change, key", [
    ({"format": "xml"}, "input.format"),
    ({"fields": {"vehicle_id": {"path": "bikeid", "cast": "decimal"}}}, "input.fields.vehicle_id.cast"),
    ({"fields": {"vehicle_id": {"path": "bikeid", "colour": 1}}}, "input.fields.vehicle_id.colour"),
    ({"timezone": "Mars/Olympus"}, "input.timezone"),
    ({"columns": []}, "input.columns"),
    ({"fields": {"vehicle_id": "no such column"}}, "input.fields.vehicle_id"),
    ({"fields": {"event_time": {"path": "starttime", "time_format": "dd/mm"}}}, "input.fields.event_time.time_format"),
])
def test_input_errors_name_the_key(change, key):
    raw = _raw("citibike-csv")
    inp = dict(raw["input"])
    if "fields" in change:
        inp["fields"] = {**inp["fields"], **change["fields"]}
    else:
        inp.update(change)
    with pytest.raises(ConfigError) as exc:
        parse_config({**raw, "input": inp}, base_dir=CONFIGS)
    assert str(exc.value).startswith(key + ":"), str(exc.value)


def test_every_engine_field_mapped_and_nothing_else():
    raw = _raw("citibike-csv")
    fields = dict(raw["input"]["fields"])
    del fields["birth_year"]
    with pytest.raises(ConfigError, match=r"input.fields: quasi-identifier birth_year field 'birth_year' is not mapped"):
        parse_config({**raw, "input": {**raw["input"], "fields": fields}}, base_dir=CONFIGS)
    fields = {**raw["input"]["fields"], "gender": "gender"}
    with pytest.raises(ConfigError, match=r"input.fields.gender: not read by the stream"):
        parse_config({**raw, "input": {**raw["input"], "fields": fields}}, base_dir=CONFIGS)


def test_parse_input_alone_is_keyed():
    with pytest.raises(ConfigError, match=r"^input.fields.x: give exactly one of path, pointer or value"):
        parse_input({"format": "json", "fields": {"x": {"cast": "int"}}}, event_types=("t",))


# ------------------------------------------------------------------------------------------------ formats
def _csv_spec(fields: dict, columns=("a", "b"), **table):
    return parse_input({"format": "csv", "columns": list(columns), "fields": fields, **table}, event_time="t",
                       event_types=("x",))


def _one(spec, line: str):
    d = Decoder(spec).decode(line.encode(), "t", 0, 0)
    return d.events[0], d.reasons[0]


def test_lookup_inline_and_csv_file(tmp_path):
    (tmp_path / "names.csv").write_text("raw,canonical,comment\nKINGS X ,Kings Cross,trailing space kept\n")
    spec = parse_input({"format": "csv", "columns": ["a", "b"], "fields": {
        "t": {"value": "2020-01-01T00:00:00+00:00"},
        "kind": {"path": "a", "lookup": {"B": "begin", "E": "end"}},
        "name": {"path": "b", "lookup": "names.csv", "unmatched": "keep"}}}, event_time="t", event_types=("x",),
        base_dir=tmp_path)
    ev, why = _one(spec, "B,KINGS X ")
    assert why is None and (ev["kind"], ev["name"]) == ("begin", "Kings Cross")
    ev, why = _one(spec, "E,Euston")                     # unmatched = "keep": a name without a correction
    assert why is None and (ev["kind"], ev["name"]) == ("end", "Euston")
    _, why = _one(spec, "Q,Euston")                      # unmatched = "reject" (default): a dead letter
    assert why == "kind: 'Q' is not in lookup inline table (input a)"
    spec = _csv_spec({"t": {"value": "2020-01-01T00:00:00+00:00"},
                      "kind": {"path": "a", "lookup": {"B": "begin"}, "unmatched": "null"}})
    assert _one(spec, "Q,1") == ({"t": "2020-01-01T00:00:00+00:00", "kind": None, "event_id": "t:0:0",
                                  "event_type": "x"}, None)


def test_elapsed_service_day_and_engine_runtime():
    spec = _csv_spec({"t": {"value": "2009-11-09T00:00:00", "elapsed": "a"}, "v": {"path": "b", "optional": True}},
                     timezone="Europe/London")
    assert _one(spec, "28:30,")[0]["t"] == "2009-11-10T04:30:00+00:00"      # hours past 23: the next morning
    assert _one(spec, "00:03:02,")[0]["t"] == "2009-11-09T00:03:02+00:00"
    assert _one(spec, ",")[1] == "t: missing elapsed time (input a)"
    assert _one(spec, "3h,")[1] == "t: expected an elapsed time H:MM[:SS] or seconds, got '3h' (input a)"
    assert _one(spec, "1e300,")[1] == "t: elapsed time '1e300' leaves the calendar (input a)"     # no crash
    assert _one(spec, "99999999999:00,")[1].startswith("t: elapsed time '99999999999:00' leaves the calendar")
    # real time across a clock change: 2021-03-28 01:00 UTC London jumps to BST, 3 h after midnight is 04:00 BST
    spec = _csv_spec({"t": {"value": "2021-03-28T00:00:00", "elapsed": "a"}}, timezone="Europe/London")
    assert _one(spec, "3:00,")[0]["t"] == "2021-03-28T03:00:00+00:00"
    spec = _csv_spec({"t": {"path": "a", "time_format": "epoch_ms", "decimal": ",", "elapsed": "b"}})
    assert _one(spec, '"1,51336E+12",125')[0]["t"] == "2017-12-15T17:48:45+00:00"   # seconds as a number


def test_number_text_unit_decimal_comma_lost_point():
    spec = _csv_spec({"t": {"value": "2020-01-01T00:00:00+00:00"},
                      "pct": {"path": "a", "cast": "float", "unit": "%", "decimal": ","},
                      "lat": {"path": "b", "cast": "float", "integer_digits": 1, "null_values": ["0.0"],
                              "optional": True}})
    ev, why = _one(spec, '"74,50%",-58.321.307')
    assert why is None and (ev["pct"], ev["lat"]) == (74.5, -5.8321307)
    assert _one(spec, "20,-583.251.443")[0]["lat"] == -5.83251443       # a unit is removed when present
    assert _one(spec, "20,0.0")[0]["lat"] is None                       # the field's own null values
    assert _one(spec, "1.5%,1")[1] == "pct: cannot cast '1.5%' to float (input a)"   # a point with decimal ','
    assert _one(spec, "1:6032000007E803,1")[1].startswith("pct: cannot cast '1:6032000007E803'")
    spec = _csv_spec({"t": {"value": "2020-01-01T00:00:00+00:00"},
                      "kmh": {"path": "a", "cast": "int", "unit": "km/h"}})
    assert _one(spec, "48km/h,")[0]["kmh"] == 48 and _one(spec, "48 km/h,")[0]["kmh"] == 48


@pytest.mark.parametrize("field, key", [
    ({"path": "a", "lookup": 3}, "input.fields.v.lookup"),
    ({"path": "a", "lookup": "no-such-file.csv"}, "input.fields.v.lookup"),
    ({"path": "a", "lookup": {"x": [1]}}, "input.fields.v.lookup.x"),
    ({"path": "a", "unmatched": "keep"}, "input.fields.v.unmatched"),
    ({"path": "a", "lookup": {"x": "y"}, "unmatched": "drop"}, "input.fields.v.unmatched"),
    ({"path": "a", "unit": "km/h"}, "input.fields.v.unit"),                  # no number cast
    ({"path": "a", "cast": "float", "unit": "2x"}, "input.fields.v.unit"),
    ({"path": "a", "cast": "float", "decimal": ";"}, "input.fields.v.decimal"),
    ({"path": "a", "cast": "int", "integer_digits": 1}, "input.fields.v.integer_digits"),
    ({"path": "a", "cast": "float", "integer_digits": 0}, "input.fields.v.integer_digits"),
    ({"path": "a", "elapsed": "b"}, "input.fields.v.elapsed"),              # not a time field
    ({"path": "a", "time_format": "iso", "elapsed": "zz"}, "input.fields.v.elapsed"),   # not a column
    ({"path": "a", "null_values": "0.0"}, "input.fields.v.null_values"),
])
def test_new_field_keys_are_validated(field, key, tmp_path):
    with pytest.raises(ConfigError) as exc:
        parse_input({"format": "csv", "columns": ["a", "b"], "fields": {
            "t": {"value": "2020-01-01T00:00:00+00:00"}, "v": field}}, event_time="t", event_types=("x",),
            base_dir=tmp_path)
    assert str(exc.value).startswith(key + ":"), str(exc.value)


def test_citibike_csv_equals_the_adapter():
    """The mapping reads the raw CSV slice into the same values as the hand-written adapter."""
    from stream_anon.datasets import load_events
    cfg = load_config(INPUT_CONFIGS / "citibike-csv.toml")
    events, rejected = decode_file(ROOT / "data" / "citibike_slice.csv.gz", cfg.input)
    old = load_events("citibike")
    assert rejected == [] and len(events) == len(old) == 20000
    for a, b in zip(old, events):
        assert (a["event_time"], a["vehicle_id"], a["latitude"], a["longitude"], a["signals"]["birth_year"],
                a["payload"]["usertype"], a["payload"]["end_latitude"], a["signals"]["trip_duration_s"]) == \
               (b["event_time"], b["vehicle_id"], b["latitude"], b["longitude"], b["birth_year"], b["usertype"],
                b["end_latitude"], b["trip_duration_s"])
    # only mapped fields, the event id and type
    assert set(events[0]) == set(cfg.input.field_names) | {"event_id", "event_type"}
    assert events[0]["event_id"] == "citibike_slice.csv.gz:0:0"


def _decode_all(cfg, msgs, topic="t"):
    d = Decoder(cfg.input, cfg.limits.max_event_bytes)
    return [d.decode(m, topic, 0, i) for i, m in enumerate(msgs)]


def test_tesla_protobuf_and_json_decode_alike():
    cfg = load_config(INPUT_CONFIGS / "obd2-tesla.toml")
    pb, js = tesla_payloads("protobuf", limit=2000), tesla_payloads("json", limit=2000)
    assert pb[0][:1] != b"{" and js[0][:1] == b"{"
    a, b = _decode_all(cfg, pb), _decode_all(cfg, js)
    assert [(x.events, x.reasons) for x in a] == [(x.events, x.reasons) for x in b]
    first = a[0].events[0]
    from stream_anon.datasets import load_events
    assert first["vehicle_id"] == vin_of(load_events("obd2", limit=2000)[0]["vehicle_id"])   # the earliest reading
    assert first["gear"] == "ShiftStateD"
    assert first["event_time"].endswith("+00:00") and isinstance(first["pedal_position"], float)
    # readings without a GPS fix have no Location datum: dead letter naming the field
    reasons = {r for x in a for r in x.reasons if r}
    assert any(r.startswith("latitude: missing (input Location.latitude)") for r in reasons), reasons


def test_field_names_of_the_proto():      # every enum value: tests/inputs/test_tesla_roundtrip.py
    from stream_anon.inputs import tesla
    from stream_anon.inputs.proto import tesla_vehicle_data_pb2 as pb
    assert tesla.field_name(pb.Location) == "Location" and tesla.field_name(999) == "Field999"


def test_reasons_name_the_field():
    cfg = load_config(INPUT_CONFIGS / "citibike-csv.toml")
    d = Decoder(cfg.input, cfg.limits.max_event_bytes)
    row = "148,2017-01-01 00:21:00,x,3276,Marin,40.7,-74.04,3185,City Hall,40.71,-74.04,24575,Subscriber,1983,1,f"
    assert d.decode(row.encode(), "t", 0, 0).reasons == [None]
    bad_lat = row.replace("40.7,", "north,", 1)
    assert d.decode(bad_lat.encode(), "t", 0, 1).reasons[0].startswith("latitude: cannot cast 'north' to float")
    no_bike = row.replace(",24575,", ",,")
    assert d.decode(no_bike.encode(), "t", 0, 2).reasons[0] == "vehicle_id: missing (input bikeid)"
    bad_time = row.replace("2017-01-01 00:21:00", "01/01/2017")
    assert d.decode(bad_time.encode(), "t", 0, 3).reasons[0].startswith("event_time: expected a time in format")
    short = d.decode(b"1,2,3", "t", 0, 4)
    assert short.reason == "csv: expected 16 columns (input.columns), got 3" and short.events == []
    big = d.decode(b"x" * 5000, "t", 0, 5)
    assert big.reason.startswith("oversized payload")
    # a naive time with no zone configured
    raw = _raw("citibike-csv")
    cfg2 = parse_config({**raw, "input": {k: v for k, v in raw["input"].items() if k != "timezone"}},
                        base_dir=CONFIGS)
    r = Decoder(cfg2.input).decode(row.encode(), "t", 0, 0).reasons[0]
    assert r.startswith("event_time: time '2017-01-01 00:21:00' has no UTC offset and input.timezone is not set")


def test_json_mapping_pointer_and_casts():
    spec = parse_input({"format": "json", "fields": {
        "unit": {"pointer": "/car/ids/0"}, "t": {"path": "ts", "time_format": "epoch_ms"},
        "speed": {"path": "m.v/s", "cast": "float"}, "on": {"path": "flags.on", "cast": "bool"}}},
        event_time="t", event_types=("x",))
    d = Decoder(spec)
    msg = json.dumps({"car": {"ids": ["V1"]}, "ts": 1500000000000, "m.v/s": "12.5", "flags": {"on": "yes"},
                      "secret_extra": "never passed"}).encode()
    out = d.decode(msg, "topic", 3, 9)
    assert out.reasons == [None]
    assert out.events == [{"unit": "V1", "t": "2017-07-14T02:40:00+00:00", "speed": 12.5, "on": True,
                           "event_id": "topic:3:9", "event_type": "x"}]
    assert d.decode(b"[1]", "t", 0, 0).reason.startswith("malformed event")
    assert d.decode(b"{", "t", 0, 0).reason.startswith("malformed JSON")


def test_gtfs_feed_is_one_event_per_vehicle():
    cfg = load_config(INPUT_CONFIGS / "citibike-gtfs.toml")
    feeds = gtfs_feeds()
    out = _decode_all(cfg, feeds, topic="feed")
    n = sum(len(x.events) for x in out)
    assert n == 20000 and all(r is None for x in out for r in x.reasons)
    multi = next(x for x in out if len(x.events) > 2)
    assert [e["event_id"].rsplit(":", 1)[1] for e in multi.events] == [str(i) for i in range(len(multi.events))]
    from google.transit import gtfs_realtime_pb2 as rt
    empty = rt.FeedMessage()
    empty.header.gtfs_realtime_version = "2.0"
    ent = empty.entity.add(id="alert-1")
    ent.alert.header_text.translation.add(text="detour")
    r = Decoder(cfg.input).decode(empty.SerializeToString(), "feed", 0, 0)
    assert r.reason == "gtfs-realtime: message holds no event" and r.events == []
    assert Decoder(cfg.input).decode(b"\xff\xff\xff", "feed", 0, 0).reason.startswith("gtfs-realtime: not a FeedMessage")


def test_inputs_import_nothing_of_engine_config_strategies():
    code = ("import sys, stream_anon.inputs, stream_anon.inputs.tesla, stream_anon.inputs.gtfs;"
            "bad=[m for m in sys.modules if m.startswith(('stream_anon.engine','stream_anon.config',"
            "'stream_anon.strategies','stream_anon.formers','stream_anon.kafka'))]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------------ worker + audit
def _run_core(cfg, messages, tmp_path):
    """WorkerCore (the worker without Kafka) on one partition, batches of 200, then a final flush; the output
    messages and the counters."""
    from stream_anon.worker.core import WorkerCore
    core = WorkerCore(cfg, "app", SECRET, flush_when_idle_s=1e-9)
    msgs = [(0, off, raw) for off, raw in enumerate(messages)]
    out = []
    for start in range(0, len(msgs), 200):
        out += core.handle(msgs[start:start + 200])
    out += core.flush_all()
    counts = {k: v for k, v in core.stats.totals.items() if k not in ("started", "batches")}
    return out, counts


def _audit(cfg_path, cfg, messages, out):
    from stream_anon.audit import AuditConfig
    from stream_anon.audit.inputs import AuditOutputs, raw_decoder
    from stream_anon.audit.run import audit
    topic = cfg.stream.input_topic
    outputs = AuditOutputs()
    for t, _key, value in out:
        doc = json.loads(value)
        if t == f"anon.{cfg.stream.name}.records":
            outputs.records.append(doc)
        elif t == "anon.releases":
            outputs.manifests.append(doc)
        elif t == "anon.deadletter":
            outputs.deadletters.append(doc)
    raw = [((topic, 0, i), m) for i, m in enumerate(messages)]
    decode = raw_decoder(cfg_path, SECRET)
    return audit(decode(raw), outputs, SECRET, AuditConfig.from_toml(cfg_path))


def _feed_with_bad_vehicles() -> bytes:
    """A feed of 3 vehicles, the first and the last without a position (two dead letters of one message)."""
    from google.transit import gtfs_realtime_pb2 as rt
    feed = rt.FeedMessage()
    feed.header.gtfs_realtime_version = "2.0"
    for i in range(3):
        vp = feed.entity.add(id=f"x{i}").vehicle
        vp.vehicle.id = f"bike-x{i}"
        vp.timestamp = 1484230000 + i          # just after the feeds above: in time, not ahead of it
        if i == 1:
            vp.position.latitude, vp.position.longitude = 40.72, -74.05
    return feed.SerializeToString()


@pytest.mark.parametrize("name", ["obd2-tesla", "citibike-gtfs", "citibike-csv", "oyster-csv", "obd2-csv"])
def test_worker_core_and_audit_agree(name, tmp_path):
    cfg_path = INPUT_CONFIGS / f"{name}.toml"
    cfg = load_config(cfg_path)
    if name == "obd2-tesla":
        pb, js = tesla_payloads("protobuf", limit=1500), tesla_payloads("json", limit=1500)
        messages = [pb[i] if i % 2 else js[i] for i in range(1500)]      # both encodings on one topic
        identifiers = {vin_of(f"s{i}") for i in range(1, 40)}
    elif name == "citibike-gtfs":
        messages = gtfs_feeds(limit=4000) + [_feed_with_bad_vehicles()]
        identifiers = set()
    else:
        from stream_anon.inputs import file_messages
        raw_file = {"citibike-csv": ROOT / "data" / "citibike_slice.csv.gz", "oyster-csv": DATASET_FILES["oyster"],
                    "obd2-csv": DATASET_FILES["obd2"]}[name]
        messages = list(file_messages(raw_file, cfg.input))[:None if name == "obd2-csv" else 6000]
        identifiers = set()
    messages += [b"\x00garbage", b"x" * (cfg.limits.max_event_bytes + 1)]
    out, counts = _run_core(cfg, messages, tmp_path)
    report = _audit(cfg_path, cfg, messages, out)
    acc = report.checks["accounting"]
    assert report.passed, json.dumps({k: v for k, v in report.checks.items() if not v.get("passed")}, default=str)[:3000]
    assert acc["balanced"] and acc["lost"] == 0 and acc["duplicated"] == 0
    assert acc["events_in"] == counts["events_in"]          # the worker counts as the audit does
    assert counts["dead_letters"] == acc["dead_lettered"] >= 2
    if name == "obd2-csv":         # every reading: 39 the mapping cannot read, 2 unreadable messages
        assert counts["events_in"] == 8261 + 2 and counts["dead_letters"] == 39 + 2
    if name == "citibike-gtfs":
        # 4000 trips + a feed of 3 vehicles (2 without a position) + 2 unreadable messages
        assert counts["events_in"] == 4000 + 3 + 2 and counts["dead_letters"] == 2 + 2
        docs = [json.loads(v) for t, _, v in out if t == "anon.deadletter"]
        indexed = sorted(d["source"]["index"] for d in docs if "index" in d["source"])
        assert indexed == [0, 2] and all(d["reason"].startswith("latitude: missing") for d in docs
                                          if "index" in d["source"])
    blob = b"".join(v for _, _, v in out)
    if identifiers:
        assert any(i.encode() in m for m in messages for i in identifiers)   # the check below can fail
    for ident in identifiers:
        assert ident.encode() not in blob, f"identifier {ident} in the output"


def test_replay_file_messages_keyed_by_the_mapped_privacy_unit():
    """``stream-anon replay --file x.csv --config C``: records go out as they are, keyed by the pseudonym of the
    unit the mapping reads (no broker needed to check what would be produced)."""
    from stream_anon import crypto
    from stream_anon.kafka.replay import mapped_messages
    cfg = load_config(INPUT_CONFIGS / "citibike-csv.toml")
    pairs = mapped_messages(ROOT / "data" / "citibike_slice.csv.gz", cfg, SECRET, limit=50)
    assert len(pairs) == 50
    d = Decoder(cfg.input)
    for i, (key, raw) in enumerate(pairs):
        bike = d.decode(raw, "t", 0, i).events[0]["vehicle_id"]
        assert key == crypto.pseudonym(SECRET, bike).encode() and bike.encode() not in key
    assert pairs[0][1].startswith(b"148,2017-01-01 00:21:00,")


def test_evaluate_own_file_compares_streaming_and_offline(tmp_path):
    from stream_anon.evaluate import run_own
    import gzip
    src = ROOT / "data" / "citibike_slice.csv.gz"
    lines = gzip.open(src, "rt", encoding="utf-8").read().splitlines(keepends=True)[:2001]
    small = tmp_path / "trips.csv"
    small.write_text("".join(lines))
    res = run_own(INPUT_CONFIGS / "citibike-csv.toml", small, ["mondrian"], [5], tmp_path / "out",
                  progress=lambda s: None)
    row = res["comparison"][0]
    assert row["n"] == 2000 and row["streaming_events"] == 2000
    assert row["streaming_published"] + row["streaming_suppressed"] == 2000
    assert 0 < row["offline_mondrian_table_ncp"] <= row["offline_mondrian_windows_ncp"] < 1
    assert 0 < row["streaming_ncp"] < 1
    assert (tmp_path / "out" / "comparison.md").read_text().startswith("| strategy | k |")
    # the analyst's workload on the same events: streaming, offline on the same windows, on the whole table
    assert all(0 < row[f"{v}_query_error"] < 5 for v in ("streaming", "offline_windows", "offline_table"))
    q = json.loads((tmp_path / "out" / "query_error.json").read_text())[0]
    assert q["run"]["streaming"]["all"]["mean"] == row["streaming_query_error"]
    assert sum(r["events"] for r in q["per_release"]) == row["streaming_published"] + row["streaming_suppressed"]


# ------------------------------------------------------------------------------------------------ bundled datasets
# The bundled raw files read through configs/inputs/oyster-csv.toml and obd2-csv.toml (no adapter code), against
# the adapters (stream_anon/datasets) and the built-in configs on the same rows.
DATASET_FILES = {"oyster": ROOT / "data" / "oyster_slice.csv.gz", "obd2": ROOT / "data" / "obd2_19drivers.csv.gz"}


def _rows(path) -> int:
    import gzip
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return sum(1 for _ in fh) - 1           # the header; no field of these files holds a newline


def test_oyster_csv_equals_the_adapter_but_the_joined_products():
    from stream_anon.datasets import load_events
    from stream_anon.datasets.oyster import product_category
    cfg = load_config(INPUT_CONFIGS / "oyster-csv.toml")
    events, rejected = decode_file(DATASET_FILES["oyster"], cfg.input)
    old = load_events("oyster")
    assert rejected == [] and len(events) == len(old) == _rows(DATASET_FILES["oyster"]) == 33536
    same = ("event_time", "event_type", "journey_id", "station", "bus_route", "full_fare_pence",
            "discounted_fare_pence", "daily_capping")
    assert [tuple(e[f] for f in same) for e in events] == [tuple(e[f] for f in same) for e in old]
    # the one difference: the adapter copies a journey's product from its later tap-out onto the tap-in
    differ = [(a, b) for a, b in zip(old, events)
              if (a["fare_product"], a["product_category"]) != (b["fare_product"], b["product_category"])]
    assert len(differ) == 5119 and all(a["event_type"] == "tap_in" and b["fare_product"] is None
                                       and b["product_category"] is None for a, b in differ)
    assert all(e["fare_product"] is None for e in events if e["event_type"] == "tap_in")
    # the config's category table is the adapter's rule, product by product
    table = _raw("oyster-csv")["input"]["fields"]["product_category"]["lookup"]
    assert table == {p: product_category(p) for p in table}
    assert {e["fare_product"] for e in old if e["fare_product"]} <= set(table)


def test_obd2_csv_against_the_adapter():
    from collections import Counter
    from stream_anon.datasets import load_events
    cfg = load_config(INPUT_CONFIGS / "obd2-csv.toml")
    events, rejected = decode_file(DATASET_FILES["obd2"], cfg.input)
    assert len(events) + len(rejected) == _rows(DATASET_FILES["obd2"]) == 8261
    why = Counter(r.split(" (input")[0].split(", got")[0] for _, _, r in rejected)
    assert why == {"event_time: missing elapsed time": 34,
                   "event_time: expected an elapsed time H:MM[:SS] or seconds": 3,
                   "signals.throttle_pos_pct: cannot cast '1:6032000007E803' to float": 2}
    old = {int(e["event_id"].split("-")[1]): e for e in load_events("obd2")}      # obd-<row>
    for e in events:
        a = old[int(e["event_id"].rsplit(":", 1)[1])]                             # <file>:0:<row>
        assert (e["vehicle_id"], e["latitude"], e["longitude"], e["speed_kmh"]) == \
               (a["vehicle_id"], a["latitude"], a["longitude"], a["speed_kmh"])
        assert e["signals"] == {k: a["signals"][k] for k in e["signals"]}
    no_fix = [n for n, a in old.items() if a["latitude"] is None]        # "0.0": a reading without a position
    assert len(no_fix) == 859 and sum(e["latitude"] is None for e in events) == 859 - len(
        {n for n, _, _ in rejected} & set(no_fix)) == 852
    # the event time: TIME + runtime, the adapter's own when the driver's engine never restarted
    times = Counter(e["event_time"] == old[int(e["event_id"].rsplit(":", 1)[1])]["event_time"] for e in events)
    assert times[True] > 0.5 * len(events), times


def _engine_and_check(cfg_path, events):
    """The engine (library path, one partition, flushed) on mapped events, checked with the audit's own
    primitives: k in distinct individuals per class over all releases, every published QI covering its raw
    value, and the accounting (published + suppressed + rejected = events in, nothing left deferred)."""
    from collections import defaultdict
    from stream_anon.audit import AuditConfig
    from stream_anon.audit.primitives import audit_token, covers, qi_value
    from stream_anon.engine import Engine
    cfg = load_config(cfg_path)
    engine = Engine(cfg, partition=0, secret=SECRET)
    res = engine.process(events)
    res.extend(engine.flush())
    view = AuditConfig.from_toml(cfg_path)
    by_token = {audit_token(SECRET, e["event_id"]): e for e in events}
    units, published, suppressed = defaultdict(set), 0, 0
    for rel in res.releases:
        for r in rel.records:
            e = by_token[r["audit_token"]]
            units[r["class_id"]].add(e[view.privacy_unit])
            for q in view.quasi_identifiers:
                assert covers(q, r["qi"][q.name], qi_value(q, e)), (q.name, r["qi"], e)
            published += 1
        suppressed += sum(len(t) for t in rel.suppressed_tokens.values())
    assert engine.deferred == 0
    assert published + suppressed + len(res.rejected) == len(events)
    assert units and min(len(u) for u in units.values()) >= view.k
    return res, published, suppressed


@pytest.mark.parametrize("name, builtin, dataset", [("oyster-csv", "oyster", "oyster"),
                                                    ("obd2-csv", "obd2", "obd2")])
def test_bundled_csv_configs_through_the_engine(name, builtin, dataset):
    """The mapped config on the raw file against the built-in config on the adapter's events: accounting exact,
    k per class, and the same loss (Oyster: the same QI values, hence the same NCP; OBD-II: 39 readings fewer and
    times from TIME + runtime, hence close)."""
    from stream_anon.datasets import load_events
    from stream_anon.evaluate import streaming_ncp
    path = INPUT_CONFIGS / f"{name}.toml"
    cfg = load_config(path)
    events, rejected = decode_file(DATASET_FILES[dataset], cfg.input)
    res, published, suppressed = _engine_and_check(path, events)
    assert len(events) + len(rejected) == _rows(DATASET_FILES[dataset])
    mapped = streaming_ncp(cfg, events)
    built = streaming_ncp(load_config(CONFIGS / f"{builtin}.toml"), load_events(dataset))
    assert (mapped["published"], mapped["suppressed"]) == (published, suppressed)
    if name == "oyster-csv":
        assert mapped["events"] == built["events"] == 33536 and mapped["releases"] == built["releases"]
        assert mapped["ncp"] == pytest.approx(built["ncp"], abs=1e-12)
    else:
        assert (mapped["events"], built["events"]) == (8222, 8261) and mapped["releases"] == built["releases"]
        assert mapped["ncp"] == pytest.approx(built["ncp"], abs=0.01)
        # file order (one driver after another) releases as time order does: within the allowed lateness
        in_order = streaming_ncp(cfg, sorted(events, key=lambda e: e["event_time"]))
        assert (in_order["ncp"], in_order["suppressed"]) == (mapped["ncp"], mapped["suppressed"])



@pytest.mark.parametrize("name, dataset", [("oyster-csv", "oyster"), ("obd2-csv", "obd2")])
def test_calibrated_copy_elsewhere_reads_alike(name, dataset, tmp_path):
    """``stream-anon calibrate`` writes the config into another directory: its lookup and hierarchy files made
    absolute, keys that are no bare TOML keys quoted ("signals.engine_rpm", "Bus & Tram Pass-7 Day")."""
    from stream_anon.calibrate import calibrate
    cfg = load_config(INPUT_CONFIGS / f"{name}.toml")
    events, rejected = decode_file(DATASET_FILES[dataset], cfg.input)
    out = tmp_path / "calibrated.toml"
    calibrate(INPUT_CONFIGS / f"{name}.toml", events, out)
    copy = load_config(out)
    from dataclasses import replace
    assert [replace(f, lookup_source="") for f in copy.input.fields] == \
           [replace(f, lookup_source="") for f in cfg.input.fields]
    assert decode_file(DATASET_FILES[dataset], copy.input) == (events, rejected)


@pytest.mark.parametrize("name, dataset, units", [("oyster-csv", "oyster", None), ("obd2-csv", "obd2", 19)])
def test_replay_keys_the_raw_files_by_their_unit(name, dataset, units):
    """``stream-anon replay --file`` with the raw-file configs: every record goes out verbatim, keyed by the
    pseudonym of its journey / driver (records the mapping rejects too: their unit can be read)."""
    from stream_anon import crypto
    from stream_anon.inputs import file_messages
    from stream_anon.kafka.replay import mapped_messages
    cfg = load_config(INPUT_CONFIGS / f"{name}.toml")
    pairs = mapped_messages(DATASET_FILES[dataset], cfg, SECRET)
    assert [m for _, m in pairs] == list(file_messages(DATASET_FILES[dataset], cfg.input))
    assert len(pairs) == _rows(DATASET_FILES[dataset]) and None not in {k for k, _ in pairs}
    unit_source = next(f.source for f in cfg.input.fields if f.name == cfg.stream.privacy_unit)
    unit_column = cfg.input.columns.index(unit_source)
    import csv
    expected = [crypto.pseudonym(SECRET, next(csv.reader([m.decode()]))[unit_column]).encode() for _, m in pairs]
    assert [k for k, _ in pairs] == expected
    assert units is None or len(set(expected)) == units
