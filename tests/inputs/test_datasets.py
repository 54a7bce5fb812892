"""Dataset adapters on the committed slices, and (when ../shared/data is present) on the full files."""
from __future__ import annotations

import csv
import gzip
import itertools
import json
from collections import Counter

import pandas as pd
import pytest

from stream_anon import contract
from stream_anon.datasets import DATASETS, load_events, oyster
from stream_anon.datasets.citibike import local_time
from stream_anon.datasets.obd2 import parse_coordinate, parse_epoch_ms, parse_number, parse_runtime
from stream_anon.events import parse_event_time, validate_event
from stream_anon.hierarchy import Hierarchy

KIND = {"oyster": "fare", "citibike": "vehicle", "obd2": "vehicle", "oyster-cards": "fare"}
HIERARCHY = Hierarchy.from_json(oyster.HIERARCHY_PATH)


def full_data(name):
    path = DATASETS[name].full_path
    return pytest.mark.skipif(not path.exists(), reason=f"full data {path} absent (plain clone without ../shared)")


def raw_rows(path) -> int:
    with gzip.open(path, "rt") as fh:
        return sum(1 for _ in fh) - 1


def location(event):
    return event["station"] if event["station"] is not None else event["bus_route"]


@pytest.fixture(scope="module")
def slices():
    return {name: load_events(name) for name in DATASETS}


@pytest.fixture(scope="module")
def oyster_full():
    return load_events("oyster", full=True)


# -- committed slices ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_slice_events_validate_and_keep_every_row(slices, name):
    events = slices[name]
    # oyster-cards regroups the slice's journeys (tests/privacy/test_minvariance_attack.py)
    if not DATASETS[name].derived:
        assert len(events) == raw_rows(DATASETS[name].slice_path)
    assert len({e["event_id"] for e in events}) == len(events)
    reasons = Counter(validate_event(e, KIND[name]) for e in events)
    assert reasons == Counter({None: len(events)})


def test_slices_are_small_and_attributed():
    for dataset in DATASETS.values():
        assert dataset.slice_path.exists()
        assert dataset.slice_path.stat().st_size < 1_000_000
    attribution = contract.data_path("ATTRIBUTION.md").read_text()
    for needle in ("Powered by TfL Open Data", "Citi Bike data use policy", "Cephas Barreto",
                   "oyster_slice.csv.gz", "citibike_slice.csv.gz", "obd2_19drivers.csv.gz", "london_stations.csv"):
        assert needle in attribution


def test_load_events_limit_and_unknown_name():
    assert [e["event_id"] for e in load_events("citibike", limit=3)] == ["cb-0", "cb-1", "cb-2"]
    with pytest.raises(KeyError, match="unknown dataset"):
        load_events("adult")


# -- Oyster ----------------------------------------------------------------------------------------------------
def test_oyster_slice_is_a_busy_contiguous_prefix(slices):
    events = slices["oyster"]
    assert 30_000 <= len(events) <= 40_000
    times = [parse_event_time(e["event_time"]) for e in events]
    assert times == sorted(times)
    assert events[0]["event_time"] == "2009-11-09T04:31:00+00:00"
    assert events[-1]["event_time"] == "2009-11-09T07:29:00+00:00"
    assert Counter(e["event_type"] for e in events).keys() == {"tap_in", "tap_out", "bus_boarding"}


def test_oyster_slice_locations_are_hierarchy_leaves(slices):
    assert all(location(e) in HIERARCHY.leaves for e in slices["oyster"])


def test_oyster_row_mapping(slices):
    by_id = {e["event_id"]: e for e in slices["oyster"]}
    assert by_id["oy-mon-0"] == {
        "event_id": "oy-mon-0", "kind": "fare", "event_type": "bus_boarding", "event_time": "2009-11-09T04:31:00+00:00",
        "journey_id": "893074", "card_id": None, "subsystem": "LTB", "station": None, "bus_route": "358",
        "fare_product": "Bus & Tram Pass-7 Day", "product_category": "bus_tram_pass", "full_fare_pence": 0,
        "discounted_fare_pence": 0, "daily_capping": False}
    tap_in = by_id["oy-mon-112"]
    assert (tap_in["event_type"], tap_in["station"], tap_in["journey_id"]) == ("tap_in", "Hammersmith (Met.)", "893986")
    # the product of a tap-in comes from its journey's tap-out; a tap-in carries no fare or capping
    tap_out = next(e for e in slices["oyster"] if e["journey_id"] == "893986" and e["event_type"] == "tap_out")
    assert tap_in["fare_product"] == tap_out["fare_product"] == "PAYG"
    assert (tap_in["full_fare_pence"], tap_in["daily_capping"]) == (None, None)


def test_oyster_event_time_after_midnight():
    assert oyster.event_time("04:31") == "2009-11-09T04:31:00+00:00"
    assert oyster.event_time("24:00") == "2009-11-10T00:00:00+00:00"
    assert oyster.event_time("28:30") == "2009-11-10T04:30:00+00:00"


@pytest.mark.parametrize("product, category", [
    ("PAYG", "payg"), ("LUL Travelcard-7 Day", "travelcard"), ("LUL Travelcard->Annual", "travelcard"),
    ("Bus & Tram Pass-1 Month", "bus_tram_pass"), ("Bus & Tram Pass - B&T Discount-7 Day", "bus_tram_pass"),
    ("Bus & Tram Pass (Child Free)", "child"), ("Freedom Pass (Elderly)", "freedom_pass_elderly"),
    ("Freedom Pass (Disabled)", "freedom_pass_disabled"), ("Staff Pass - Bus Operator Nominee", "staff"),
    ("Staff Pass - Staff Retired including LCB", "staff"), ("Tfl Travel - Free", "other"), ("", None), (None, None),
])
def test_product_category(product, category):
    assert oyster.product_category(product) == category


@pytest.mark.parametrize("route, group", [
    ("1", ("Day routes", "Bus routes 1-99")), ("15H", ("Day routes", "Bus routes 1-99")),
    ("370D", ("Day routes", "Bus routes 300-399")), ("N8", ("Night routes", "Night routes N1-N99")),
    ("N134", ("Night routes", "Night routes N100-N199")), ("C10D", ("Lettered routes", "Routes C*")),
    ("RV1", ("Lettered routes", "Routes RV*")), ("ELW", ("Other routes", "Unclassified routes")),
])
def test_route_group(route, group):
    assert oyster.route_group(route) == group


def test_alias_table_targets_known_stations():
    aliases = oyster.station_aliases()
    zones = oyster.station_zones()
    assert len(aliases) == 88
    unknown = {raw: canonical for raw, canonical in aliases.items() if canonical not in zones}
    assert unknown == {"Not Applicable": "Not Applicable"}          # mapped to itself, under "Other rail"
    assert aliases["Kings Cross T"] == "Kings Cross St. Pancras"
    assert aliases["WIMBLEDON TRAM "] == "Wimbledon"                 # raw tram names keep a trailing space


def test_location_hierarchy_shape():
    data = json.loads(oyster.HIERARCHY_PATH.read_text())
    assert data["name"] == "oyster_location" and len(data["levels"]) == 5
    assert {HIERARCHY.depth(leaf) for leaf in HIERARCHY.leaves} == {4}
    zones = oyster.station_zones()
    assert set(zones) <= set(HIERARCHY.leaves)
    assert HIERARCHY.ancestors("Addington Village") and "Zone 3" in HIERARCHY.ancestors("Addington Village")  # "3,4,5,6"
    assert "Zone 1" in HIERARCHY.ancestors("Earls Court")                                                  # "1,2"
    assert {"Other rail", "Zone unknown", "Rail"} <= set(HIERARCHY.ancestors("Reading"))                   # no zone
    assert "Night routes" in HIERARCHY.ancestors("N8")


@full_data("oyster")
def test_oyster_full_no_event_dropped_and_locations_are_leaves(oyster_full):
    assert len(oyster_full) == 525_680
    assert Counter(e["event_type"] for e in oyster_full) == {"bus_boarding": 277_150, "tap_in": 124_265,
                                                             "tap_out": 124_265}
    assert all(location(e) in HIERARCHY.leaves for e in oyster_full)
    # every tap-in found its journey's tap-out product in the full day
    assert all(e["fare_product"] for e in oyster_full)


@full_data("oyster")
def test_oyster_full_alias_table_covers_every_unmatched_name():
    raw = pd.read_csv(DATASETS["oyster"].full_path, dtype=str, keep_default_na=False, usecols=["station"])["station"]
    unmatched = set(raw[raw != ""]) - set(oyster.station_zones())
    assert len(unmatched) == 88
    assert unmatched == set(oyster.station_aliases())
    assert (raw.isin(unmatched)).sum() == 34_946


@full_data("oyster")
def test_oyster_full_product_shares_match_the_issue(oyster_full):
    journeys = [e for e in oyster_full if e["event_type"] != "tap_in"]     # one tap-out or bus boarding per journey
    counts = Counter(e["product_category"] for e in journeys)
    share = {k: 100 * v / len(journeys) for k, v in counts.items()}
    expected = {"payg": 35.0, "travelcard": 27.4, "bus_tram_pass": 18.3, "freedom_pass_elderly": 10.3, "child": 5.2,
                "freedom_pass_disabled": 2.9, "staff": 1.0}
    for category, pct in expected.items():
        assert share[category] == pytest.approx(pct, abs=1.0), category
    # measured (two decimals): the residue is "Tfl Travel - Free", 169 journeys
    assert share["other"] == pytest.approx(0.04, abs=0.01)


@full_data("oyster")
def test_oyster_slice_agrees_with_full_file(slices, oyster_full):
    for s, f in zip(slices["oyster"], oyster_full):
        if s["event_type"] == "tap_in":     # a tap-in's product may lie beyond the slice's end
            s, f = ({k: v for k, v in e.items() if k not in ("fare_product", "product_category")} for e in (s, f))
        assert s == f


@full_data("oyster")
def test_committed_hierarchy_is_up_to_date(tmp_path):
    out = tmp_path / "oyster_location.json"
    oyster.build_location_hierarchy(DATASETS["oyster"].full_path, out)
    assert out.read_text() == oyster.HIERARCHY_PATH.read_text()


# -- Citi Bike -------------------------------------------------------------------------------------------------
def test_citibike_local_time_offsets():
    assert local_time("2017-01-01 00:21:00") == "2017-01-01T00:21:00-05:00"
    assert local_time("2017-07-01 08:00:00") == "2017-07-01T08:00:00-04:00"
    assert local_time("2017-11-05 01:30:00") == "2017-11-05T01:30:00-04:00"     # repeated hour: first reading
    assert local_time("2018-03-31 23:44:04") == "2018-03-31T23:44:04-04:00"


def test_citibike_slice_mapping(slices):
    events = slices["citibike"]
    assert len(events) == 20_000
    first = events[0]
    assert first["vehicle_id"] == "24575" and first["trip_id"] == "cb-trip-0"
    assert (first["latitude"], first["longitude"]) == (40.71458404, -74.04281706)
    assert first["signals"] == {"birth_year": 1983.0, "trip_duration_s": 148.0}
    assert first["payload"] == {"start_station_id": 3276, "start_station": "Marin Light Rail", "end_station_id": 3185,
                                "end_station": "City Hall", "end_latitude": 40.7177325, "end_longitude": -74.043845,
                                "usertype": "Subscriber", "gender": 1, "fleet_contract": "leased"}
    assert all(40.6 < e["latitude"] < 40.8 and -74.1 < e["longitude"] < -73.9 for e in events)


@full_data("citibike")
def test_citibike_full_missing_birth_years():
    events = load_events("citibike", full=True)
    assert len(events) == 144_709
    # 1,705 empty + 4,621 literal "NULL"
    assert sum(e["signals"]["birth_year"] is None for e in events) == 6_326
    assert sum(e["payload"]["usertype"] is None for e in events) == 117


# -- OBD-II ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell, value", [
    ("100kPa", 100.0), ("82C", 82.0), ("-3C", -3.0), ("48km/h", 48.0), ("2124RPM", 2124.0), ("24,77g/s", 24.77),
    ("74,50%", 74.5), ("-1,60%", -1.6), ("46.0", 46.0),
])
def test_obd2_parse_number(cell, value):
    assert parse_number(cell) == value


@pytest.mark.parametrize("cell", ["1:6032000007E803", "MIL is OFF0 codes", "12abc"])
def test_obd2_parse_number_rejects(cell):
    with pytest.raises(ValueError):
        parse_number(cell)


def test_obd2_coordinates_and_time():
    assert parse_coordinate("-58.321.307", 1) == -5.8321307
    assert parse_coordinate("-583.251.443", 1) == -5.83251443
    assert parse_coordinate("-3.520.429.461", 2) == -35.20429461
    assert parse_coordinate("-35.180.363", 2) == -35.180363
    assert parse_epoch_ms("1,51336E+12") == 1_513_360_000_000.0
    assert parse_epoch_ms("1,5133E+12") == 1_513_300_000_000.0
    assert parse_runtime("00:03:02") == 182 and parse_runtime("1:6032000007E804") is None


def test_obd2_full_file_is_bundled_and_parsed():
    stats = Counter()
    events = DATASETS["obd2"].read(DATASETS["obd2"].slice_path, stats=stats)
    assert len(events) == 8_261
    assert len({e["vehicle_id"] for e in events}) == 19
    positions = [(e["latitude"], e["longitude"]) for e in events if e["latitude"] is not None]
    assert len(positions) == 8_261 - 859 == 8_261 - stats["no_gps_fix"]
    assert all(-6.0 < lat < -5.7 and -35.3 < lon < -35.1 for lat, lon in positions)   # Natal
    unparseable = {k: v for k, v in stats.items() if k != "no_gps_fix"}
    assert sum(unparseable.values()) == 30                  # leaked raw OBD responses like "1:6032000007E803"
    first = next(e for e in events if e["event_id"] == "obd-0")      # the file's first row (events: time order)
    assert [e["event_time"] for e in events] == sorted(e["event_time"] for e in events)
    assert first["signals"]["engine_rpm"] == 2124.0 and first["signals"]["maf_g_s"] == 24.77
    assert first["speed_kmh"] == 48.0 and first["payload"]["dtc_status"] == "MIL is OFF0 codes"


def test_obd2_time_is_strictly_increasing_per_driver(slices):
    for driver, rows in itertools.groupby(slices["obd2"], key=lambda e: e["vehicle_id"]):
        times = [parse_event_time(e["event_time"]) for e in rows]
        assert all(b > a for a, b in zip(times, times[1:])), driver
    s5 = Counter(e["trip_id"] for e in slices["obd2"] if e["vehicle_id"] == "s5")
    assert s5 == {"obd-s5-1": 1, "obd-s5-2": 460}          # ENGINE_RUNTIME restarts after the first reading


def test_bundled_obd2_is_the_full_file():
    full = DATASETS["obd2"].full_path
    if not full.exists():
        pytest.skip(f"full data {full} absent (plain clone without ../shared)")
    assert DATASETS["obd2"].slice_path.read_bytes() == full.read_bytes()


def test_london_stations_copy_is_complete():
    with open(contract.data_path("london_stations.csv"), newline="") as fh:
        assert sum(1 for _ in csv.DictReader(fh)) == 653
