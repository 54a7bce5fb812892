"""Issue 11 (bounded state): the period ledger keeps per-window entries for the last periods only; older periods
are kept as totals, the oldest as their largest charge. The budget and the reported spends must not change."""
from __future__ import annotations

import json
import random

import pytest

from stream_anon.dp import BudgetLedger, DPAggregator, parse_dp_config
from stream_anon.dp import ledger as ledger_mod

DAY0 = 1257724800            # 2009-11-09T00:00:00Z (London = UTC in November)
W0 = DAY0 // 900


def _cfg(**dp):
    line = {"name": "line", "field": "line", "values": ["a", "b"]}
    aggs = [{"name": "n", "kind": "count", "epsilon": 0.6, "max_contributions": 1, "group_by": [line]},
            {"name": "m", "kind": "count", "epsilon": 0.4, "max_contributions": 1, "group_by": [line],
             "release_every_windows": 4}]
    return parse_dp_config({
        "stream": {"name": "t", "privacy_unit": "card", "event_time": "event_time"},
        "anonymization": {"window_s": 900},
        "dp": {"unit": "individual", "period": "day", "timezone": "Europe/London", "epsilon_per_period": 1.0,
               "max_windows_per_period": 4, **dp},
        "aggregates": aggs})


def _run_days(days: int, ledger: BudgetLedger, windows_per_day: int = 96) -> tuple[DPAggregator, list[int]]:
    agg = DPAggregator(_cfg(), ledger, seed=b"s")
    sizes = []
    for d in range(days):
        for w in range(windows_per_day):
            agg.process_window(W0 + 96 * d + w, [{"card": f"c{w % 7}", "line": "a"}])
        sizes.append(len(json.dumps(ledger.state_core())))
    return agg, sizes


def _restored(ledger: BudgetLedger) -> BudgetLedger:
    """The ledger as a restarted worker reads it from its state."""
    again = BudgetLedger(None, ledger.epsilon_budget)
    again.load_state(json.loads(json.dumps(ledger.state_core())))
    return again


def test_ledger_size_is_bounded_and_its_totals_unchanged(monkeypatch):
    ledger, ref = BudgetLedger(None, 1.0), BudgetLedger(None, 1.0)
    _, sizes = _run_days(6, ledger)
    monkeypatch.setattr(ledger_mod, "KEEP_PERIODS", 10**6)           # the same stream without compaction
    _, ref_sizes = _run_days(6, ref)
    assert ref.spent_by_period() == pytest.approx({f"2009-11-{9 + d:02d}": 1.0 for d in range(6)})
    assert ledger.spent_by_period() == ref.spent_by_period() and ledger.spent == pytest.approx(ref.spent)
    # entries of two days at most (96 + 24 per day); the other days are totals of ~100 bytes
    assert len(ledger) == 2 * (96 + 24) and len(ref) == 6 * (96 + 24)
    assert sizes[5] - sizes[2] < 1000 < ref_sizes[5] - ref_sizes[2]
    restored = _restored(ledger)                                      # the worker's state (Kafka): the same
    assert restored.spent_by_period() == ledger.spent_by_period() and len(restored) == len(ledger)
    assert restored.state_core() == json.loads(json.dumps(ledger.state_core()))
    with pytest.raises(ValueError, match="already holds"):             # loaded once, on a new ledger
        restored.load_state(json.loads(json.dumps(ledger.state_core())))


def test_a_compacted_ledger_restored_charges_as_the_one_that_kept_every_entry():
    full, compacted = BudgetLedger(None, 1.0), BudgetLedger(None, 1.0)
    for led in (full, compacted):
        for d in range(3):
            led.reserve_many([("n", W0 + 96 * d + w, 0.2, None, f"2009-11-{9 + d:02d}", 0.6) for w in range(4)])
    assert compacted.compact("2009-11-12") == 8                  # days 9 and 10: before the last two periods
    restored = _restored(compacted)
    assert restored.spent_by_period() == pytest.approx(full.spent_by_period())
    assert restored.spent_by_period() == pytest.approx({"2009-11-09": 0.6, "2009-11-10": 0.6, "2009-11-11": 0.6})
    assert len(restored) == 4 and restored.spent == pytest.approx(full.spent)


def test_a_stop_in_a_compacted_period_is_kept_and_the_current_period_still_enforces_the_budget():
    led = BudgetLedger(None, 1.0)
    assert led.reserve_many([("n", W0, 0.7, None, "2009-11-09", 1.0)])[0].ok
    assert not led.reserve_many([("m", W0, 0.7, None, "2009-11-09", 1.0)])[0].ok        # over the budget
    assert led.reserve_many([("n", W0 + 96, 0.1, None, "2009-11-10", 1.0)])[0].ok
    assert led.compact("2009-11-12") == 1       # the periods kept: the last with releases (10th) and the current
    assert led.compact("2009-11-12") == 0
    assert led.is_stopped("m@2009-11-09") and led.exhausted_at("m@2009-11-09") == str(W0)
    assert led.spent_by_period() == pytest.approx({"2009-11-09": 0.7, "2009-11-10": 0.1}) and len(led) == 1
    w = W0 + 3 * 96
    assert led.reserve_many([("n", w, 0.7, None, "2009-11-12", 1.0)])[0].ok
    assert not led.reserve_many([("m", w, 0.7, None, "2009-11-12", 1.0)])[0].ok        # the cap still holds
    again = _restored(led)
    assert again.is_stopped("m@2009-11-09") and again.is_stopped("m@2009-11-12")
    assert not again.reserve_many([("m", w + 1, 0.1, None, "2009-11-12", 1.0)])[0].ok     # stopped for the day


def test_beyond_the_summaries_only_the_largest_charge_is_kept(monkeypatch):
    monkeypatch.setattr(ledger_mod, "SUMMARY_PERIODS", 3)
    led = BudgetLedger(None, 1.0)
    for d in range(8):
        led.reserve_many([("n", W0 + 96 * d, 0.9 if d == 1 else 0.3, None, f"2009-11-{9 + d:02d}", 1.0)])
        led.compact(f"2009-11-{9 + d:02d}")
    # the 15th and 16th with their entries, the 3 days before as totals, the 3 first in the archive
    assert sorted(led.spent_by_period()) == [f"2009-11-{d:02d}" for d in range(12, 17)] and len(led) == 2
    assert led.state_core()["archive"] == {"periods": 3, "first": "2009-11-09", "last": "2009-11-11",
                                           "max_spent": 0.9}
    assert led.spent == pytest.approx(0.9)                        # the archived day's charge still counts
    copy = _restored(led)
    assert copy.spent == pytest.approx(0.9) and copy.spent_by_period() == led.spent_by_period()


@pytest.mark.parametrize("seed", range(6))
def test_spent_through_in_one_pass_equals_window_by_window(seed):
    """The one-pass charge through each window (entries reserved in window order, re-releases and a cap change
    within a period included) equals the window-by-window sum, to the last bit."""
    rng = random.Random(seed)
    period_mode = seed % 2 == 0
    led = BudgetLedger(None, 1e6)
    windows = []
    for w in range(0, 60, rng.choice([1, 2, 3])):
        period = f"2026-01-{1 + w // 24:02d}"
        for a in ("a", "b", "c"):
            if rng.random() < 0.7:
                eps = rng.choice([0.1, 0.2, 0.3, 0.05])
                content = "x" if rng.random() < 0.8 else "y"
                req = (a, w, eps, content, period, rng.choice([0.3, 0.5])) if period_mode else (a, w, eps, content)
                led.reserve_many([req])
                if rng.random() < 0.1:          # the same window closed again with other content: a re-release
                    led.reserve_many([(a, w, eps, "z" + str(w), *req[4:])])
        windows.append(w)
    asked = rng.sample(windows, min(20, len(windows)))
    assert led.spent_through(asked) == ledger_mod._charged_window_by_window(led.charge_entries(), asked,
                                                                            led.period_mode)
    assert any(v > 0 for v in led.spent_through(asked).values())


def test_charge_entries_kept_by_the_ledger_equal_its_entries_through_releases_and_compaction():
    """The entry list the ledger keeps for spent_through (extended by each release, rebuilt after a compaction)
    equals the one a ledger restored from its state builds from scratch, at every window."""
    led = BudgetLedger(None, 1e6)
    for w in range(96):
        period = f"2026-01-{1 + w // 24:02d}"
        led.compact(period, keep=2)
        led.reserve_many([(a, w, 0.01, "x", period, 0.5) for a in ("a", "b")])
        if w % 7 == 0:                          # the window closed again with other content: a paid re-release
            led.reserve_many([("a", w, 0.01, "other", period, 0.5)])
        led.spent_through([w])
        assert led.charge_entries() == _restored(led).charge_entries()
    assert len(led.charge_entries()) < 2 * 96          # compacted periods left the list
