"""Issue 39 (gauges that mean what they say): a partition's budget outlook (stream_anon/dp/outlook.py), which the
worker's budget gauges export: the projection of a period's charge is what the ledger then charges, a design that
spends its whole budget every period projects exactly the budget, a paid re-release projects above it and the ledger
then stops an aggregate, and the last closed period's charge stays visible once the next period has started."""
from __future__ import annotations

import json

import pytest

from stream_anon.contract import config_path
from stream_anon.dp import BudgetLedger, DPAggregator, load_dp_config, parse_dp_config
from stream_anon.dp.outlook import AggregatorPosition, budget_outlook, position_of, releases_due

DAY0 = 1257724800            # 2009-11-09T00:00:00Z (London = UTC in November)
W0 = DAY0 // 900             # its first window; 96 windows a day
DAYS = ["2009-11-09", "2009-11-10", "2009-11-11"]
LINE = {"name": "line", "field": "line", "values": ["a", "b"]}


def _cfg(budget: float = 1.0):
    """Spends the whole budget every day: n (0.6) released every window, hourly (0.25) every 4 windows, daily
    (0.15) at the day's last window; each unit in at most W = 4 windows a day."""
    def count(name, eps, every):
        return {"name": name, "kind": "count", "epsilon": eps, "max_contributions": 1, "group_by": [LINE],
                "release_every_windows": every}
    return parse_dp_config({
        "stream": {"name": "t", "privacy_unit": "card", "event_time": "event_time"},
        "anonymization": {"window_s": 900},
        "dp": {"unit": "individual", "period": "day", "timezone": "Europe/London", "epsilon_per_period": budget,
               "max_windows_per_period": 4},
        "aggregates": [count("n", 0.6, 1), count("hourly", 0.25, 4), count("daily", 0.15, 96)]})


def _events(w: int) -> list[dict]:
    return [{"card": f"c{w % 5}", "line": "a"}, {"card": "x", "line": "b"}]


def _outlook(agg: DPAggregator):
    """As the worker's metrics endpoint reads it: from the aggregator's state core."""
    return budget_outlook(agg.config, agg.ledger, position_of(json.loads(json.dumps(agg.state.state_core()))))


def test_a_design_spending_the_whole_budget_every_day_projects_the_budget_and_shows_each_closed_day():
    agg = DPAggregator(_cfg(), BudgetLedger(None, 1.0), seed=b"s")
    seen = {d: [] for d in DAYS}
    for w in range(W0, W0 + 3 * 96):
        agg.process_window(w, _events(w))
        o = _outlook(agg)
        seen[o.period].append(o)
        assert o.elapsed == ((w - W0) % 96 + 1, 96)
        assert o.spent <= o.projected + 1e-12
        assert o.projected == pytest.approx(1.0, abs=1e-12)       # on schedule all day, from the first window
    for d, day in enumerate(DAYS):
        spent = agg.ledger.period_spent(day)
        assert spent == pytest.approx(1.0, abs=1e-12)             # what was projected all day is what it charged
        assert seen[day][0].spent < 0.5 and seen[day][-2].spent == pytest.approx(0.85)   # daily: at the end
        assert seen[day][-1].closed == day and seen[day][-1].closed_spent == spent
        later = [o for o in seen[day][:-1]]
        assert {o.closed for o in later} == ({None} if d == 0 else {DAYS[d - 1]})
        if d:
            assert {o.closed_spent for o in later} == {agg.ledger.period_spent(DAYS[d - 1])}
    last = seen[DAYS[2]][-1]
    assert last.closed_charges == pytest.approx({"n": 0.6, "hourly": 0.25, "daily": 0.15})
    assert sum(last.closed_charges.values()) == pytest.approx(last.closed_spent)


def test_a_paid_re_release_projects_above_the_budget_and_the_ledger_then_stops_an_aggregate():
    agg = DPAggregator(_cfg(), BudgetLedger(None, 1.0), seed=b"s")
    for w in range(W0, W0 + 10):
        agg.process_window(w, _events(w))
    assert _outlook(agg).projected == pytest.approx(1.0)
    # window 2 of n released again with other content (a restart after an unrecorded flush): paid in full, uncapped
    again = agg.ledger.reserve_many([("n", W0 + 2, 0.15, "other content", DAYS[0], 0.6)])[0]
    assert again.ok and again.window == f"{W0 + 2}~1"
    o = _outlook(agg)
    assert o.projected == pytest.approx(1.15) and o.spent == pytest.approx(0.6 + 0.15 + 0.25)
    assert o.charges["n"] == pytest.approx(0.75)
    stops = []
    for w in range(W0 + 10, W0 + 96):
        stops += [r for r in agg.process_window(w, _events(w)) if r["type"] == "budget_exhausted"]
        assert _outlook(agg).projected == pytest.approx(1.15)       # before the stop and after it
    assert [r["aggregate"] for r in stops] == ["daily"] and stops[0]["window"] == str(W0 + 95)
    assert agg.ledger.period_spent(DAYS[0]) == pytest.approx(1.0)   # the ledger kept the budget
    agg.process_window(W0 + 96, _events(W0 + 96))
    o = _outlook(agg)                                               # the next day is on schedule again
    assert o.period == DAYS[1] and o.projected == pytest.approx(1.0)
    assert o.closed == DAYS[0] and o.closed_spent == pytest.approx(1.0)
    assert o.closed_charges == pytest.approx({"n": 0.75, "hourly": 0.25})


def test_a_paused_aggregate_is_not_projected_and_a_lowered_budget_is_exceeded_by_the_projection():
    agg = DPAggregator(_cfg(), BudgetLedger(None, 1.0), seed=b"s")
    for w in range(W0, W0 + 8):
        agg.process_window(w, _events(w))
    position = position_of(agg.state.state_core())
    paused = AggregatorPosition(position.period, position.last_window, {"pause": ["daily"], "keep": {}})
    assert budget_outlook(agg.config, agg.ledger, paused).projected == pytest.approx(0.85)
    agg.ledger.epsilon_budget = 0.5                   # a lowering accepted at once (stream_anon.dp.transition)
    assert budget_outlook(agg.config, agg.ledger, position).projected == pytest.approx(1.0)      # above 0.5:
    stopped = [r["aggregate"] for r in agg.process_window(W0 + 8, _events(W0 + 8)) if r["type"] != "aggregate"]
    assert stopped == ["n"]                           # the ledger refuses the period's next release


def test_without_a_period_only_the_stream_s_charges():
    cfg = parse_dp_config({"stream": {"privacy_unit": "card"}, "dp": {"epsilon_budget": 3.0},
                           "aggregates": [{"name": "n", "kind": "count", "epsilon": 0.5, "max_contributions": 1}]})
    agg = DPAggregator(cfg, BudgetLedger(None, 3.0), seed=b"s")
    for w in range(3):
        agg.process_window(w, [{"card": "x"}])
    o = _outlook(agg)
    assert (o.period, o.charges, o.spent) == (None, {"n": 1.5}, 1.5)
    assert o.elapsed is None and o.projected is None and o.closed is None


def test_before_the_first_window_nothing_is_charged():
    o = budget_outlook(_cfg(), BudgetLedger(None, 1.0), position_of(None))
    assert (o.period, o.charges, o.spent, o.projected, o.closed) == (None, {}, 0.0, None, None)


@pytest.mark.parametrize("every,n", [(1, 96), (4, 96), (96, 96), (4, 92), (4, 100), (7, 96), (96, 100)])
def test_releases_due_counts_the_schedule_of_the_aggregator(every, n):
    first = 1000
    due = [w for w in range(first, first + n) if (w - first + 1) % every == 0 or w == first + n - 1]
    for start in range(first, first + n + 2):
        assert releases_due(every, first, n, start) == sum(1 for w in due if w >= start), start


@pytest.mark.parametrize("name", ["oyster", "oyster-cards"])
def test_the_bundled_designs_project_their_budget_every_window_and_close_each_day_at_it(name):
    """Both bundled DP configs spend the whole budget every day: the projection is the budget from each day's first
    window, while the current day's charge shows less before its last window (oyster-cards: 0.7)."""
    cfg = load_dp_config(config_path(name))
    agg = DPAggregator(cfg, BudgetLedger(None, cfg.epsilon_budget), seed=b"s")
    before_last = {}
    for w in range(W0, W0 + 2 * 96 + 1):
        agg.process_window(w, [])
        o = _outlook(agg)
        assert o.projected == pytest.approx(cfg.epsilon_budget, abs=1e-9), (w, o)
        if o.elapsed[0] < o.elapsed[1]:
            before_last[o.period] = max(before_last.get(o.period, 0.0), o.spent)
    assert o.closed == DAYS[1] and o.closed_spent == pytest.approx(cfg.epsilon_budget)
    assert before_last[DAYS[0]] == pytest.approx(0.7 if name == "oyster-cards" else 1.0)
