"""Issue 14 item 6: the demo's error figures (stream_anon.dp.report) on a stream whose truth is known by
construction: near-noise-free releases (epsilon 1e6) of two partitions, shifted by a known offset after merging."""
from __future__ import annotations

import pytest

from stream_anon.dp import BudgetLedger, DPAggregator, parse_dp_config
from stream_anon.dp.merge import merge_rows
from stream_anon.dp.report import aggregate_rmse, relative_errors, release_relative_errors

DAY0_W = 1257724800 // 900                   # 2009-11-09 00:00 London (UTC in November)
PER_WINDOW = {"a": 30, "b": 5}               # tap-ins per window and zone, times 1 + window % 3 (a release
                                             # one window off would change every hourly truth)


def _hourly(zone: str) -> list[int]:
    return [sum(PER_WINDOW[zone] * (1 + i % 3) for i in range(h * 4, h * 4 + 4)) for h in range(4)]


def _cfg():
    return parse_dp_config({
        "stream": {"name": "t", "privacy_unit": "card", "event_time": "event_time"},
        "anonymization": {"window_s": 900},
        "dp": {"unit": "individual", "period": "day", "timezone": "Europe/London", "epsilon_per_period": 1e6,
               "max_windows_per_period": 16},
        "aggregates": [{"name": "tap_ins_zone_hour", "kind": "count", "epsilon": 1e6, "max_contributions": 1,
                        "release_every_windows": 4, "output": "per_window", "where": {"event_type": ["tap_in"]},
                        "group_by": [{"name": "zone", "field": "zone", "values": list(PER_WINDOW)}]}]})


@pytest.fixture(scope="module")
def released():
    """(config, merged rows, window -> events): 16 windows (4 hours), every card tapping in once, and tap-outs
    that the aggregate's ``where`` leaves out."""
    dp = _cfg()
    by_w = {}
    for i in range(16):
        by_w[DAY0_W + i] = [{"card": f"w{i}-{z}{j}", "zone": z, "event_type": t}
                            for z, n in PER_WINDOW.items() for j in range(n * (1 + i % 3))
                            for t in ("tap_in", "tap_out")]
    rows = []
    for p in range(2):
        agg = DPAggregator(dp, BudgetLedger(None, dp.epsilon_budget), seed=f"report-{p}".encode())
        for w, evs in by_w.items():
            mine = [e for e in evs if int(e["card"].rsplit(e["zone"], 1)[1]) % 2 == p]
            rows += [{**r, "partition": p, "row_id": f"{p}/{r['window']}/{r['group_key']}"}
                     for r in agg.process_window(w, mine) if r["type"] == "aggregate"]
    return dp, merge_rows(rows), by_w


def test_relative_errors_against_the_unbounded_truth_per_zone_hour(released):
    dp, merged, by_w = released
    exact = release_relative_errors(dp, merged, by_w, "tap_ins_zone_hour", thresholds=(100, 10))
    assert exact["cells"] == 8 and exact["rmse"] < 0.01               # 4 hours x 2 zones, noise ~ 0
    assert [t["cells"] for t in exact["by_threshold"]] == [4, 8]      # zone a (210-270 an hour) and both zones
    assert all(t["within_10pct"] == t["cells"] for t in exact["by_threshold"])
    shifted = [{**m, "value": m["value"] + 6} for m in merged]         # under 3% of zone a's hours, 13-17% of b's
    rel = release_relative_errors(dp, shifted, by_w, "tap_ins_zone_hour", thresholds=(100, 10))
    expected = sorted(6 / t for z in PER_WINDOW for t in _hourly(z))
    both = rel["by_threshold"][1]
    assert (both["within_10pct"], both["max_relative_error"]) == (4, pytest.approx(expected[-1], abs=1e-3))
    assert both["median_relative_error"] == pytest.approx((expected[3] + expected[4]) / 2, abs=1e-3)
    assert rel["rmse"] == pytest.approx(6, abs=0.01)
    assert aggregate_rmse(dp, shifted, by_w)["tap_ins_zone_hour"]["rmse"] == pytest.approx(6, abs=0.01)
    assert release_relative_errors(dp, merged, by_w, "no_such_aggregate") is None


def test_a_cell_the_release_missed_counts_as_wholly_wrong():
    rel = relative_errors({"x": 110.0}, {"x": 100, "y": 200, "z": 5}, threshold=100)
    assert (rel["cells"], rel["within_10pct"], rel["max_relative_error"]) == (2, 1, 1.0)


def test_membership_attack_layout_is_what_the_release_path_publishes():
    """The demo's membership attack (dp.report.membership_setting): with epsilon huge (noise ~ 0) a group's
    releases equal the sum of its members' contributions as the adversary computes them, cell by cell (a wrong
    layout would make the attack weaker than it is and the reported AUC falsely reassuring)."""
    from dataclasses import replace

    import numpy as np

    from stream_anon.config import load_config
    from stream_anon.datasets import load_events
    from stream_anon.dp.report import membership_setting
    from stream_anon.evaluate.stream_figures import windows_by_event_time

    cfg = load_config("configs/oyster-cards.toml")
    dp = replace(cfg.dp, aggregates=tuple(replace(s, epsilon=1e6) for s in cfg.dp.aggregates), epsilon_budget=5e6)
    by_w = dict(windows_by_event_time(load_events("oyster-cards", limit=4000), cfg))
    names, period, units, vec, release = membership_setting(dp, by_w, 500, np.random.default_rng(0))
    assert names == ["tap_ins_zone_hour", "taps_per_zone"] and period == "2009-11-09" and len(units) == 500
    members = np.arange(0, len(units), 5)
    y, t2 = release(members)
    expected = vec[members].sum(0)
    assert expected.sum() > 100 and np.abs(y - expected).max() < 0.5
    assert (t2 < 1e-6).all()                          # the stated noise variance of every cell


def test_a_sum_is_measured_against_the_true_sum():
    """A near-noise-free sum of fares per zone and hour: its RMSE against the truth is about 0, not the distance
    between a sum and a mean."""
    dp = parse_dp_config({
        "stream": {"name": "t", "privacy_unit": "card", "event_time": "event_time"},
        "anonymization": {"window_s": 900},
        "dp": {"unit": "individual", "period": "day", "timezone": "Europe/London", "epsilon_per_period": 1e6,
               "max_windows_per_period": 16},
        "aggregates": [{"name": "fares_zone_hour", "kind": "sum", "value": "fare", "lower": 0, "upper": 1000,
                        "epsilon": 1e6, "max_contributions": 1, "release_every_windows": 4, "output": "per_window",
                        "group_by": [{"name": "zone", "field": "zone", "values": list(PER_WINDOW)}]}]})
    by_w = {DAY0_W + i: [{"card": f"w{i}-{z}{j}", "zone": z, "fare": 100 + 10 * j}
                         for z, n in PER_WINDOW.items() for j in range(n)] for i in range(16)}
    agg = DPAggregator(dp, BudgetLedger(None, dp.epsilon_budget), seed=b"report-sum")
    rows = [{**r, "partition": 0, "row_id": f"{r['window']}/{r['group_key']}"}
            for w, evs in by_w.items() for r in agg.process_window(w, evs) if r["type"] == "aggregate"]
    got = aggregate_rmse(dp, merge_rows(rows), by_w)["fares_zone_hour"]
    assert got["cells"] == 8 and got["rmse"] < 0.5 and got["unit"] == "fare"
