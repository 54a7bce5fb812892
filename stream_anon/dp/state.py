"""What an aggregator keeps from window to window, as one :class:`~stream_anon.checkpoint.Checkpointable`.

The **core** (bounded by the configuration: aggregates, cells, tree levels; never by the units seen) holds the last
window released, the metrics, the running counters of every aggregate (:mod:`~stream_anon.dp.continual`) and, in
period mode, the current period, the bounded sums accumulated towards each aggregate's next release and the unit
key scheme. The one **keyed table**, ``unit_windows`` (period mode), holds each unit's windows used in the period
per aggregate (:func:`~stream_anon.dp.contribution.unit_window_table`), keyed by the unit's keyed 64-bit id or
hash: DP state (without it a restart would let every unit contribute ``W`` more windows) that never holds a raw
identifier. A new period clears it (the deletions are changes a state record carries).

Loading is strict where the privacy guarantee depends on it: a table keyed under another unit key scheme is
refused (its units would be looked up under keys they never had and start again at 0 windows), and an aggregate
whose saved counters were calibrated to other parameters (its configuration changed) starts its counters and its
partial release again rather than adding noise of the old calibration to releases the ledger charges at the new one.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from stream_anon.checkpoint import load_tables
from stream_anon.dp.contribution import unit_window_table
from stream_anon.dp.release import Plan, new_counters
from stream_anon.keyed_table import KeyedTable

log = logging.getLogger(__name__)

UNIT_WINDOWS = "unit_windows"


class AggregatorState:
    """The state of a :class:`~stream_anon.dp.aggregator.DPAggregator` (module docstring). ``unit_scheme``: the
    :class:`~stream_anon.dp.contribution.UnitKeys` scheme of the unit window table's keys (None: every event is
    its own unit)."""

    def __init__(self, specs, plans: dict[str, Plan], period_mode: bool, unit_scheme: str | None):
        self.specs, self.plans = tuple(specs), plans
        self.period_mode, self.unit_scheme = period_mode, unit_scheme
        self.last_window: int | None = None
        names = [s.name for s in self.specs]
        self.metrics: dict[str, Any] = {        # JSON: counts, and per aggregate (name -> count) counts
            "windows": 0, "events_in": 0, "aggregates_published": 0, "budget_exhausted_events": 0,
            "before_start": 0, "after_release": 0, "contributions_cut": dict.fromkeys(names, 0),
            "out_of_domain": dict.fromkeys(names, 0), "missing": dict.fromkeys(names, 0)}
        if period_mode:
            self.metrics["windows_cut"] = dict.fromkeys(names, 0)
            self.metrics["units_window_capped"] = dict.fromkeys(names, 0)
        self.period: str | None = None
        self.pending: dict[str, dict[str, np.ndarray]] = {}      # aggregate -> component -> bounded sums
        self.counters = {s.name: new_counters(s, plans[s.name]) for s in self.specs}
        self.unit_windows: KeyedTable = unit_window_table(self.specs)
        # an accepted change of the DP settings (stream_anon.dp.transition): what stays in force until the period
        # ends (None: the configured settings), and the changes each aggregate's next release states
        self.carry: dict | None = None
        self.announce: dict[str, list[str]] = {}

    def start_period(self, label: str) -> None:
        """A new period: window counts, running counters and partial releases start again (the budget is per
        period)."""
        self.period = label
        self.unit_windows.clear()     # cleared, not replaced: the deletions are changes to report
        self.counters = {s.name: new_counters(s, self.plans[s.name]) for s in self.specs}
        self.pending = {}

    # -- Checkpointable -----------------------------------------------------------------------------------------
    def state_core(self) -> dict:
        out: dict[str, Any] = {"last_window": self.last_window, "metrics": self.metrics,
                               "counters": {a: {comp: {k: c.state_core() for k, c in cs.items()}
                                                 for comp, cs in comps.items()}
                                            for a, comps in self.counters.items()}}
        if self.period_mode:
            out["period"] = self.period
            out["pending"] = {a: {c: v.tolist() for c, v in x.items()} for a, x in self.pending.items()}
            if self.unit_scheme is not None:
                out["unit_keys"] = self.unit_scheme
        if self.carry is not None:
            out["carry"] = self.carry
        if self.announce:
            out["announce"] = self.announce
        return out

    def state_tables(self) -> dict[str, KeyedTable]:
        return {UNIT_WINDOWS: self.unit_windows} if self.period_mode else {}

    def load_state(self, core: dict, tables) -> None:
        """On a state just built from the configuration. Aggregates no longer configured are dropped; aggregates
        not in the state start empty."""
        tables = dict(tables)
        saved = tables.pop(UNIT_WINDOWS, None)
        load_tables({}, tables)                      # any other table is another layout's: refused
        if saved is not None and not self.period_mode:
            raise ValueError(f"state holds a {UNIT_WINDOWS!r} table (period mode) but no period is configured")
        self.last_window = core["last_window"]
        self.carry = core.get("carry")
        self.announce = {a: list(c) for a, c in core.get("announce", {}).items()}
        fresh, self.metrics = self.metrics, core["metrics"]
        for key, value in fresh.items():             # counts of aggregates (or a mode) new to this state: 0
            if isinstance(value, dict):
                for name, zero in value.items():
                    self.metrics.setdefault(key, {}).setdefault(name, zero)
            else:
                self.metrics.setdefault(key, value)
        if self.period_mode and core.get("period") is not None:
            self.period = core["period"]
            self.pending = {a: {c: np.asarray(v, dtype=float) for c, v in x.items()}
                            for a, x in core.get("pending", {}).items() if a in self.counters}
            self._load_unit_windows(saved, core.get("unit_keys"))
        for a, comps in core["counters"].items():
            if a in self.counters:
                self._load_counters(a, comps)

    def _load_unit_windows(self, saved, scheme: str | None) -> None:
        """The saved table's columns of the aggregates still configured (by name); units left with no count go."""
        if saved is None:
            return
        keys, rows = np.asarray(saved[0], dtype=np.int64), saved[1]
        table = np.zeros(len(keys), dtype=self.unit_windows.dtype)
        used = np.zeros(len(keys), dtype=bool)
        names = table.dtype.names
        assert names is not None                     # a structured dtype (unit_window_table)
        for name in names:
            if rows.dtype.names and name in rows.dtype.names:
                table[name] = rows[name]
                used |= table[name] > 0
        if used.any() and scheme != self.unit_scheme:
            raise ValueError(f"the period's unit window counts are keyed by unit key scheme {scheme!r}, this "
                             f"aggregator keys units by {self.unit_scheme!r}: its units would start again at 0 "
                             "windows (restore after the period ends, or with the configuration that wrote it)")
        self.unit_windows.load(keys[used], table[used])

    def _load_counters(self, name: str, saved: dict) -> None:
        mine = self.counters[name]
        same = saved.keys() == mine.keys() and all(
            saved[comp].keys() == mine[comp].keys() and all(c.matches(saved[comp][k]) for k, c in mine[comp].items())
            for comp in mine)
        if not same:
            log.warning("aggregate %s: its saved counters were calibrated to another configuration; its running "
                        "totals and partial release start again", name)
            self.pending.pop(name, None)
            return
        for comp, cs in mine.items():
            for k, c in cs.items():
                c.load_state(saved[comp][k])
