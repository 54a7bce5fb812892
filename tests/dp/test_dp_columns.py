"""The columnar DP path (:mod:`stream_anon.dp.cells` and ``Bounding.bound`` of :mod:`stream_anon.dp.contribution`)
against the per-event rules (:mod:`stream_anon.dp.per_event`), window after window with the W-windows cap carried
between windows: the same cell values, the same counts of what was left out, the same unit window counts -- on
messy events (missing units and stations, unknown and unhashable values, bools and numbers where times or fares
are expected) and with unit hashes forced to collide. The cap of the reference is the original one: a dict of
counts, unit by unit.
"""
from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path

import numpy as np
import pytest

from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.dp import BudgetLedger, DPAggregator, per_event
from stream_anon.dp.columns import WindowColumns
from stream_anon.dp.contribution import UnitGroups, WindowUnits, bound_contributions
from stream_anon.events import flatten

BREAKERS = [("journey_id", None), ("station", None), ("station", "Atlantis"), ("station", ["list"]),
            ("bus_route", {"x": 1}), ("full_fare_pence", "lots"), ("full_fare_pence", float("nan")),
            ("full_fare_pence", True), ("full_fare_pence", 99999), ("full_fare_pence", 12.5),
            ("daily_capping", None), ("daily_capping", 1), ("event_time", "2009-11-09T07:00:00"),
            ("event_time", 1257750000), ("event_time", True), ("event_time", 1), ("event_type", "teleport"),
            ("event_type", ["tap_in"]), ("product_category", None)]


def _config():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "oyster.toml")
    specs = tuple(dataclasses.replace(s, max_windows=2) for s in cfg.dp.aggregates)
    return dataclasses.replace(cfg.dp, aggregates=specs)


def _windows(seed: int) -> list[list[dict]]:
    """Six windows of 500 messy events; 300 journeys, so units come back in later windows and the cap bites."""
    rng = np.random.default_rng(seed)
    events = [flatten(e) for e in load_events("oyster", limit=3000)]
    for i, e in enumerate(events):
        e["journey_id"] = f"j{rng.integers(300)}"
        if rng.random() < 0.3:
            name, value = BREAKERS[rng.integers(len(BREAKERS))]
            e[name] = value
    return [events[i:i + 500] for i in range(0, 3000, 500)]


def _original_cap(agg: DPAggregator, counts: dict):
    """The window cap before the columnar path: a dict of hash -> windows, unit by unit in order."""
    def window_cap(name, units, commit, *_):
        table = counts.setdefault(name, {})
        admitted = {}
        for u in dict.fromkeys(units):
            h = int(agg.bounding.keys.hashes([u])[0])
            c = table.get(h, 0)
            admitted[u] = c < agg.bounding.caps[name]
            if admitted[u] and commit:
                table[h] = c + 1
        mask = [admitted[u] for u in units]
        return mask, len(mask) - sum(mask), sum(not ok for ok in admitted.values())
    return window_cap


def _window_units(agg):
    return WindowUnits(agg.state.unit_windows) if agg.clock is not None else None


def _columnar(agg, spec, flats):
    """The aggregator's own choice of path (columnar where it takes the window), its window counts written."""
    window_units = _window_units(agg)
    out = agg._bounded(spec, WindowColumns.from_flats(flats, agg.fields), window_units)
    window_units.flush()
    return out


def _per_event(agg, spec, flats):
    window_units = _window_units(agg)
    out = per_event.cell_values(spec, WindowColumns.from_flats(flats, agg.fields), agg.cells, agg.bounding,
                                window_units)
    window_units.flush()
    return out


def _unit_window_counts(agg, name):
    """(keys, counts) of the units that used one of aggregate ``name``'s windows in the period."""
    keys, rows = agg.state.unit_windows.snapshot()
    used = rows[name] > 0
    return keys[used], rows[name][used].astype(np.int64)


@pytest.mark.parametrize("collide", [False, True])
def test_columnar_cell_values_equal_the_per_event_ones_window_after_window(collide, monkeypatch):
    dp = _config()
    columnar = DPAggregator(dp, BudgetLedger(None, dp.epsilon_budget), seed=b"columns")
    reference = DPAggregator(dp, BudgetLedger(None, dp.epsilon_budget), seed=b"columns")
    if collide:       # 64 hash values for 300 units: distinct units of one window share a count
        weak = lambda units: np.array([zlib.crc32(str(u).encode()) % 64 for u in units], dtype=np.uint64)  # noqa
        monkeypatch.setattr(columnar.bounding.keys, "hashes", weak)
        monkeypatch.setattr(reference.bounding.keys, "hashes", weak)
    counts: dict = {}
    monkeypatch.setattr(reference.bounding, "window_cap", _original_cap(reference, counts))
    cut = 0
    for w, flats in enumerate(_windows(11 + collide)):
        for agg in (columnar, reference):
            agg.state.start_period("2009-11-09") if w == 0 else None
        for spec in dp.aggregates:
            x1, stats1 = _columnar(columnar, spec, flats)
            x2, stats2 = _per_event(reference, spec, flats)
            assert stats1 == stats2, (w, spec.name)
            assert x1.keys() == x2.keys() and all(np.array_equal(x1[c], x2[c]) for c in x1), (w, spec.name)
            keys, windows = _unit_window_counts(columnar, spec.name)
            want = counts.get(spec.name, {})
            assert dict(zip(keys.view(np.uint64).tolist(), windows.tolist())) == want, (w, spec.name)
            cut += stats1["windows_cut"]
    assert cut > 0, "the windows must exercise the cap"


def test_a_bool_and_a_number_in_an_hour_field_count_as_the_per_event_rule_counts_them():
    """The per-event rule maps equal values (True and 1) to the key of the first it meets among the filtered events;
    a columnar pass over the whole window would meet the other one first."""
    dp = _config()
    events = [{"journey_id": "a", "event_type": "tap_out", "event_time": True},
              {"journey_id": "b", "event_type": "tap_in", "event_time": 1},
              {"journey_id": "c", "event_type": "tap_in", "event_time": True}]
    spec = next(s for s in dp.aggregates if s.name == "tap_ins_per_hour")
    agg = DPAggregator(dp, BudgetLedger(None, dp.epsilon_budget), seed=b"columns")
    wc = WindowColumns.from_flats(events, agg.fields)
    assert agg.cells.of_window(spec, wc) is None, "the columnar path declines the window"
    x1, stats1 = _columnar(agg, spec, events)
    x2, stats2 = _per_event(agg, spec, events)
    assert stats1 == stats2 and np.array_equal(x1["count"], x2["count"])
    assert x2["count"][0] == 2          # both tap-ins in hour 0 (epoch second 1), as the per-event rule has it


def test_unit_groups_give_each_subsets_ranks_and_units_as_sorting_it_again_would():
    """``UnitGroups`` (one sort per window, shared by the aggregates) against ``bound_contributions`` and
    ``np.unique`` on each subset: random windows of few and of many units, random subsets."""
    rng = np.random.default_rng(41)
    for trial in range(300):
        n = int(rng.integers(0, 60))
        codes = rng.integers(0, int(rng.integers(1, 20)), size=n)
        groups = UnitGroups(codes)
        events = np.flatnonzero(rng.random(n) < rng.random())
        rank, units, first = groups.subset(events)
        sub = codes[events]
        for c in (1, 2, 3):
            assert np.array_equal(rank < c, bound_contributions(sub.tolist(), c)[0]), trial
        expect_units, expect_first = np.unique(sub, return_index=True)
        assert np.array_equal(units, expect_units) and np.array_equal(first, events[expect_first]), trial


def test_factorize_takes_two_values_as_one_exactly_when_a_dict_does():
    """Codes in order of first appearance, the first of equal values kept (1, 1.0 and True are one dict key),
    and every unhashable value one code after the hashable ones."""
    from stream_anon.dp.columns import UNHASHABLE, factorize

    values = ["a", 1, None, 1.0, True, "a", 2, False, 0, None]
    codes, distinct = factorize(values)
    assert codes.tolist() == [0, 1, 2, 1, 1, 0, 3, 4, 4, 2] and codes.dtype == np.int64
    assert distinct == ["a", 1, None, 2, False] and type(distinct[1]) is int and distinct[4] is False
    codes, distinct = factorize(["x", ["l"], "y", {"d": 1}, "x"])
    assert codes.tolist() == [0, 2, 1, 2, 0] and distinct == ["x", "y", UNHASHABLE]
    codes, distinct = factorize([])
    assert codes.tolist() == [] and distinct == []
