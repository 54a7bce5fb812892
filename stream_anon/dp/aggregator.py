"""Engine-independent differentially private aggregates over event-time windows (topic ``anon.aggregates``): the
window loop that takes a DP value through the steps of :mod:`stream_anon.dp`, in order.

``DPAggregator(config, ledger, seed).process_window(window_id, events)`` takes one closed window's raw events (in
arrival order) and returns the rows to publish: one per aggregate, output (``per_window`` / ``running``) and group
key of the **configured domain**, whether or not the key occurs in the data, plus a ``budget_exhausted`` event
(for ``anon.metrics``) when the ledger stops an aggregate. Per window and aggregate (:meth:`DPAggregator._window`):

1. the window as columns (:mod:`~stream_anon.dp.columns`);
2. each event's cell of the domain (:mod:`~stream_anon.dp.cells`; others are ``out_of_domain``, a missing value
   ``missing``);
3. contribution bounding (:mod:`~stream_anon.dp.contribution`): each unit's first ``max_contributions`` events of
   the window and, in period mode, its first ``W`` windows of the period; values clamped; the number cut is
   reported. In period mode the bounded sums accumulate until the aggregate's release is due;
4. the spend of every release of the window is reserved in the ledger (:mod:`~stream_anon.dp.ledger`), keyed by a
   keyed digest of the bounded values, before any is released;
5. the noisy release (:mod:`~stream_anon.dp.release`): each component through its counter(s)
   (:mod:`~stream_anon.dp.continual`, noise drawn by :mod:`~stream_anon.dp.diffprivlib_adapter`), as a block of
   rows.

Noise is a deterministic function of ``(seed, aggregate, component, output, release)``: a restarted worker
re-produces identical releases, so the ledger's idempotent reservation is sound (re-publishing the same values
leaks nothing new). The seed must therefore be **secret** (derive it from ``STREAM_ANON_SECRET``): anyone who
knows it can subtract the noise.

The aggregator is a :class:`~stream_anon.checkpoint.Checkpointable` (its state: :mod:`~stream_anon.dp.state`);
the ledger is another, kept beside it.

>>> from stream_anon.dp.specs import parse_dp_config
>>> from stream_anon.dp.ledger import BudgetLedger
>>> cfg = parse_dp_config({"stream": {"privacy_unit": "card"}, "dp": {"epsilon_budget": 1.0},
...     "aggregates": [{"name": "n", "kind": "count", "epsilon": 0.5, "max_contributions": 1,
...                     "group_by": [{"name": "line", "field": "line", "values": ["a", "b"]}]}]})
>>> agg = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=b"secret")
>>> rows = agg.process_window(0, [{"card": "x", "line": "a"}, {"card": "x", "line": "a"}])
>>> [(r["group"]["line"], r["mechanism"]) for r in rows]
[('a', 'per_window/geometric'), ('b', 'per_window/geometric')]
>>> agg.metrics["contributions_cut"]["n"]
1
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from stream_anon.dp import per_event
from stream_anon.dp.cells import CellKeys
from stream_anon.dp.columns import WindowColumns
from stream_anon.dp.contribution import Bounding, UnitKeys, WindowUnits
from stream_anon.dp.ledger import BudgetLedger, content_digest
from stream_anon.dp.release import ReleasedCells, Releaser, new_counters, plan_aggregate, rows_of
from stream_anon.dp.specs import AggregateSpec, DPConfig
from stream_anon.dp.state import AggregatorState
from stream_anon.dp.transition import specs_in_force
from stream_anon.events import flatten


class DPAggregator:
    """Differentially private aggregates of a stream, window by window.

    Parameters
    ----------
    config : DPConfig
        Validated aggregate specifications (:func:`stream_anon.dp.specs.parse_dp_config`).
    ledger : BudgetLedger
        The budget ledger; every window's spend is reserved before rows are returned.
    seed : int, str or bytes
        Secret seed of the noise (see the module docstring).
    stream : str, optional
        The stream's name in the rows (default: the configuration's).
    unit_ids : bool, default False
        The windows' columns (:meth:`process_columns`) carry the privacy unit's keyed 64-bit ids under
        :data:`~stream_anon.events.UNIT_IDS` (the engine's, when the aggregates' unit is the stream's
        privacy unit): units are told apart and keyed in the unit window table by them, not by a hash of
        their own (the worker).
    """

    def __init__(self, config: DPConfig, ledger: BudgetLedger, seed, stream: str = "", unit_ids: bool = False):
        if not isinstance(config, DPConfig):
            raise TypeError(f"config: expected a DPConfig (parse_dp_config), got {type(config).__name__}")
        self.config, self.clock, self.ledger = config, config.clock, ledger
        event_unit = self.clock is not None and config.unit == "event"
        if not config.privacy_unit and not event_unit:
            raise ValueError("privacy_unit: required (contribution bounding counts events per individual)")
        if seed is None:
            raise ValueError("seed: required and secret (noise must be reproducible after a restart)")
        self.seed = seed if isinstance(seed, bytes) else str(seed).encode()
        # the configured aggregates; :attr:`specs` are those in force (an accepted change's carry may keep old
        # calibrations until the period ends: stream_anon.dp.transition)
        self.config_specs: tuple[AggregateSpec, ...] = tuple(config.aggregates)
        self.privacy_unit, self.stream = config.privacy_unit, stream or config.stream
        scheme = None if event_unit else "ids" if unit_ids else "hash"
        self.cells = CellKeys()
        self.bounding = Bounding(self.privacy_unit, None if scheme is None else UnitKeys(self.seed, scheme), None)
        self.releaser = Releaser(self.seed, self.stream, self.cells.labels)
        self._use_specs(self.config_specs)
        self.state = AggregatorState(self.specs, self.plans, self.clock is not None, scheme)
        self.window_metrics: dict = {}
        # every field an aggregate reads (dict events are turned into these columns)
        fields = [] if event_unit else [self.privacy_unit]
        for spec in self.config_specs:
            fields += [f for g in spec.group_by for f in g.fields]
            fields += [spec.value_field] if spec.value_field else []
            fields += [k for k, _ in spec.where]
        self.fields = tuple(dict.fromkeys(f for f in fields if f))

    # -- Checkpointable (the state: stream_anon.dp.state) ----------------------------------------------------
    def state_core(self) -> dict:
        return self.state.state_core()

    def state_tables(self) -> dict:
        return self.state.state_tables()

    def load_state(self, core: dict, tables) -> None:
        carried = core.get("carry")
        if carried:                   # the calibrations in force until the period ends, before the counters load
            self._use_specs(specs_in_force(self.config_specs, carried))
            self.state.specs, self.state.plans = self.specs, self.plans
            self.state.counters = {s.name: new_counters(s, self.plans[s.name]) for s in self.specs}
            self.ledger.epsilon_budget = float(carried["budget"])
        self.state.load_state(core, tables)

    def _use_specs(self, specs) -> None:
        """Release ``specs`` (their plans and ``W``) from now on."""
        max_windows = self.config.max_windows_per_period if self.clock is not None else None
        self.specs = tuple(specs)
        self.plans = {s.name: plan_aggregate(s, max_windows) for s in self.specs}
        if self.clock is None:
            self.bounding.caps = None
        else:
            assert max_windows is not None          # period mode has W (parse_dp_config)
            self.bounding.caps = {s.name: s.max_windows or max_windows for s in self.specs}

    def _end_carry(self) -> None:
        """The period of an accepted change ended: the configured settings are in force (new counters come with
        the new period)."""
        self._use_specs(self.config_specs)
        self.state.specs, self.state.plans, self.state.carry = self.specs, self.plans, None
        self.ledger.epsilon_budget = float(self.config.epsilon_budget)

    @property
    def metrics(self) -> dict:
        """Totals since the start: windows, events, rows published, budget stops, and per aggregate the events
        cut by each bound and left out (out of domain, missing)."""
        return self.state.metrics

    # -- processing ------------------------------------------------------------------------------------------
    def process_window(self, window_id: int, events: Iterable[dict], flat: bool = False) -> list[dict]:
        """Rows for one closed window (``type: aggregate``) and ``budget_exhausted`` events.

        ``window_id`` is the window's index (e.g. ``window_start // window_s``); windows must come in increasing
        order. Skipped windows are released as empty windows first, from the schedule's start
        (:attr:`~stream_anon.dp.specs.DPConfig.start_window`) on: whether a window is published must not depend on
        whether it held events. A window before the start is not released (its events are counted as
        ``before_start``). ``flat=True``: the events are already flat dicts keyed by dotted paths.
        """
        flats = list(events) if flat else \
            [flatten(e) if any(isinstance(v, dict) for v in e.values()) else e for e in events]
        return self.process_columns(window_id, WindowColumns.from_flats(flats, self.fields))

    def process_columns(self, window_id: int, columns: WindowColumns | dict[str, list]) -> list[dict]:
        """:meth:`process_window` on a window given as columns (field -> values, in the window's order; a
        :class:`~stream_anon.dp.columns.WindowColumns` or a dict of lists of one length; the fields are
        :attr:`fields`, a missing one reads as null): without a dict per event."""
        return rows_of(self.release_columns(window_id, columns))

    def release_columns(self, window_id: int, columns: WindowColumns | dict[str, list]) -> list:
        """:meth:`process_columns` with each release's rows as one :class:`~stream_anon.dp.release.ReleasedCells`
        (the worker's path: no dict per row); ``budget_exhausted`` events as dicts."""
        if isinstance(window_id, bool) or not isinstance(window_id, (int, np.integer)):
            raise TypeError(f"window_id: expected an integer window index, got {window_id!r}")
        window_id = int(window_id)
        wc = columns if isinstance(columns, WindowColumns) else WindowColumns(columns)
        start = self.config.start_window
        last = self.released_through
        if last is not None and window_id <= last and (start is None or window_id >= start):
            raise ValueError(f"window {window_id} is not after the last released window {last}")
        if start is not None and window_id < start:
            self.state.metrics["before_start"] += wc.n
            self.window_metrics = {"type": "dp_window", "stream": self.stream, "window": window_id, "events": wc.n,
                                   "before_start": wc.n}
            return []
        rows = self.advance_through(window_id - 1)
        rows.extend(self._window(window_id, wc))
        return rows

    @property
    def released_through(self) -> int | None:
        """The last window released; before any, the window before the schedule's start (None: no declared start
        and nothing released yet)."""
        last = self.state.last_window
        if last is None and self.config.start_window is not None:
            return self.config.start_window - 1
        return last

    def advance_through(self, window: int) -> list:
        """Release every window after :attr:`released_through` up to ``window``, empty: the stream's clock has
        passed them (the watermark, or the end of a period at an idle flush), so they will hold no more events. The
        rows of a window exist whether or not it held events; a window released here is never released again
        (an event of it arriving later is not counted)."""
        last = self.released_through
        rows: list = []
        if last is None:
            return rows
        for gap in range(last + 1, int(window) + 1):
            rows.extend(self._window(gap, WindowColumns({}, 0)))
        return rows

    def true_values(self, name: str, events) -> dict[str, np.ndarray]:
        """Bounded, noise-free cell values of one window of events for aggregate ``name`` (error measurement
        only: never publish them). Spends nothing and changes no state."""
        spec = next(s for s in self.specs if s.name == name)
        flats = [flatten(e) if any(isinstance(v, dict) for v in e.values()) else e for e in events]
        window_units = WindowUnits(self.state.unit_windows) if self.clock is not None else None
        return self._bounded(spec, WindowColumns.from_flats(flats, self.fields), window_units, commit=False)[0]

    def _bounded(self, spec: AggregateSpec, wc: WindowColumns, window_units: WindowUnits | None,
                 commit: bool = True) -> tuple[dict[str, np.ndarray], dict]:
        """Steps 2 and 3: (bounded true value of every cell per component, counts of what was left out)."""
        if wc.n == 0:               # an empty window (the schedule releases them): zeros, nothing left out
            n = len(spec.domain)
            stats = {"contributions_cut": 0, "out_of_domain": 0, "missing": 0}
            if self.clock is not None:
                stats.update(windows_cut=0, units_window_capped=0)
            return {c: np.zeros(n) for c in spec.components}, stats
        if self.bounding.takes(wc):
            cells = self.cells.of_window(spec, wc)
            if cells is not None:
                return self.bounding.bound(spec, wc, cells, window_units, commit)
        return per_event.cell_values(spec, wc, self.cells, self.bounding, window_units, commit)

    def _window(self, w: int, wc: WindowColumns) -> list:
        """One window, steps 2 to 5 for every aggregate (module docstring). Without a period every aggregate is
        released every window at its ``epsilon``; in period mode each unit is also bounded to ``W`` windows of the
        period (per aggregate), the bounded values accumulate, and an aggregate is released on its schedule
        (every ``release_every_windows`` windows from the period's start, and at its last window) at its share
        of the period's epsilon."""
        st = self.state
        period = label = None
        if self.clock is not None:
            period = label, first, n = self.clock.period_of(w)
            if label != st.period:
                if st.carry is not None:
                    self._end_carry()
                self.ledger.compact(label)     # the ledger keeps older periods' charges as totals
                st.start_period(label)
        wm: dict[str, Any] = {
            "type": "dp_window", "stream": self.stream, "window": w, "events": wc.n,
            **({} if period is None else {"period": label}),
            "contributions_cut": {}, "out_of_domain": {}, "missing": {},
            **({} if period is None else {"windows_cut": {}, "units_window_capped": {}}), "budget_exhausted": []}
        window_units = None if period is None else WindowUnits(st.unit_windows)
        # (spec, bounded values to release, stats counted on release: None in period mode, counted already)
        due: list[tuple[AggregateSpec, dict[str, np.ndarray], dict | None]] = []
        paused = st.carry["pause"] if st.carry is not None else ()
        for spec in self.specs:
            stop = spec.name if period is None else f"{spec.name}@{label}"
            if spec.name in paused:
                continue
            if self.ledger.is_stopped(stop) and self.ledger.exhausted_at(stop) != str(w):
                continue
            x, stats = self._bounded(spec, wc, window_units)
            if period is None:
                due.append((spec, x, stats))
                continue
            self._count(wm, spec, stats)
            acc = st.pending.setdefault(spec.name, {c: np.zeros_like(v) for c, v in x.items()})
            for c, v in x.items():
                acc[c] += v
            if (w - first + 1) % spec.release_every == 0 or w - first == n - 1:
                due.append((spec, acc, None))
        if window_units is not None:
            window_units.flush()
        # durable before release; keyed by a digest of the content, so a window re-closed with other events
        # (a restart after an uncheckpointed early flush) is a second, paid release with fresh noise
        outcomes = self.ledger.reserve_many([
            (s.name, w, s.epsilon, content_digest(self.seed, s.name, w, x)) if period is None else
            (s.name, w, self.plans[s.name].release_epsilon, content_digest(self.seed, s.name, w, x), label,
             s.epsilon) for s, x, _ in due])
        rows: list = []
        for (spec, x, to_count), outcome in zip(due, outcomes):
            if period is not None:
                st.pending.pop(spec.name)
            if not outcome.ok:
                # the stopping window re-processed after a restart re-emits its event (the first emission may
                # have died with the worker between the ledger write and the delivery)
                stop = spec.name if period is None else f"{spec.name}@{label}"
                if outcome.first or self.ledger.exhausted_at(stop) == str(w):
                    rows.append(outcome.event(self.stream) if period is None else
                                {**outcome.event(self.stream), "period": label})
                    st.metrics["budget_exhausted_events"] += 1
                    wm["budget_exhausted"].append(spec.name)
                continue
            extra: dict[str, Any] | None = None
            if period is None:
                assert to_count is not None           # without periods, counted on release
                self._count(wm, spec, to_count)
            else:
                start = first + ((w - first) // spec.release_every) * spec.release_every
                extra = {"period": label, "unit": self.config.unit, "epsilon_period": spec.epsilon,
                         "span_start_window": start, "windows_in_release": w - start + 1,
                         "ledger_epsilon_budget": self.ledger.epsilon_budget}
                if spec.name in st.announce:       # the first release since an accepted change says so
                    extra["settings_changed"] = st.announce.pop(spec.name)
            rows.extend(self.releaser.release(spec, self.plans[spec.name], st.counters[spec.name], w, x,
                                              outcome.window, extra))
        st.last_window = w
        st.metrics["windows"] += 1
        st.metrics["events_in"] += wc.n
        st.metrics["aggregates_published"] += sum(len(r) for r in rows if isinstance(r, ReleasedCells))
        self.window_metrics = wm
        return rows

    def _count(self, wm: dict, spec: AggregateSpec, stats: dict) -> None:
        for key, n in stats.items():
            self.state.metrics[key][spec.name] += n
            wm[key][spec.name] = n


def split_outputs(rows: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """(rows for ``anon.aggregates``, events for ``anon.metrics``)."""
    rows = list(rows)
    return [r for r in rows if r["type"] == "aggregate"], [r for r in rows if r["type"] != "aggregate"]
