"""Issue 14: unit of privacy and period, user-level bounding across windows, per-period ledger, release schedule;
issue 10 item 9: floating-point-safe noise. Fixed seeds throughout."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from stream_anon.checkpoint import full_state
from stream_anon.dp import BudgetLedger, DPAggregator, parse_dp_config
from stream_anon.dp.continual import BinaryTreeCounter, PerWindowCounter, noise_variance
from stream_anon.dp.diffprivlib_adapter import make_mechanism, snapping_grid
from stream_anon.errors import ConfigError

DAY0 = 1257724800            # 2009-11-09T00:00:00Z (London = UTC in November)
W0 = DAY0 // 900             # first window of that day


def _raw(aggs, **dp):
    return {"stream": {"name": "t", "privacy_unit": "card", "event_time": "event_time"},
            "anonymization": {"window_s": 900},
            "dp": {"unit": "individual", "period": "day", "timezone": "Europe/London", "epsilon_per_period": 1.0,
                   "max_windows_per_period": 4, **dp},
            "aggregates": aggs}


LINE = {"name": "line", "field": "line", "values": ["a", "b"]}


def _count(name="n", epsilon=0.5, **kw):
    return {"name": name, "kind": "count", "epsilon": epsilon, "max_contributions": 1, "group_by": [LINE], **kw}


def test_unit_capped_to_w_windows_per_period_and_counts_reset_next_day():
    cfg = parse_dp_config(_raw([_count(epsilon=1e6)], epsilon_per_period=1e6))
    agg = DPAggregator(cfg, BudgetLedger(None, cfg.epsilon_budget), seed=b"s")
    vals, cut = [], []
    for i in range(6):                                  # card x in 6 windows of day 0, card y in 1
        evs = [{"card": "x", "line": "a"}] + ([{"card": "y", "line": "a"}] if i == 5 else [])
        rows = agg.process_window(W0 + i, evs)
        vals.append(next(r["value"] for r in rows if r["group_key"] == "a" and r["output"] == "per_window"))
        cut.append(agg.window_metrics["windows_cut"]["n"])
    assert vals == [1, 1, 1, 1, 0, 1] and cut == [0, 0, 0, 0, 1, 1]      # epsilon huge: noise ~ 0
    assert agg.metrics["units_window_capped"]["n"] == 2
    core, tables = full_state(agg)
    assert '"x"' not in json.dumps(core) and tables["unit_windows"][0].dtype == np.int64    # keyed hashes only
    again = DPAggregator(cfg, agg.ledger, seed=b"s")
    again.load_state(json.loads(json.dumps(core)), tables)
    assert again.state.unit_windows == agg.state.unit_windows and len(again.state.unit_windows) == 2
    rows = again.process_window(W0 + 96, [{"card": "x", "line": "a"}])   # next day: x counts again
    assert next(r["value"] for r in rows if r["group_key"] == "a" and r["window"] == W0 + 96) == 1
    assert again.state.period == "2009-11-10"
    assert len(again.state.unit_windows) == 1


def test_ledger_charges_epsilon_per_period_whatever_the_number_of_windows():
    cfg = parse_dp_config(_raw([_count("n", 0.6), _count("m", 0.4, release_every_windows=4)]))
    agg = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=b"s")
    for w in range(96 * 2):                             # two whole days of windows
        agg.process_window(W0 + w, [{"card": f"c{w % 7}", "line": "a"}])
    ledger = BudgetLedger(None, 1.0)                    # restored from the state
    ledger.load_state(json.loads(json.dumps(agg.ledger.state_core())))
    per = ledger.spent_by_period()
    assert per == pytest.approx({"2009-11-09": 1.0, "2009-11-10": 1.0})
    assert ledger.spent == pytest.approx(1.0) and agg.metrics["budget_exhausted_events"] == 0
    # legacy accounting of the same releases: 0.6/4 * 96 + 0.4 * 24 per day, far above the budget
    assert len([k for k in ledger._entries if k[0] == "n"]) == 192 and len([k for k in ledger._entries
                                                                           if k[0] == "m"]) == 48
    # a paid re-release is charged outside the cap: the period is then over budget and stops
    out = ledger.reserve_many([("n", W0 + 5, 0.15, "other-content", "2009-11-09", 0.6)])[0]
    assert not out.ok and ledger.is_stopped("n@2009-11-09") and not ledger.is_stopped("n@2009-11-10")


def test_release_schedule_is_aligned_to_the_period_and_sums_the_windows():
    cfg = parse_dp_config(_raw([_count("h", 1.0, release_every_windows=4, output="both")],
                               max_windows_per_period=96, epsilon_per_period=1e6))
    cfg = parse_dp_config(_raw([_count("h", 1e6, release_every_windows=4, output="both")],
                               max_windows_per_period=96, epsilon_per_period=1e6))
    agg = DPAggregator(cfg, BudgetLedger(None, 1e6), seed=b"s")
    released = {}
    for i in range(2, 12):                              # starts mid-hour: window 2 of the day
        rows = agg.process_window(W0 + i, [{"card": f"c{i}", "line": "b"}] * 1)
        for r in rows:
            if r["group_key"] == "b":
                released[(r["window"], r["output"])] = (r["value"], r["span_start_window"], r["windows_in_release"])
    assert sorted({w for w, _ in released}) == [W0 + 3, W0 + 7, W0 + 11]
    assert released[(W0 + 3, "per_window")] == (2, W0, 4) and released[(W0 + 7, "per_window")] == (4, W0 + 4, 4)
    assert released[(W0 + 11, "running")][0] == 10                         # running within the day


def test_noise_is_calibrated_to_w_and_c_per_period():
    cfg = parse_dp_config(_raw([_count("h", 0.5, release_every_windows=4, max_contributions=2)]))
    agg = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=b"s")
    rows = []
    for i in range(4):
        rows += agg.process_window(W0 + i, [])
    r = rows[0]
    # W = 4 windows x C = 2 events per period: L1 sensitivity 8 per period; one release may hold all 4 windows
    assert r["sensitivity"] == 8 and r["epsilon"] == pytest.approx(0.5) and r["noise_scale"] == pytest.approx(16)
    assert r["epsilon_period"] == 0.5 and r["period"] == "2009-11-09" and r["unit"] == "individual"
    cfg1 = parse_dp_config(_raw([_count("h", 0.5)]))                        # release every window
    r1 = DPAggregator(cfg1, BudgetLedger(None, 1.0), seed=b"s").process_window(W0, [])[0]
    assert r1["sensitivity"] == 1 and r1["epsilon"] == pytest.approx(0.125)


def test_period_config_errors_name_the_key():
    cases = [({"period": "month"}, r"^dp\.period"), ({"timezone": "Mars/Base"}, r"^dp\.timezone"),
             ({"unit": "household"}, r"^dp\.unit"), ({"max_windows_per_period": 97}, r"^dp\.max_windows_per_period"),
             ({"epsilon_per_period": 0}, r"^dp\.epsilon_per_period"), ({"epsilon_budget": 3}, r"^dp\.epsilon_budget"),
             ({"bogus": 1}, r"^dp\.bogus")]
    for dp, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            parse_dp_config(_raw([_count()], **dp))
    with pytest.raises(ConfigError, match=r"^dp\.epsilon_per_period: the aggregates' epsilons add up to 1\.2"):
        parse_dp_config(_raw([_count("a", 0.6), _count("b", 0.6)]))
    with pytest.raises(ConfigError, match=r"^aggregates\.n\.horizon_windows: set by dp\.period"):
        parse_dp_config(_raw([_count(horizon_windows=96)]))
    with pytest.raises(ConfigError, match=r"^aggregates\.n\.release_every_windows"):
        parse_dp_config(_raw([_count(release_every_windows=0)]))
    with pytest.raises(ConfigError, match=r"^anonymization\.window_s"):
        parse_dp_config({**_raw([_count()]), "anonymization": {}})
    with pytest.raises(ConfigError, match=r"^aggregates\.s\.resolution"):
        parse_dp_config(_raw([{"name": "s", "kind": "sum", "value": "v", "lower": 0, "upper": 10, "resolution": 3,
                               "epsilon": 0.5, "max_contributions": 1}]))


def _with_window(window_s, **dp):
    return {**_raw([_count()], max_windows_per_period=1, **dp), "anonymization": {"window_s": window_s}}


def _periods_of_local_month(clock, tz, year, month):
    """The periods (labels) the windows holding the local calendar month ``year-month`` of ``tz`` are charged to."""
    from datetime import datetime
    from zoneinfo import ZoneInfo
    zone = ZoneInfo(tz)
    start = datetime(year, month, 1, tzinfo=zone).timestamp()
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=zone).timestamp()
    first, last = int(start // clock.window_s), math.ceil(end / clock.window_s)
    return sorted({clock.period_of(w)[0] for w in range(first, last)})


def test_periods_start_on_window_boundaries_in_their_time_zone():
    """Windows are aligned to the UTC epoch and charged to the period holding their start. New York's days start at
    05:00 or 04:00 UTC, inside a window of 6 h: the window 00:00-06:00 UTC (19:00-01:00 local) would charge the first
    hour of 1 January to 31 December, 32 periods for a 31-day month. Refused, naming the keys; 1 h windows, and 6 h
    windows with UTC days, keep every day whole."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from stream_anon.dp.periods import PeriodClock
    with pytest.raises(ConfigError, match=r'^dp\.timezone: days \(dp\.period = "day"\) in America/New_York '
                                          r"\(UTC-05:00, UTC-04:00\) do not start on window boundaries "
                                          r"\(anonymization\.window_s = 21600 s.*19:00-01:00 local.*divides 3600 s"):
        parse_dp_config(_with_window(21600, timezone="America/New_York"))
    with pytest.raises(ConfigError, match=r"^dp\.timezone: days .* Europe/London .*23:00-01:00 local \(UTC\+01:00\)"):
        parse_dp_config(_with_window(7200))                 # aligned in winter, not in summer time
    with pytest.raises(ConfigError, match=r"^dp\.timezone: hours .* Asia/Kolkata .*divides 1800 s"):
        parse_dp_config(_with_window(3600, period="hour", timezone="Asia/Kolkata"))
    with pytest.raises(ConfigError, match=r"^dp\.timezone: weeks .*Mon 00:00-Tue 00:00 UTC is Sun 19:00-Mon 19:00"):
        parse_dp_config(_with_window(86400, period="week", timezone="America/New_York"))
    assert len(_periods_of_local_month(PeriodClock("day", "America/New_York", 21600), "America/New_York", 2024, 1)) \
        == 32
    for window_s, tz in ((3600, "America/New_York"), (21600, "UTC"), (1800, "Asia/Kolkata")):
        clock = parse_dp_config(_with_window(window_s, timezone=tz)).clock
        periods = _periods_of_local_month(clock, tz, 2024, 1)
        assert len(periods) == 31 and periods[0] == "2024-01-01", (window_s, tz)
        for day in (0, 70, 300):                            # winter and summer: a day's first window starts it
            label, first, n = clock.period_of(int(1704067200 // window_s) + day * int(86400 // window_s))
            local = datetime.fromtimestamp(first * window_s, ZoneInfo(tz))
            assert (local.strftime("%Y-%m-%d"), local.hour, local.minute) == (label, 0, 0), (window_s, tz, day)
            assert clock.period_of(first - 1)[0] != label and clock.period_of(first + n - 1)[0] == label


def test_bundled_configs_state_unit_period_and_fit_one_per_period():
    from stream_anon.config import load_config
    for path, unit in (("configs/oyster-cards.toml", "individual"), ("configs/oyster.toml", "journey")):
        dp = load_config(path).dp
        assert dp.unit == unit and dp.period == "day" and dp.timezone == "Europe/London"
        assert dp.epsilon_budget <= 1.0 and sum(s.epsilon for s in dp.aggregates) <= dp.epsilon_budget + 1e-12


# -- floating-point-safe noise (issue 10 item 9) ---------------------------------------------------------------
def test_every_release_path_uses_integer_or_snapping_noise():
    cfg = parse_dp_config(_raw([
        _count("c", 0.2),
        {"name": "s", "kind": "sum", "value": "fare", "lower": 0, "upper": 500, "epsilon": 0.2,
         "max_contributions": 1, "output": "both", "group_by": [LINE]},
        {"name": "l", "kind": "sum", "value": "fare", "lower": 0, "upper": 500, "epsilon": 0.2, "noise": "laplace",
         "max_contributions": 1, "group_by": [LINE]},
        {"name": "m", "kind": "mean", "value": "fare", "lower": 0, "upper": 500, "epsilon": 0.2,
         "max_contributions": 1, "group_by": [LINE]}]))
    rows = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=b"s").process_window(
        W0, [{"card": "x", "line": "a", "fare": 123.4}])
    mech = {(r["aggregate"], r["output"]): r["mechanism"] for r in rows}
    assert all(m.endswith("/geometric") for k, m in mech.items() if k[0] != "l")
    assert mech[("l", "per_window")] == "per_window/snapping"
    for r in rows:
        if r["aggregate"] in ("c", "s"):
            assert float(r["value"]).is_integer()       # integer noise on integer (resolution 1) values
    lam = snapping_grid(0.2 / 4, 500)                   # W = 4: per-window epsilon 0.05, sensitivity 500
    for r in rows:
        if r["aggregate"] == "l":                        # Snapping: every output on its grid (Mironov 2012)
            assert (r["value"] / lam) == pytest.approx(round(r["value"] / lam), abs=1e-9)


def test_integer_noise_on_scaled_sums_matches_two_sided_geometric():
    c = PerWindowCounter(20000, epsilon=0.5, sensitivity=2.5, noise="geometric", resolution=0.5)
    out = c.update(np.full(20000, 10.0), np.random.RandomState(21)) - 10.0
    steps = out / 0.5
    assert np.all(steps == np.round(steps))                                # on the resolution grid
    q = math.exp(-0.5 / 5)                                                 # 5 steps of sensitivity
    ks = np.arange(-30, 31)
    pmf = (1 - q) / (1 + q) * q ** np.abs(ks)
    obs = np.array([(steps == k).sum() for k in ks] + [(np.abs(steps) > 30).sum()])
    p = stats.chisquare(obs, np.append(pmf, 1 - pmf.sum()) * len(steps)).pvalue
    print(f"chi-square p-value, geometric on resolution 0.5: {p:.3f}")
    assert p > 0.01
    assert abs(out.var() / c.window_variance() - 1) < 0.05


def test_snapping_noise_distribution_and_stated_variance():
    c = BinaryTreeCounter(20000, epsilon=1.0, sensitivity=3.0, noise="snapping", horizon=8)
    out = c.update(np.full(20000, 7.0), np.random.RandomState(22)) - 7.0   # one node, epsilon 1/4
    b = c.node_scale
    lam = snapping_grid(c.node_epsilon, 3.0)
    # Snapping = Laplace(b) then rounding to the grid Lambda: compare with a Laplace smoothed by the rounding
    ref = stats.laplace(scale=b).rvs(200000, random_state=23)
    ref = np.round((ref + 7.0) / lam) * lam - 7.0
    p = stats.ks_2samp(out, ref).pvalue
    print(f"KS two-sample p-value snapping vs rounded Laplace({b}): {p:.3f}; grid {lam}")
    assert p > 0.01
    assert abs(out.var() / noise_variance("snapping", c.node_epsilon, 3.0) - 1) < 0.05
    mech = make_mechanism("snapping", 0.5, 1.0, np.random.RandomState(0))
    assert mech.effective_epsilon() == pytest.approx(0.5, rel=1e-5)          # the bound costs nothing measurable


def test_event_unit_needs_no_unit_field_and_counts_every_event():
    raw = _raw([_count("n", 1e6)], unit="event", epsilon_per_period=1e6)
    del raw["dp"]["max_windows_per_period"]
    cfg = parse_dp_config(raw)
    assert cfg.max_windows_per_period == 1 and cfg.unit == "event"
    agg = DPAggregator(cfg, BudgetLedger(None, 1e6), seed=b"s")
    rows = agg.process_window(W0, [{"line": "a"}] * 3 + [{"card": "x", "line": "a"}] * 2)
    assert next(r["value"] for r in rows if r["group_key"] == "a") == 5      # no unit field needed, none cut
    with pytest.raises(ConfigError, match=r"^aggregates\.n\.max_contributions"):
        parse_dp_config({**raw, "aggregates": [_count("n", 0.5, max_contributions=2)]})


def test_restart_mid_release_resumes_partial_sums_and_reproduces_rows():
    cfg = parse_dp_config(_raw([_count("h", 0.5, release_every_windows=4, output="both")]))
    evs = {i: [{"card": f"c{j}", "line": "ab"[j % 2]} for j in range(i + 3)] for i in range(8)}
    full = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=b"s")
    want = [r for i in range(8) for r in full.process_window(W0 + i, evs[i])]
    part = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=b"s")
    got = [r for i in range(2) for r in part.process_window(W0 + i, evs[i])]
    core, tables = full_state(part)                                    # checkpoint in the middle of an hour
    core, ledger_core = json.loads(json.dumps(core)), json.loads(json.dumps(part.ledger.state_core()))
    assert core["pending"]["h"]["count"] == [4.0, 3.0]                 # lines a, b over windows 0-1
    ledger = BudgetLedger(None, 1.0)
    ledger.load_state(ledger_core)
    part = DPAggregator(cfg, ledger, seed=b"s")
    part.load_state(core, tables)
    got += [r for i in range(2, 8) for r in part.process_window(W0 + i, evs[i])]
    assert [(r["window"], r["output"], r["group_key"], r["value"]) for r in got] == \
        [(r["window"], r["output"], r["group_key"], r["value"]) for r in want]
    assert ledger.spent == pytest.approx(0.5)                          # W = 4: one release is worst case


def test_report_running_errors_restart_every_period_and_match_the_stated_noise():
    from stream_anon.dp.report import running_count_errors
    cfg = parse_dp_config(_raw([_count("h", 1.0, release_every_windows=4, output="running", mechanism="binary_tree")],
                               max_windows_per_period=2))
    spec = cfg.aggregates[0]
    rng = np.random.default_rng(31)
    rows, truth = [], {}
    for p in range(3):
        agg = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=f"s{p}".encode())
        for i in range(96 * 2):                                            # two days
            lines = rng.choice(["a", "b"], size=rng.poisson(20))
            evs = [{"card": f"{p}-{i}-{j}", "line": str(l)} for j, l in enumerate(lines)]
            truth[(p, W0 + i)] = np.array([(lines == "a").sum(), (lines == "b").sum()], dtype=float)
            rows += [{**r, "partition": p} for r in agg.process_window(W0 + i, evs)]
    out = running_count_errors(rows, truth, spec)
    print(out)
    assert out["windows"] == 48 and out["mechanism"] == ["binary_tree/geometric"]
    assert abs(out["continual_count_rmse"] / out["continual_count_rmse_theory"] - 1) < 0.25


def test_a_state_of_another_configuration_keeps_what_still_holds(caplog):
    """Restored under a changed configuration: each unit's window counts stay with its aggregate (by name), an
    aggregate whose counters were calibrated to another epsilon starts its counters and its partial release again
    (noise of the old calibration would not match what the ledger now charges), a new aggregate starts empty. A
    period's table is refused where no period is configured."""
    old = parse_dp_config(_raw([_count("n", 0.5, release_every_windows=4, output="both")]))
    new = parse_dp_config(_raw([_count("n", 0.4, release_every_windows=4, output="both"), _count("m", 0.3)]))
    agg = DPAggregator(old, BudgetLedger(None, 1.0), seed=b"s")
    for i in range(5):                  # a release at the 4th window, the 5th pending
        agg.process_window(W0 + i, [{"card": f"c{j}", "line": "a"} for j in range(5)])
    core, tables = full_state(agg)
    assert core["pending"]["n"]["count"] == [0.0, 0.0]   # W = 4: the 5th window of each unit is cut
    same = DPAggregator(old, BudgetLedger(None, 1.0), seed=b"s")
    same.load_state(json.loads(json.dumps(core)), tables)
    assert same.state.counters["n"]["count"]["window"].t == 1 and "n" in same.state.pending
    changed = DPAggregator(new, BudgetLedger(None, 1.0), seed=b"s")
    with caplog.at_level("WARNING", logger="stream_anon.dp.state"):
        changed.load_state(json.loads(json.dumps(core)), tables)
    assert "aggregate n" in caplog.text
    assert changed.state.counters["n"]["count"]["window"].t == 0 and "n" not in changed.state.pending
    keys, rows = changed.state.unit_windows.snapshot()
    assert np.array_equal(keys, tables["unit_windows"][0]) and rows["n"].tolist() == [4] * 5
    assert rows["m"].tolist() == [0] * 5 and changed.metrics["contributions_cut"]["m"] == 0
    rows = changed.process_window(W0 + 7, [{"card": "c0", "line": "a"}])
    assert {r["aggregate"] for r in rows} == {"n", "m"}
    legacy = parse_dp_config({**_raw([_count("n", 0.5)]), "dp": {"epsilon_budget": 1.0}})
    with pytest.raises(ValueError, match="no period is configured"):
        DPAggregator(legacy, BudgetLedger(None, 1.0), seed=b"s").load_state(json.loads(json.dumps(core)), tables)
