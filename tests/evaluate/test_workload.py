"""The analyst's workload (stream_anon/evaluate/workload.py) and the streaming-vs-offline query error
(stream_anon/evaluate/utility.py): answers against hand-computed shares, published records read as the boxes they
cover, the families drawn from the data, and the error of exact, suppressed and generalized releases."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stream_anon import contract
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.evaluate.utility import Placement, placement_from_engine, query_error
from stream_anon.evaluate.workload import (CLOSED, HALF_OPEN, LEAVES, QuerySpace, analyst_workload, box_answers,
                                          relative_errors, summarize)

INF = np.inf


def test_shares_of_leaves_half_open_time_and_closed_positions():
    kinds = np.array([LEAVES, HALF_OPEN, CLOSED])
    #         leaves 2..5 (4), time [0, 100), position [0, 1]; and one point record
    lo = np.array([[2.0, 0.0, 0.0], [3.0, 50.0, 0.5]])
    hi = np.array([[5.0, 100.0, 1.0], [3.0, 50.0, 0.5]])
    q_lo = np.array([[4.0, 25.0, -INF],      # leaves 4..9, time [25, 75)      -> 2/4 * 1/2 = 0.25; point: 0
                     [3.0, 50.0, 0.0],       # leaf 3, time [50, 60), [0, .5] -> 1/4 * 1/10 * 1/2; point: 1
                     [-INF, 100.0, -INF]])   # time [100, 200): the box ends before 100 (half-open), the point too
    q_hi = np.array([[9.0, 75.0, INF], [3.0, 60.0, 0.5], [INF, 200.0, INF]])
    got = box_answers(kinds, lo, hi, q_lo, q_hi, group=np.array([0, 1]), n_groups=2)
    assert got[0] == pytest.approx([0.25, 0.25 * 0.1 * 0.5, 0.0])
    assert got[1] == pytest.approx([0.0, 1.0, 0.0])
    # the truth is the same function on points; weights multiply
    assert box_answers(kinds, lo[1:], hi[1:], q_lo, q_hi, weight=np.array([3.0]))[0] == pytest.approx([0, 3, 0])


def test_relative_errors_only_where_something_happened():
    err = relative_errors(np.array([3.0, 0.0, 2.0]), np.array([4.0, 0.0, 1.0]))
    assert err[0] == pytest.approx(0.25) and np.isnan(err[1]) and err[2] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def oyster():
    return load_config(contract.config_path("oyster"))


def test_published_records_read_as_the_boxes_they_cover(oyster):
    qs = QuerySpace.of(oyster)
    h = oyster.quasi_identifiers[1].hierarchy
    zone1 = h.node_range("Zone 1")
    record = {"qi": {"time": {"from": "2009-11-09T08:00:00+00:00", "to": "2009-11-09T08:30:00+00:00"},
                     "location": {"label": "Zone 1"}, "event_type": {"label": "tap_in"}},
              "sensitive": {"fare_product": "PAYG"}}
    lo, hi = qs.boxes([record])
    t0 = 1257753600.0                       # 2009-11-09T08:00:00Z
    assert lo[0, 0] == t0 and hi[0, 0] == t0 + 1800
    assert (lo[0, 1], hi[0, 1]) == zone1
    assert lo[0, -1] == hi[0, -1] == qs.product_values.index("PAYG")
    # a station of Zone 1 in the hour 08:00-09:00: 1/|Zone 1| of the record
    station = h.leaves[zone1[0]]
    q_lo = np.array([[t0, zone1[0], -INF, -INF]])
    q_hi = np.array([[t0 + 3600, zone1[0], INF, INF]])
    est = box_answers(qs.kinds, lo, hi, q_lo, q_hi)
    assert est[0, 0] == pytest.approx(1 / (zone1[1] - zone1[0] + 1))
    # its event at that station at 08:10 is one point of that query
    event = {"event_time": "2009-11-09T08:10:00+00:00", "station": station, "event_type": "tap_in",
             "fare_product": "PAYG"}
    X, ok = qs.points([event])
    assert ok.all() and box_answers(qs.kinds, X, X, q_lo, q_hi)[0, 0] == 1.0
    # a value the reader cannot place answers as the whole domain (never as a point, never an exception)
    odd = {"qi": {"time": {"from": "not a time", "to": None}, "location": {"label": "Atlantis"}}, "sensitive": {}}
    lo, hi = qs.boxes([odd])
    assert (lo[0, :3] == qs.space.lower).all() and (hi[0, :3] == qs.space.upper).all() and lo[0, -1] == -1


def test_workload_cells_come_from_the_events_and_the_seed(oyster):
    qs = QuerySpace.of(oyster)
    events = load_events("oyster", limit=3000)
    X, ok = qs.points(events)
    w = analyst_workload(qs, X[ok], seed=3, per_family=40)
    assert w.families == ("area x hour", "station x hour", "product x day")
    truth = box_answers(qs.kinds, X[ok], X[ok], w.lo, w.hi)[0]
    assert (truth >= 1).all()                                   # every cell holds an event
    assert len({(a.tobytes(), b.tobytes()) for a, b in zip(w.lo, w.hi)}) == len(w)    # distinct cells
    again = analyst_workload(qs, X[ok], seed=3, per_family=40)
    other = analyst_workload(qs, X[ok], seed=4, per_family=40)
    assert again.label == w.label and other.label != w.label
    # an hour query: [h, h + 1 h) on the time axis, one zone's leaves on the location axis
    i = list(w.family).index("area x hour")
    assert w.hi[i, 0] - w.lo[i, 0] == 3600 and w.lo[i, 0] % 3600 == 0
    assert w.label[i].split(" at ")[0] in oyster.quasi_identifiers[1].hierarchy.graph


@pytest.fixture(scope="module")
def small_run(oyster):
    events = load_events("oyster", limit=4000)
    return events, placement_from_engine(oyster, events)


def test_streaming_and_offline_errors_of_a_generalized_release(oyster, small_run):
    events, placement = small_run
    q = query_error(oyster, placement, per_family=50)
    assert q["events"] == len(placement.events) == 4000
    assert set(q["run"]) == {"streaming", "offline_windows", "offline_table"}
    for variant in q["run"].values():
        assert variant["all"]["queries"] == sum(q["workload"]["queries"].values())
        assert 0 < variant["all"]["mean"] < 5
    # oyster's sensitive fare product is published as it is: product x day errs only where time boxes straddle
    # midnight or records are suppressed
    assert q["run"]["streaming"]["product x day"]["mean"] < 0.05
    assert q["run"]["streaming"]["station x hour"]["mean"] > q["run"]["streaming"]["product x day"]["mean"]
    # per release: the events it placed, and queries only where the release has events
    assert sum(r["events"] for r in q["per_release"]) == 4000
    assert all(r["streaming"]["all"]["queries"] > 0 for r in q["per_release"] if r["events"])


def test_an_exact_release_has_no_error_and_a_suppressed_one_errs_by_one(oyster, small_run):
    events, placement = small_run
    qs = QuerySpace.of(oyster)
    X, _ = qs.points(placement.events)
    w = analyst_workload(qs, X, per_family=30)
    truth = box_answers(qs.kinds, X, X, w.lo, w.hi)[0]
    assert summarize(w, truth, truth)["all"]["mean"] == 0.0
    # nothing published: every query answers 0, each off by its whole count
    nothing = dataclasses.replace(placement, records=[], record_release=np.array([], dtype=np.int64))
    q = query_error(oyster, nothing, per_family=30, offline=False)
    assert q["run"]["streaming"]["all"]["mean"] == 1.0 and q["run"]["streaming"]["all"]["p90"] == 1.0


def test_records_of_each_events_own_cell_answer_every_query_exactly(oyster, small_run):
    """A release publishing each event's own cell (its minute, its station or route, its event type, its product)
    answers every hour, area, station and product query exactly: the chain records -> boxes -> shares is exact."""
    from stream_anon.engine.space import iso, parse_time
    events, placement = small_run
    records = []
    for e in placement.events:
        t = parse_time(e["event_time"]) // 60 * 60
        records.append({"qi": {"time": {"from": iso(t), "to": iso(t + 60)},
                               "location": {"label": e.get("station") or e.get("bus_route")},
                               "event_type": {"label": e["event_type"]}},
                        "sensitive": {"fare_product": e["fare_product"]}})
    exact = dataclasses.replace(placement, records=records, record_release=placement.event_release)
    q = query_error(oyster, exact, per_family=40, offline=False)
    assert q["run"]["streaming"]["all"]["queries"] > 60
    assert q["run"]["streaming"]["all"]["mean"] == pytest.approx(0.0, abs=1e-9)
    assert max(r["streaming"]["all"]["mean"] or 0 for r in q["per_release"]) == pytest.approx(0.0, abs=1e-9)


def test_placement_counts_every_placed_event_once(oyster, small_run):
    events, placement = small_run
    assert isinstance(placement, Placement)
    assert len(placement.event_release) == len(placement.events)
    published = {r["audit_token"] for r in placement.records}
    assert len(published) == len(placement.records) <= len(events)
    assert set(placement.record_release.tolist()) <= set(range(len(placement.releases)))


def test_dp_rows_stated_and_realized_error():
    """The DP side of the comparison: the stated half-width is that of the merged rows' 95% intervals (integer noise:
    the exact quantiles, a little wider than z(0.975) x its std), and the realized error is measured against the
    events' true counts."""
    from statistics import NormalDist

    from stream_anon.dp.merge import merge_rows
    cfg = load_config(contract.config_path("oyster-cards"))
    placement = placement_from_engine(cfg, load_events("oyster-cards", limit=3000))
    q = query_error(cfg, placement, per_family=20, offline=False)
    rows = [m for m in merge_rows(placement.dp_rows) if m["aggregate"] == "tap_ins_zone_hour"
            and m["output"] == "per_window"]
    z = NormalDist().inv_cdf(0.975)
    half = [(m["interval"][1] - m["interval"][0]) / 2 for m in rows]
    e = q["dp"]["tap_ins_zone_hour"]
    assert e["rows"] == len(rows) > 0
    assert e["stated_half_width"] == pytest.approx(float(np.median(half)), abs=1e-3)
    assert z * float(np.median([m["noise_std"] for m in rows])) <= e["stated_half_width"] <= \
        z * float(np.median([m["noise_std"] for m in rows])) + 2
    by = {t["min_true_count"]: t for t in e["realized"]["by_threshold"]}
    assert by[1]["cells"] >= by[10]["cells"] > 0 and 0 <= by[10]["median_relative_error"] < 1
