"""Engine-independent differentially private aggregates over event-time windows (topic ``anon.aggregates``).

``DPAggregator(config, ledger, seed).process_window(window_id, events)`` takes one closed window's raw events (in
arrival order) and returns the rows to publish: one per aggregate, output (``per_window`` / ``running``) and group
key of the **configured domain**, whether or not the key occurs in the data, plus a ``budget_exhausted`` event
(for ``anon.metrics``) when the ledger stops an aggregate. Per window and aggregate:

1. events pass the aggregate's ``where`` filter and map to a cell of the configured domain (others are counted
   as ``out_of_domain``; a missing privacy unit or value as ``missing``);
2. contribution bounding keeps each individual's first ``max_contributions`` events and clamps values
   (:mod:`stream_anon.dp.contribution`); the number cut is reported;
3. the spend is reserved in the ledger (written to disk) for every aggregate of the window, in one write;
4. each component (count, sum, numerator, denominator) goes through its counter(s)
   (:mod:`stream_anon.dp.continual`): per-window noising and/or a binary-tree / hybrid running total.

Noise is a deterministic function of ``(seed, aggregate, component, output, window)``: a restarted worker
re-produces identical releases, so the ledger's idempotent reservation is sound (re-publishing the same values
leaks nothing new). The seed must therefore be **secret** (derive it from ``STREAM_ANON_SECRET``): anyone who
knows it can subtract the noise.

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

import base64
import functools
import hashlib
import hmac
import itertools
import json
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from stream_anon.dp.columns import UNHASHABLE, UnitGroups, WindowColumns
from stream_anon.dp.continual import (BinaryTreeCounter, HybridCounter, PerWindowCounter, _Counter,
                                      choose_mechanism, noise_ci95_half_width, Z95)
from stream_anon.dp.contribution import bound_contributions
from stream_anon.keyed_table import KeyedTable
from stream_anon.dp.ledger import BudgetLedger
from stream_anon.dp.specs import AggregateSpec, DPConfig
from stream_anon.events import UNIT_IDS
from stream_anon.events import flatten


KNOWN_CELLS_MAX = 100_000      # raw values whose group cell is remembered between windows, per dimension
UNIT_WINDOW_FIELDS = [("windows", "<u2")]     # a legacy per-aggregate table (state written before 2026-11-25)
# period mode: one table, keyed unit hash -> windows the unit used in the period, one u2 column per aggregate (one
# lookup per window for all aggregates, 8 bytes of key per unit in a checkpoint rather than 8 per aggregate). An
# aggregate name never holds a ".", so this name cannot be a legacy table's.
UNIT_WINDOWS_TABLE = "unit.windows"
# privacy units the columnar path takes: all text or all integers (missing ones aside), where one value for a dict
# is one value for the unit's text (its hash); other mixes (1 and 1.0, 1 and "1") go event by event
PLAIN_UNIT_TYPES = ({str, type(None)}, {int, type(None)})


class ReleasedCells:
    """One release of one aggregate output (``per_window`` or ``running``) as a block: the fields its rows share
    (:attr:`common`: aggregate, window, mechanism, epsilon, noise scale...) and, per cell of the aggregate's domain,
    its own (``group``, ``group_key``, and the fields of its :class:`CellLayout`). :meth:`rows` gives the
    ``aggregate`` rows (one per cell); the worker serializes the shared fields once per release and each cell's
    fields from the numbers (:meth:`cell_fragments`), with no dict per row (a window's releases have ~300 rows, one
    for every 4 events of the Oyster stream).

    ``labels``: the aggregate's :class:`CellLabels`; ``numbers``: the cells' numbers, cell after cell, in the
    order of ``layout``."""

    __slots__ = ("common", "labels", "numbers", "layout")

    def __init__(self, common: dict, labels: "CellLabels", numbers: list, layout: "CellLayout"):
        self.common, self.labels, self.numbers, self.layout = common, labels, numbers, layout

    def __len__(self) -> int:
        return len(self.labels.pairs)

    def rows(self) -> list[dict]:
        """The release's ``aggregate`` rows, one per cell of the domain (new dicts the caller may change)."""
        k, nums, common, fields = self.layout.per_cell, self.numbers, self.common, self.layout.fields_of
        return [{**common, "group": dict(group), "group_key": key, **fields(nums[i * k:(i + 1) * k])}
                for i, (group, key) in enumerate(self.labels.pairs)]

    def cell_fragments(self, dumps) -> list[bytes]:
        """Per cell, the JSON members of its own fields (``"group":...,"group_key":...,"value":...``, no braces).
        ``dumps``: a compact JSON serializer returning bytes (numbers are serialized by it, all in one call: a JSON
        number never holds a comma)."""
        k = self.layout.per_cell
        nums = dumps(self.numbers)[1:-1].split(b",")
        template = self.layout.template
        return [lab + template % tuple(nums[i * k:(i + 1) * k]) for i, lab in enumerate(self.labels.json)]


class CellLabels:
    """Per cell of an aggregate's domain: its ``group`` (key name -> value) and ``group_key`` (:attr:`pairs`), the
    JSON members of both (:attr:`json`) and ``group_key``'s JSON string without its opening quote
    (:attr:`key_tails`, to follow a prefix in one string). Computed once per aggregate."""

    def __init__(self, spec: AggregateSpec):
        names = spec.key_names
        self.pairs = [(dict(zip(names, key)), "|".join(map(str, key))) for key in spec.domain]
        compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        self.json = [f'"group":{compact(g)},"group_key":{compact(k)}'.encode() for g, k in self.pairs]
        self.key_tails = [compact(k)[1:].encode() for _, k in self.pairs]


class CellLayout:
    """The fields a cell takes from its numbers, in order: ``(name, shape)`` with shape ``None`` for a number, an
    int ``n`` for a list of ``n`` numbers, a tuple of names for an object of numbers. Both forms of a cell come
    from it: the dict of :meth:`fields_of` and the JSON ``template`` (a ``%b`` per number)."""

    def __init__(self, fields):
        self.fields = tuple(fields)
        self.per_cell = sum(1 if shape is None else shape if isinstance(shape, int) else len(shape)
                            for _, shape in self.fields)
        piece = lambda text: json.dumps(text).encode().replace(b"%", b"%%")      # noqa: E731
        parts = []
        for name, shape in self.fields:
            if shape is None:
                value = b"%b"
            elif isinstance(shape, int):
                value = b"[" + b",".join([b"%b"] * shape) + b"]"
            else:
                value = b"{" + b",".join(piece(c) + b":%b" for c in shape) + b"}"
            parts.append(b"," + piece(name) + b":" + value)
        self.template = b"".join(parts)

    def fields_of(self, numbers) -> dict:
        out, i = {}, 0
        for name, shape in self.fields:
            if shape is None:
                out[name], i = numbers[i], i + 1
            elif isinstance(shape, int):
                out[name], i = list(numbers[i:i + shape]), i + shape
            else:
                out[name], i = dict(zip(shape, numbers[i:i + len(shape)])), i + len(shape)
        return out


# a count, sum or histogram cell; a mean or ratio cell (its two components by name)
ONE_COMPONENT = CellLayout([("value", None), ("ci95", 2)])


@functools.lru_cache(maxsize=None)
def two_components(c0: str, c1: str) -> CellLayout:
    return CellLayout([("value", None), ("components", (c0, c1)), ("noise_ci95", 2), ("ci95", 2), ("bounds", 2)])


def rows_of(released: Iterable) -> list[dict]:
    """Rows of :meth:`DPAggregator.release_columns`' output: each block's rows, events as they are."""
    rows: list[dict] = []
    for r in released:
        rows.extend(r.rows() if isinstance(r, ReleasedCells) else [r])
    return rows


@dataclass
class _Plan:
    """How one aggregate is released: which counters, which epsilon each, which running mechanism."""
    spec: AggregateSpec
    running_mechanism: str | None        # None when output == per_window
    window_epsilon: float                # per component, per-window counter (0: no per-window counter)
    running_epsilon: float               # per component, running counter (0: running = prefix of per-window)
    reason: str
    release_epsilon: float = 0.0         # charged to the worst-case unit by one release (all components)
    sens_factor: int = 1                 # windows of one unit one release can hold: min(release_every, W)


def plan_aggregate(spec: AggregateSpec, max_windows: int | None = None) -> _Plan:
    """Split the aggregate's epsilon over its components and outputs and pick the running mechanism.

    Legacy mode (``max_windows=None``): ``spec.epsilon`` per window. Period mode: a unit contributes to at most
    ``W = max_windows`` windows of a period, so to at most ``W`` releases, each holding at most ``m =
    min(release_every, W)`` of its windows (sensitivity ``m`` times the per-window one); noise calibrated to
    ``epsilon * m / W`` per release keeps the unit's loss over the whole period at ``epsilon`` (the sum over
    its releases; Dwork & Roth 2014, Theorem 3.16), whatever the number of windows in the period."""
    if max_windows is not None and spec.max_windows is not None:
        max_windows = spec.max_windows
    m = 1 if max_windows is None else min(spec.release_every, max_windows)
    eps = spec.epsilon if max_windows is None else spec.epsilon * m / max_windows
    eps_c = eps / len(spec.components)
    if spec.output == "per_window":
        return _Plan(spec, None, eps_c, 0.0, "per-window output only", eps, m)
    sens = max(spec.component_sensitivity(c) for c in spec.components) * m
    noise = spec.component_noise(spec.components[0])
    if spec.mechanism == "auto":
        exact = noise == "geometric" and float(sens).is_integer()
        choice = choose_mechanism(spec.horizon_windows, eps_c, sens, noise if exact else "laplace", spec.output)
        mech, reason = choice["mechanism"], choice["reason"]
    else:
        mech, reason = spec.mechanism, "configured"
    if mech == "per_window":                  # running totals are prefix sums of the per-window releases
        return _Plan(spec, "per_window", eps_c, 0.0, reason, eps, m)
    if spec.output == "both":
        return _Plan(spec, mech, eps_c / 2, eps_c / 2, reason, eps, m)
    return _Plan(spec, mech, 0.0, eps_c, reason, eps, m)


class DPAggregator:
    """Differentially private aggregates of a stream, window by window.

    Parameters
    ----------
    config : DPConfig or sequence of AggregateSpec
        Validated aggregate specifications (:func:`stream_anon.dp.specs.parse_dp_config`).
    ledger : BudgetLedger
        The budget ledger; every window's spend is reserved (and written) before rows are returned.
    seed : int, str or bytes
        Secret seed of the noise (see the module docstring).
    privacy_unit : str, optional
        Dotted path of the individual's identifier; taken from ``config`` when it is a :class:`DPConfig`.
    track_individuals : bool, default False
        Keep, in memory only, the epsilon charged to each individual actually present (for the demo report's
        ``epsilon_spent_max_individual``; the ledger always charges the worst case).
    unit_ids : bool, default False
        The windows' columns (:meth:`process_columns`) carry the privacy unit's keyed 64-bit ids under
        :data:`~stream_anon.events.UNIT_IDS` (the engine's, when the aggregates' unit is the stream's
        privacy unit): units are told apart and keyed in the unit window table by them, not by a hash of
        their own (the worker; a period begun under the other scheme keeps it to its end, see :meth:`restore`).
    """

    def __init__(self, config: DPConfig | Sequence[AggregateSpec], ledger: BudgetLedger, seed,
                 privacy_unit: str | None = None, stream: str = "", track_individuals: bool = False,
                 unit_ids: bool = False):
        self.config = config if isinstance(config, DPConfig) else None
        self.clock = self.config.clock if self.config is not None else None
        self.max_windows = self.config.max_windows_per_period if self.clock is not None else None
        self.event_unit = self.clock is not None and self.config.unit == "event"
        if isinstance(config, DPConfig):
            specs, privacy_unit, stream = config.aggregates, privacy_unit or config.privacy_unit, \
                stream or config.stream
        else:
            specs = tuple(config)
        if not privacy_unit and not self.event_unit:
            raise ValueError("privacy_unit: required (contribution bounding counts events per individual)")
        if seed is None:
            raise ValueError("seed: required and secret (noise must be reproducible after a restart)")
        self.seed = seed if isinstance(seed, bytes) else str(seed).encode()
        self.specs = tuple(specs)
        self.ledger = ledger
        self.privacy_unit = privacy_unit
        self.stream = stream
        self.plans = {s.name: plan_aggregate(s, self.max_windows) for s in self.specs}
        # group key -> cell index; a histogram's cell is group cell * bins + bin (bins vary fastest in the domain)
        self._cells = {s.name: {k: i for i, k in enumerate(itertools.product(*(g.domain for g in s.group_by)))}
                       for s in self.specs}
        self.counters: dict[str, dict[str, dict[str, _Counter]]] = {s.name: self._new_counters(s)
                                                                    for s in self.specs}
        self.last_window: int | None = None
        self.track_individuals = track_individuals
        self.individual_spend: dict = {}
        self.metrics = {"windows": 0, "events_in": 0, "aggregates_published": 0, "budget_exhausted_events": 0,
                        "contributions_cut": {s.name: 0 for s in self.specs},
                        "out_of_domain": {s.name: 0 for s in self.specs},
                        "missing": {s.name: 0 for s in self.specs}}
        self.window_metrics: dict = {}
        # period mode: the current period, each unit's windows used in it per aggregate (keyed 64-bit hashes of
        # the unit, never the unit, as int64 keys of a KeyedTable: a checkpoint can carry only what changed),
        # and the bounded values accumulated towards the next release
        self.period: str | None = None
        self.unit_windows = KeyedTable([(s.name, "<u2") for s in self.specs])
        self.pending: dict[str, dict[str, np.ndarray]] = {}
        self.pending_units: dict[str, set] = {}
        if self.clock is not None:
            self.metrics["windows_cut"] = {s.name: 0 for s in self.specs}
            self.metrics["units_window_capped"] = {s.name: 0 for s in self.specs}
        self._w = {s.name: (s.max_windows or self.max_windows) for s in self.specs}
        self._labels: dict[str, CellLabels] = {}
        self._known_cells: dict[int, dict] = {}      # per group-by dimension: raw value -> cell (in memory only)
        self.unit_ids = bool(unit_ids) and not self.event_unit
        self.unit_keys = "ids" if self.unit_ids else "hash"    # the scheme of the current period's unit keys
        self._unit_key = hmac.new(self.seed, b"stream-anon/dp-unit-hash", hashlib.sha256).digest()
        self._unit_hasher = hashlib.blake2b(key=self._unit_key, digest_size=8)     # copied per unit
        self._generator = np.random.RandomState()       # re-seeded per release and component (:meth:`_rng`)
        # every field an aggregate reads (dict events are turned into these columns)
        fields = [] if self.event_unit else [self.privacy_unit]
        for spec in self.specs:
            fields += [f for g in spec.group_by for f in g.fields]
            fields += [spec.value_field] if spec.value_field else []
            fields += [k for k, _ in spec.where]
        self.fields = tuple(dict.fromkeys(f for f in fields if f))

    # -- construction ----------------------------------------------------------------------------------------
    def _new_counters(self, spec: AggregateSpec) -> dict[str, dict[str, _Counter]]:
        plan, n = self.plans[spec.name], len(spec.domain)
        out: dict[str, dict[str, _Counter]] = {}
        for comp in spec.components:
            sens, noise = spec.component_sensitivity(comp) * plan.sens_factor, spec.component_noise(comp)
            res = spec.component_resolution(comp)
            c: dict[str, _Counter] = {}
            if plan.window_epsilon > 0:
                c["window"] = PerWindowCounter(n, plan.window_epsilon, sens, noise, res)
            if plan.running_epsilon > 0:
                if plan.running_mechanism == "binary_tree":
                    c["running"] = BinaryTreeCounter(n, plan.running_epsilon, sens, noise, spec.horizon_windows, res)
                else:
                    c["running"] = HybridCounter(n, plan.running_epsilon, sens, noise, res)
            out[comp] = c
        return out

    def _rng(self, *labels) -> np.random.RandomState:
        """The generator of one (aggregate, component, output, release), valid until the next call.

        Seeded with an HMAC keyed by the secret seed: the noise is reproducible by the holder of the secret (a
        restarted worker) and unpredictable to anyone else. One generator re-seeded each time: the same stream
        as a new ``RandomState(digest)``, at a fourteenth of the cost (constructing one costs ~150 us)."""
        digest = hmac.new(self.seed, b"stream-anon/dp\x00" + "\x00".join(map(str, labels)).encode(),
                          hashlib.sha256).digest()
        self._generator.seed(np.frombuffer(digest, dtype=np.uint32))
        return self._generator

    # -- processing ------------------------------------------------------------------------------------------
    def process_window(self, window_id: int, events, flat: bool = False) -> list[dict]:
        """Rows for one closed window (``type: aggregate``) and ``budget_exhausted`` events.

        ``window_id`` is the window's index (e.g. ``window_start // window_s``); windows must come in increasing
        order. Skipped windows are released as empty windows first: whether a window is published must not
        depend on whether it held events. ``flat=True``: the events are already flat dicts keyed by dotted paths.
        """
        flats = list(events) if flat else self._flat(events)
        return self.process_columns(window_id, WindowColumns.from_flats(flats, self.fields))

    def process_columns(self, window_id: int, columns: "WindowColumns | dict[str, list]") -> list[dict]:
        """:meth:`process_window` on a window given as columns (field -> values, in the window's order; a
        :class:`~stream_anon.dp.columns.WindowColumns` or a dict of lists of one length; the fields are
        :attr:`fields`, a missing one reads as null): without a dict per event."""
        return rows_of(self.release_columns(window_id, columns))

    def release_columns(self, window_id: int, columns: "WindowColumns | dict[str, list]") -> list:
        """:meth:`process_columns` with each release's rows as one :class:`ReleasedCells` (the worker's path:
        no dict per row); ``budget_exhausted`` events as dicts."""
        if isinstance(window_id, bool) or not isinstance(window_id, (int, np.integer)):
            raise TypeError(f"window_id: expected an integer window index, got {window_id!r}")
        window_id = int(window_id)
        if self.last_window is not None and window_id <= self.last_window:
            raise ValueError(f"window {window_id} is not after the last processed window {self.last_window}")
        wc = columns if isinstance(columns, WindowColumns) else WindowColumns(columns)
        rows: list[dict] = []
        if self.last_window is not None:
            for gap in range(self.last_window + 1, window_id):
                rows.extend(self._process_one(gap, WindowColumns({}, 0)))
        rows.extend(self._process_one(window_id, wc))
        return rows

    @staticmethod
    def _flat(events) -> list[dict]:
        if isinstance(events, pd.DataFrame):
            return events.to_dict("records")
        return [flatten(e) if any(isinstance(v, dict) for v in e.values()) else e for e in events]

    def _process_one(self, w: int, flats: WindowColumns) -> list[dict]:
        if self.clock is not None:
            return self._process_one_period(w, flats)
        active = [s for s in self.specs
                  if not self.ledger.is_stopped(s.name) or self.ledger.exhausted_at(s.name) == str(w)]
        values = {s.name: self._cell_values(s, flats) for s in active}
        # durable before release; keyed by a digest of the content, so a window re-closed with other events
        # (a restart after an uncheckpointed early flush) is a second, paid release with fresh noise
        outcomes = self.ledger.reserve_many([(s.name, w, s.epsilon, self._digest(s.name, w, values[s.name][0]))
                                             for s in active])
        rows: list[dict] = []
        wm = {"type": "dp_window", "stream": self.stream, "window": w, "events": flats.n,
              "contributions_cut": {}, "out_of_domain": {}, "missing": {}, "budget_exhausted": []}
        for spec, outcome in zip(active, outcomes):
            if not outcome.ok:
                # the stopping window re-processed after a restart re-emits its event (the first emission may
                # have died with the worker between the ledger write and the delivery)
                if outcome.first or self.ledger.exhausted_at(spec.name) == str(w):
                    rows.append(outcome.event(self.stream))
                    self.metrics["budget_exhausted_events"] += 1
                    wm["budget_exhausted"].append(spec.name)
                continue
            x, stats, units = values[spec.name]
            for key in ("contributions_cut", "out_of_domain", "missing"):
                self.metrics[key][spec.name] += stats[key]
                wm[key][spec.name] = stats[key]
            if self.track_individuals:
                for u in units:
                    self.individual_spend[u] = self.individual_spend.get(u, 0.0) + spec.epsilon
            rows.extend(self._release(spec, w, x, outcome.window))
        return self._done(w, flats.n, rows, wm)

    def _done(self, w: int, n: int, released: list, wm: dict) -> list:
        self.last_window = w
        self.metrics["windows"] += 1
        self.metrics["events_in"] += n
        self.metrics["aggregates_published"] += sum(len(r) for r in released if isinstance(r, ReleasedCells))
        self.window_metrics = wm
        return released

    def _process_one_period(self, w: int, flats: WindowColumns) -> list[dict]:
        """Period mode: bound each unit to ``W`` windows of the period (per aggregate) and ``C`` events per
        window, accumulate the bounded values, and release on the aggregate's schedule (every
        ``release_every_windows`` windows from the period's start, and at its last window)."""
        label, first, n = self.clock.period_of(w)
        if label != self.period:
            self._new_period(label)
        pos = w - first
        wm = {"type": "dp_window", "stream": self.stream, "window": w, "events": flats.n, "period": label,
              "contributions_cut": {}, "out_of_domain": {}, "missing": {}, "windows_cut": {},
              "units_window_capped": {}, "budget_exhausted": []}
        releasing = []
        window_units = _WindowUnits(self.unit_windows)
        for spec in self.specs:
            stop = f"{spec.name}@{label}"
            if self.ledger.is_stopped(stop) and self.ledger.exhausted_at(stop) != str(w):
                continue
            x, stats, units = self._cell_values(spec, flats, window_units=window_units)
            for key in ("contributions_cut", "out_of_domain", "missing", "windows_cut", "units_window_capped"):
                self.metrics[key][spec.name] += stats[key]
                wm[key][spec.name] = stats[key]
            acc = self.pending.setdefault(spec.name, {c: np.zeros_like(v) for c, v in x.items()})
            for c, v in x.items():
                acc[c] += v
            if self.track_individuals:
                self.pending_units.setdefault(spec.name, set()).update(units)
            if (pos + 1) % spec.release_every == 0 or pos == n - 1:
                releasing.append(spec)
        window_units.flush()
        outcomes = self.ledger.reserve_many([
            (s.name, w, self.plans[s.name].release_epsilon, self._digest(s.name, w, self.pending[s.name]), label,
             s.epsilon) for s in releasing])
        rows: list[dict] = []
        for spec, outcome in zip(releasing, outcomes):
            x = self.pending.pop(spec.name)
            units = self.pending_units.pop(spec.name, set())
            if not outcome.ok:
                if outcome.first or self.ledger.exhausted_at(f"{spec.name}@{label}") == str(w):
                    rows.append({**outcome.event(self.stream), "period": label})
                    self.metrics["budget_exhausted_events"] += 1
                    wm["budget_exhausted"].append(spec.name)
                continue
            if self.track_individuals:
                for u in units:
                    k = (label, u, spec.name)
                    self.individual_spend[k] = min(spec.epsilon, self.individual_spend.get(k, 0.0)
                                                   + self.plans[spec.name].release_epsilon)
            start = first + (pos // spec.release_every) * spec.release_every
            rows.extend(self._release(spec, w, x, outcome.window, {
                "period": label, "unit": self.config.unit, "epsilon_period": spec.epsilon,
                "span_start_window": start, "windows_in_release": w - start + 1}))
        return self._done(w, flats.n, rows, wm)

    def _new_period(self, label: str) -> None:
        """A new period: window counts, running counters and partial releases start again (the budget is per
        period; the ledger keeps the previous periods' charges, older ones as totals: ``BudgetLedger.compact``)."""
        self.period = label
        self.ledger.compact(label)
        self.unit_windows.clear()     # cleared, not replaced: the deletions are changes to report
        self.unit_keys = "ids" if self.unit_ids else "hash"
        self.counters = {s.name: self._new_counters(s) for s in self.specs}
        self.pending, self.pending_units = {}, {}

    def _unit_hash(self, unit) -> int:
        """Keyed 64-bit hash of a unit (BLAKE2b keyed by the secret seed): the state never holds a raw id."""
        h = self._unit_hasher.copy()
        h.update(str(unit).encode())
        return int.from_bytes(h.digest(), "little")

    def _unit_hashes(self, units: list) -> np.ndarray:
        """:meth:`_unit_hash` of each unit, as uint64 (keyed by the text hashed: 1 == 1.0, "1" != "1.0"). A copy
        of one keyed hasher per unit: the key block is absorbed once (the digests are those of
        ``blake2b(text, key=...)``, ~30% faster; most units of a window are new, so no cache)."""
        copy = self._unit_hasher.copy
        digests = []
        append = digests.append
        for u in units:
            h = copy()
            h.update((u if type(u) is str else str(u)).encode())
            append(h.digest())
        return np.frombuffer(b"".join(digests), dtype="<u8").astype(np.uint64)

    @property
    def needs_unit_field(self) -> bool:
        """Whether the windows' columns must hold the privacy unit field itself (not only :data:`UNIT_IDS`)."""
        return not self.event_unit and self.unit_keys == "hash"

    def _unit_table_keys(self, units) -> np.ndarray:
        """The unit window table's keys (int64) of distinct units: the ids themselves, or their keyed hashes."""
        if self.unit_keys == "ids":
            return np.asarray(units, dtype=np.int64)
        return self._unit_hashes(units).view(np.int64)

    def _unit_id_codes(self, wc: WindowColumns) -> tuple[np.ndarray, np.ndarray]:
        """(code of each event's unit, distinct unit ids) from the window's :data:`UNIT_IDS` column."""
        hit = wc.memo.get(UNIT_IDS)
        if hit is None:
            ids = wc.columns.get(UNIT_IDS, np.empty(0, dtype=np.int64) if wc.n == 0 else None)
            if ids is None or len(ids) != wc.n:
                raise ValueError(f"the window's columns carry no unit ids ({UNIT_IDS}) for its {wc.n} events: the "
                                 "aggregator keys units by the engine's ids (unit_ids=True)")
            uniq, codes = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)
            hit = wc.memo[UNIT_IDS] = (codes.reshape(-1), uniq)
        return hit

    def _cap_units(self, name: str, pos: np.ndarray, commit: bool, window_units: "_WindowUnits",
                   distinct: bool | None = None) -> np.ndarray:
        """Which of a window's units (their rows in ``window_units``, :meth:`_WindowUnits.positions` of their
        :meth:`_unit_hashes`, one per unit, in the order of the units' first events) may still contribute a
        window to ``name`` in this period: fewer than ``W`` windows counted so far (the first windows in time: a
        choice that depends on the unit's own events only). ``commit``: count this window for the admitted units
        (in ``window_units``, written to the table when it is flushed). ``distinct``: whether the positions are
        known to differ (no two units share a 64-bit hash), if the caller knows."""
        cap = self._w[name]
        column = window_units.rows[name]             # a view: assignments update the window's rows
        counts = column[pos].astype(np.int64)
        if distinct is None:
            distinct = len(np.unique(pos)) == len(pos)
        if distinct:
            admitted = counts < cap
            if commit:
                at = pos[admitted]
                column[at] = counts[admitted] + 1
                window_units.changed[at] = True
            return admitted
        # two units of the window share a 64-bit hash, hence a count: the units one by one, in order
        admitted = np.zeros(len(pos), dtype=bool)
        for j, p in enumerate(pos.tolist()):
            c = int(column[p])
            admitted[j] = c < cap
            if admitted[j] and commit:
                column[p] = c + 1
                window_units.changed[p] = True
        return admitted

    def _window_cap(self, name: str, units: list, commit: bool, window_units: "_WindowUnits"
                    ) -> tuple[list[bool], int, int]:
        """Per-event form of :meth:`_cap_units`: mask of the events whose unit is admitted; events and units
        cut."""
        distinct = list(dict.fromkeys(units))
        pos = window_units.positions(self._unit_table_keys(distinct))
        ok = self._cap_units(name, pos, commit, window_units).tolist()
        admitted = dict(zip(distinct, ok))
        mask = [admitted[u] for u in units]
        return mask, len(mask) - sum(mask), ok.count(False)

    def _cell_values(self, spec: AggregateSpec, wc: WindowColumns, commit: bool = True,
                     window_units: "_WindowUnits | None" = None):
        """Per component, the bounded true value of every cell; plus counts of what was left out; plus the units
        kept (``track_individuals`` only). Columnar: numpy on the window's factorized columns, with the result of
        the per-event rules of :meth:`_cell_values_per_event` (which serves units that are neither all text nor
        all integers, and unhashable filter values, where a dict's notion of one value is not the unit's).

        ``window_units``: the window's unit counts, shared by its aggregates and flushed by the caller; without
        it the counts committed are written to the table before this returns."""
        if window_units is None:
            window_units = _WindowUnits(self.unit_windows)
            out = self._cell_values(spec, wc, commit, window_units)
            window_units.flush()
            return out
        if any(g.kind == "hour" and any(bool in wc.types(f) for f in g.fields) for g in spec.group_by):
            # a bool has no hour but equals 1 or 0, so which of them the per-event rule sees first decides: as it
            return self._cell_values_per_event(spec, wc, commit, window_units)
        n_all = wc.n
        sel = np.ones(n_all, dtype=bool)
        for k, allowed in spec.where:
            codes, distinct = wc.factorized(k)
            if distinct and distinct[-1] is UNHASHABLE:
                return self._cell_values_per_event(spec, wc, commit, window_units)
            sel &= np.array([v in allowed for v in distinct], dtype=bool)[codes]
        positions = np.flatnonzero(sel)
        m = len(positions)
        all_codes = None                             # each event's unit code, all the window's events
        if self.event_unit:                          # every event its own unit, numbered after the filter
            unit_codes, distinct_units = np.arange(m), None
            unit_none = np.zeros(m, dtype=bool)
        elif self.unit_keys == "ids":                # every accepted event has a unit (the engine checked)
            all_codes, distinct_units = self._unit_id_codes(wc)
            unit_codes = all_codes[positions]
            unit_none = np.zeros(m, dtype=bool)
        else:
            types = wc.types(self.privacy_unit)
            if not any(types <= plain for plain in PLAIN_UNIT_TYPES):
                return self._cell_values_per_event(spec, wc, commit, window_units)
            all_codes, distinct_units = wc.factorized(self.privacy_unit)
            unit_codes = all_codes[positions]
            unit_none = unit_codes == wc.code_of_none(self.privacy_unit)
        cell = np.zeros(m, dtype=np.int64)
        key_none = np.zeros(m, dtype=bool)
        for g in spec.group_by:                      # the cell: row-major over the group-by domains
            known = self._known_cells.setdefault(id(g), {})
            if len(known) > KNOWN_CELLS_MAX:          # e.g. every distinct time of an hour key: start again
                known.clear()
            d = wc.group_cells(g, known)[positions]
            key_none |= d < 0
            cell = cell * len(g.domain) + d
        vf = spec.value_field
        values = None
        if vf is None:
            valid = np.ones(m, dtype=bool)
        elif spec.kind == "ratio":
            codes, distinct = wc.factorized(vf)
            valid = np.array([v is not None for v in distinct], dtype=bool)[codes[positions]]
            numerator = np.array([v is not UNHASHABLE and v in spec.numerator_values for v in distinct],
                                 dtype=bool)
            values = numerator[codes[positions]]
        else:
            ok, nums = wc.numeric(vf)
            valid, values = ok[positions], nums[positions]
        # each event left out is counted once, in this order: no unit (missing), no key, no value (missing)
        has_unit_key = ~unit_none & ~key_none
        missing = int(unit_none.sum()) + int((has_unit_key & ~valid).sum())
        ood = int((~unit_none & key_none).sum())
        cand = np.flatnonzero(has_unit_key & valid)
        units = unit_codes[cand]
        if all_codes is None:                        # one event per unit
            rank = np.zeros(len(cand), dtype=np.int64)
        else:
            # each event's rank among its unit's events, and the units (sorted), from one grouping of the
            # window's events by unit shared by its aggregates (no sort per aggregate)
            groups = wc.memo.get("unit_groups")
            if groups is None:
                groups = wc.memo["unit_groups"] = UnitGroups(all_codes)
            rank, uniq, first = groups.subset(positions[cand])
        extra = {}
        if self.clock is not None:
            wcut = ucut = 0
            if not self.event_unit and len(cand):
                # the rows of all the window's units, found once for its aggregates (valid while no aggregate
                # brought other units into ``window_units``: its generation)
                keys = wc.memo.get("unit_keys")
                if keys is None:
                    keys = wc.memo["unit_keys"] = self._unit_table_keys(distinct_units)
                memo = wc.memo.get("unit_positions")
                if memo is None or memo[0] is not window_units or memo[1] != window_units.generation:
                    pos_all = window_units.positions(keys)
                    memo = wc.memo["unit_positions"] = (window_units, window_units.generation, pos_all,
                                                        len(np.unique(pos_all)) == len(pos_all))
                _, _, pos_all, all_distinct = memo
                if not all_distinct:                 # counted one by one: in the order of the units' first events
                    uniq = uniq[np.argsort(first, kind="stable")]
                admitted = self._cap_units(spec.name, pos_all[uniq], commit, window_units,
                                           distinct=True if all_distinct else None)
                if not admitted.all():
                    ok_code = np.zeros(len(distinct_units), dtype=bool)
                    ok_code[uniq] = admitted
                    ev_ok = ok_code[units]
                    wcut, ucut = int(len(units) - ev_ok.sum()), int(len(admitted) - admitted.sum())
                    cand, units, rank = cand[ev_ok], units[ev_ok], rank[ev_ok]   # whole units: ranks hold
            extra = {"windows_cut": wcut, "units_window_capped": ucut}
        keep = rank < spec.max_contributions         # each unit's first events (bound_contributions' rule)
        cut = int(len(keep) - keep.sum())
        idx_a = cell[cand]
        if spec.kind == "histogram":            # values outside the edges are clamped into the end bins
            nb = len(spec.bins) - 1
            b = np.clip(np.searchsorted(spec.bins, values[cand], side="right") - 1, 0, nb - 1)
            idx_a = idx_a * nb + b.astype(np.int64)
        kept = None if spec.kind in ("count", "histogram") else values[cand][keep].astype(float)
        x = self._cell_sums(spec, idx_a[keep], kept)
        kept_units: set = set()
        if self.track_individuals:
            kept = units[keep].tolist()
            kept_units = set(kept) if self.event_unit else set(distinct_units[kept].tolist()) \
                if type(distinct_units) is np.ndarray else {distinct_units[c] for c in kept}
        return x, {"contributions_cut": cut, "out_of_domain": ood, "missing": missing, **extra}, kept_units

    def _cell_values_per_event(self, spec: AggregateSpec, wc: WindowColumns, commit: bool = True,
                               window_units: "_WindowUnits | None" = None):
        """:meth:`_cell_values`, event by event (the implementation the columnar one reproduces; kept for the
        inputs it does not take)."""
        if window_units is None:
            window_units = _WindowUnits(self.unit_windows)
            out = self._cell_values_per_event(spec, wc, commit, window_units)
            window_units.flush()
            return out
        names = list(wc.columns)
        flats = [dict(zip(names, vals)) for vals in zip(*(wc.column(f) for f in names))] if names else \
            [{} for _ in range(wc.n)]
        cells = self._cells[spec.name]
        if spec.where:
            flats = [f for f in flats if not any(f.get(k) not in allowed for k, allowed in spec.where)]
        pu = UNIT_IDS if self.unit_keys == "ids" else self.privacy_unit
        vf, ratio = spec.value_field, spec.kind == "ratio"
        all_units = list(range(len(flats))) if self.event_unit else [f.get(pu) for f in flats]
        keys = (zip(*(g.keys_of(flats) for g in spec.group_by)) if spec.group_by
                else itertools.repeat((), len(flats)))
        all_vals = [f.get(vf) for f in flats] if vf is not None else itertools.repeat(None, len(flats))
        idx, units, vals = [], [], []
        missing = ood = 0
        for unit, key, v in zip(all_units, keys, all_vals):
            if unit is None:
                missing += 1
                continue
            if None in key:                       # keys are domain values (str, int): never equal to None
                ood += 1
                continue
            if vf is not None and (v is None or (not ratio and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                                or not math.isfinite(v)))):
                missing += 1
                continue
            idx.append(cells[key])
            units.append(unit)
            vals.append(v)
        extra = {}
        if self.clock is not None:
            wcut = ucut = 0
            if not self.event_unit and units:
                mask, wcut, ucut = self._window_cap(spec.name, units, commit, window_units)
                if wcut:
                    idx = [i for i, k in zip(idx, mask) if k]
                    units = [u for u, k in zip(units, mask) if k]
                    vals = [v for v, k in zip(vals, mask) if k]
            extra = {"windows_cut": wcut, "units_window_capped": ucut}
        keep, cut = bound_contributions(units, spec.max_contributions)
        idx_a = np.asarray(idx, dtype=np.int64)
        if spec.kind == "histogram":            # values outside the edges are clamped into the end bins
            nb = len(spec.bins) - 1
            b = np.clip(np.searchsorted(spec.bins, np.asarray(vals, dtype=float), side="right") - 1, 0, nb - 1)
            idx_a = idx_a * nb + b.astype(np.int64)
        kept = None
        if spec.kind in ("sum", "mean"):
            kept = np.asarray([vals[i] for i in np.flatnonzero(keep)], dtype=float)
        elif spec.kind == "ratio":
            kept = np.asarray([vals[i] in spec.numerator_values for i in np.flatnonzero(keep)], dtype=float)
        x = self._cell_sums(spec, idx_a[keep], kept)
        kept_units = {u for u, k in zip(units, keep) if k} if self.track_individuals else set()
        return x, {"contributions_cut": cut, "out_of_domain": ood, "missing": missing, **extra}, kept_units

    @staticmethod
    def _cell_sums(spec: AggregateSpec, cells: np.ndarray, kept: np.ndarray | None) -> dict[str, np.ndarray]:
        """Cell values from the contributions kept after bounding: the cell of each (``cells``) and, for sums and
        means, its value (clamped to the bounds here), for ratios whether it counts in the numerator (0/1)."""
        n = len(spec.domain)
        count = np.bincount(cells, minlength=n).astype(float)
        if spec.kind in ("count", "histogram"):
            return {"count": count}
        if spec.kind in ("sum", "mean"):
            v = np.clip(kept, spec.lower, spec.upper)
            v = np.round(v / spec.resolution) * spec.resolution      # integer noise in units of the resolution
            x = {"sum": np.bincount(cells, weights=v, minlength=n) if len(v) else np.zeros(n)}
            if spec.kind == "mean":
                x["count"] = count
            return x
        return {"numerator": np.bincount(cells, weights=kept, minlength=n) if len(kept) else np.zeros(n),
                "denominator": count}

    def true_values(self, name: str, events) -> dict[str, np.ndarray]:
        """Bounded, noise-free cell values of one window of events for aggregate ``name`` (error measurement
        only: never publish them). Spends nothing and changes no state."""
        spec = next(s for s in self.specs if s.name == name)
        return self._cell_values(spec, WindowColumns.from_flats(self._flat(events), self.fields), commit=False)[0]

    # -- output ----------------------------------------------------------------------------------------------
    def _digest(self, name: str, w: int, x: dict[str, np.ndarray]) -> str:
        h = hmac.new(self.seed, f"stream-anon/dp-content\x00{name}\x00{w}".encode(), hashlib.sha256)
        for comp in sorted(x):
            h.update(comp.encode() + b"\x00" + np.ascontiguousarray(x[comp], dtype=float).tobytes())
        return h.hexdigest()[:32]

    def _release(self, spec: AggregateSpec, w: int, x: dict[str, np.ndarray], release: str,
                 extra: dict | None = None) -> list[ReleasedCells]:
        """The release's blocks (one per output). ``release``: the ledger key of this release (``"<w>"``, or
        ``"<w>~<n>"`` for a paid re-release); the noise is drawn from it. ``extra``: fields for every row (the
        period's)."""
        plan = self.plans[spec.name]
        counters = self.counters[spec.name]
        noisy: dict[str, dict[str, np.ndarray]] = {"per_window": {}, "running": {}}
        info: dict[str, dict[str, dict]] = {"per_window": {}, "running": {}}
        for comp in spec.components:
            c = counters[comp]
            noise = spec.component_noise(comp)
            if "window" in c:
                pw = c["window"]
                pw.update(x[comp], self._rng(spec.name, comp, "window", release))
                noisy["per_window"][comp] = pw.last_window
                info["per_window"][comp] = {
                    "epsilon": pw.epsilon, "scale": pw.node_scale, "var": pw.window_variance(),
                    "half": _half(pw, 1, pw.epsilon), "method": "exact",
                    "mechanism": f"per_window/{noise}"}
                if plan.running_mechanism == "per_window":
                    noisy["running"][comp] = pw.running
                    info["running"][comp] = {
                        "epsilon": 0.0, "scale": pw.node_scale, "var": pw.running_variance(pw.t),
                        "half": _half(pw, pw.t, pw.epsilon),
                        "method": "exact" if pw.t == 1 else "normal", "mechanism": f"per_window/{noise}",
                        "windows": pw.t}
            if "running" in c:
                rc = c["running"]
                noisy["running"][comp] = rc.update(x[comp], self._rng(spec.name, comp, "running", release))
                var = rc.running_variance(rc.t)
                if isinstance(rc, BinaryTreeCounter):
                    terms = rc.running_terms(rc.t)
                    half = _half(rc, terms, rc.node_epsilon)
                    method = "exact" if terms == 1 else "normal"
                else:
                    half, method = Z95 * math.sqrt(var), "normal"
                info["running"][comp] = {"epsilon": rc.epsilon, "scale": rc.node_scale, "var": var, "half": half,
                                         "method": method, "mechanism": f"{rc.name}/{noise}", "windows": rc.t}
        blocks = []
        for output in ("per_window", "running"):
            if not noisy[output] or (output == "per_window" and spec.output == "running"):
                continue
            blocks.append(self._block(spec, w, output, noisy[output], info[output], plan, release, extra))
        return blocks

    def _group_labels(self, spec: AggregateSpec) -> "CellLabels":
        labels = self._labels.get(spec.name)
        if labels is None:
            labels = self._labels[spec.name] = CellLabels(spec)
        return labels

    def _block(self, spec, w, output, noisy, info, plan, release: str, extra: dict | None) -> ReleasedCells:
        comps = spec.components
        first = info[comps[0]]
        eps = sum(i["epsilon"] for i in info.values())
        common = {"type": "aggregate", "stream": self.stream, "window": w, "aggregate": spec.name,
                  "kind": spec.kind, "output": output, "mechanism": first["mechanism"],
                  "mechanism_reason": plan.reason, "epsilon": eps, "epsilon_window": plan.release_epsilon,
                  "max_contributions": spec.max_contributions}
        if output == "running":
            common["windows_covered"] = first["windows"]
            if eps == 0.0:
                common["epsilon_note"] = "post-processing of the per-window releases"
        labels = self._group_labels(spec)
        if len(comps) == 1:
            half = first["half"]
            common.update({"noise_scale": first["scale"], "noise_std": math.sqrt(first["var"]),
                           "sensitivity": spec.component_sensitivity(comps[0]) * plan.sens_factor,
                           "noise_ci95": [-half, half], "ci95_method": first["method"]})
            values = np.asarray(noisy[comps[0]], dtype=float)
            shown = np.rint(values).astype(np.int64).tolist() \
                if spec.component_noise(comps[0]) == "geometric" else values.tolist()
            numbers = np.column_stack([values, values - half, values + half]).ravel().tolist()
            numbers[0::3] = shown
            layout = ONE_COMPONENT
        else:
            c0, c1 = comps
            common.update({"noise_scale": {c: info[c]["scale"] for c in comps},
                           "noise_std": {c: math.sqrt(info[c]["var"]) for c in comps},
                           "sensitivity": {c: spec.component_sensitivity(c) * plan.sens_factor for c in comps},
                           "ci95_method": "delta"})
            a = np.asarray(noisy[c0], dtype=float)
            b = np.asarray(noisy[c1], dtype=float)
            lo, hi = (0.0, 1.0) if spec.kind == "ratio" else (float(spec.lower), float(spec.upper))
            d = np.maximum(b, 1.0)
            r = np.clip(a / d, lo, hi)
            # delta method on the noise only: Var(a/b) ~ (Var a + r^2 Var b) / b^2 (post-processing)
            half = Z95 * np.sqrt(info[c0]["var"] + r * r * info[c1]["var"]) / d
            numbers = np.column_stack([r, a, b, -half, half, np.maximum(lo, r - half), np.minimum(hi, r + half),
                                       np.full(len(r), lo), np.full(len(r), hi)]).ravel().tolist()
            layout = two_components(c0, c1)
        common["release"] = release
        if extra:
            common.update(extra)
        return ReleasedCells(common, labels, numbers, layout)

    # -- reporting and checkpoints ---------------------------------------------------------------------------
    @property
    def epsilon_spent_max_individual(self) -> float:
        """Largest epsilon charged to an individual actually present (``track_individuals``), else the
        ledger's worst-case total."""
        if self.track_individuals and self.individual_spend:
            if self.clock is None:
                return max(self.individual_spend.values())
            per: dict = {}                              # (period, unit) -> sum over aggregates
            for (label, u, _), e in self.individual_spend.items():
                per[(label, u)] = per.get((label, u), 0.0) + e
            return max(per.values())
        return self.ledger.spent

    def summary(self) -> dict:
        return {"epsilon_budget": self.ledger.epsilon_budget, "epsilon_spent": self.ledger.spent,
                "epsilon_spent_max_individual": self.epsilon_spent_max_individual,
                "aggregates_published": self.metrics["aggregates_published"],
                "budget_exhausted_events": self.metrics["budget_exhausted_events"],
                "contributions_cut": dict(self.metrics["contributions_cut"]),
                "mechanisms": {n: (p.running_mechanism or "per_window") for n, p in self.plans.items()}}

    def state_core(self) -> dict:
        """The bounded part of the checkpoint, JSON-serializable: counters, metrics and, in period mode, the period
        and the partial releases (the ledger has its own file or its own place in the worker's state)."""
        out = {"last_window": self.last_window, "metrics": self.metrics,
               "counters": {a: {comp: {k: c.state_dict() for k, c in cs.items()} for comp, cs in comps.items()}
                            for a, comps in self.counters.items()}}
        if self.clock is not None:
            out["period"] = self.period
            out["pending"] = {a: {c: v.tolist() for c, v in x.items()} for a, x in self.pending.items()}
            if not self.event_unit:
                out["unit_keys"] = self.unit_keys
        return out

    def unit_window_counts(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Aggregate ``name``'s view of the unit window counts: (int64 keys sorted ascending, counts) of the
        units that used at least one of its windows in the current period."""
        keys, rows = self.unit_windows.snapshot()
        used = rows[name] > 0
        return keys[used], rows[name][used].astype(np.int64)

    def state_tables(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Period mode: the unit window counts in full, ``{UNIT_WINDOWS_TABLE: (int64 keys sorted ascending: the
        units' keyed 64-bit hashes, never raw ids; records with one u2 field per aggregate)}``. DP state: without
        it a restart would let units contribute W more windows. Copies; does not reset what
        :meth:`state_changes` reports. Legacy mode: none."""
        if self.clock is None:
            return {}
        return {UNIT_WINDOWS_TABLE: self.unit_windows.snapshot()}

    def state_changes(self) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """What changed in :meth:`state_tables` since the previous call, with the contract of
        :meth:`stream_anon.engine.Engine.state_changes`: ``name`` -> (keys put, their records) and ``name +
        ":deleted"`` -> (keys deleted, None); the first call returns every row as put. A new period deletes
        every unit's count."""
        if self.clock is None:
            return {}
        keys, rows, deleted = self.unit_windows.changes()
        return {UNIT_WINDOWS_TABLE: (keys, rows), UNIT_WINDOWS_TABLE + ":deleted": (deleted, None)}

    def state_dict(self) -> dict:
        """JSON-serializable checkpoint: :meth:`state_core` plus, in period mode, each aggregate's
        :meth:`unit_window_counts` under ``unit_windows``, stored compactly as keyed 64-bit unit hashes sorted as
        unsigned integers and their counts (base64 of little-endian uint64 / uint16), never raw ids."""
        out = self.state_core()
        if self.clock is not None:
            out["unit_windows"] = {s.name: _pack_counts(*self.unit_window_counts(s.name)) for s in self.specs}
        return out

    @classmethod
    def from_state(cls, config, ledger: BudgetLedger, seed, state: dict, **kwargs) -> "DPAggregator":
        """Inverse of :meth:`state_dict`."""
        tables = {a: _unpack_counts(p) for a, p in state.get("unit_windows", {}).items()}
        return cls.restore(config, ledger, seed, state, tables, **kwargs)

    @classmethod
    def restore(cls, config, ledger: BudgetLedger, seed, core: dict,
                tables: dict[str, tuple[np.ndarray, np.ndarray]], **kwargs) -> "DPAggregator":
        """An aggregator from :meth:`state_core` and :meth:`state_tables` (a missing table is empty). Also takes
        the per-aggregate tables of earlier versions (aggregate name -> records of :data:`UNIT_WINDOW_FIELDS`),
        which :meth:`from_state` reads too. Counts of aggregates no longer configured are dropped. The unit keys
        of the restored period keep the scheme they were written with (``unit_keys``) until the period ends:
        :attr:`needs_unit_field` tells the caller to carry the unit field itself meanwhile."""
        agg = cls(config, ledger, seed, **kwargs)
        agg.last_window = core["last_window"]
        agg.metrics = core["metrics"]
        if agg.clock is not None and core.get("period") is not None:
            agg.period = core["period"]
            agg.pending = {a: {c: np.asarray(v, dtype=float) for c, v in x.items()}
                           for a, x in core.get("pending", {}).items() if a in agg.counters}
            agg.unit_windows.load(*_merge_unit_tables(tables, agg.unit_windows.dtype))
            if len(agg.unit_windows):
                # the period's counts are keyed by the scheme they were written with (states before the unit ids
                # were carried: "hash"); a unit looked up under the other would start again at 0 windows
                agg.unit_keys = core.get("unit_keys", "hash")
        for a, comps in core["counters"].items():
            if a in agg.counters:
                for comp, cs in comps.items():
                    agg.counters[a][comp] = {k: _Counter.from_state(s) for k, s in cs.items()}
        return agg


class _WindowUnits:
    """The unit window counts of one window's units, read from the table once and written back once: every
    aggregate of the window reads and updates its own column here (one table lookup and one write per window,
    not one per aggregate)."""

    def __init__(self, table: KeyedTable):
        self.table = table
        self.keys = np.empty(0, dtype=np.int64)          # sorted, unique
        self.rows = np.zeros(0, dtype=table.dtype)
        self.changed = np.zeros(0, dtype=bool)
        self.generation = 0                              # + 1 whenever keys are added (positions move)

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """Positions of ``keys`` in :attr:`rows`, reading the keys not held yet from the table."""
        keys = np.asarray(keys, dtype=np.int64)
        pos = np.searchsorted(self.keys, keys)
        held = pos < len(self.keys)
        held[held] = self.keys[pos[held]] == keys[held]
        if not held.all():
            new = np.unique(keys[~held])
            _, rows = self.table.get(new)
            order = np.argsort(np.concatenate([self.keys, new]), kind="stable")
            self.keys = np.concatenate([self.keys, new])[order]
            self.rows = np.concatenate([self.rows, rows])[order]
            self.changed = np.concatenate([self.changed, np.zeros(len(new), dtype=bool)])[order]
            self.generation += 1
            pos = np.searchsorted(self.keys, keys)
        return pos

    def flush(self) -> None:
        """Write the rows counted in to the table."""
        if self.changed.any():
            self.table.put(self.keys[self.changed], self.rows[self.changed])
            self.changed[:] = False


def _merge_unit_tables(tables: dict, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One unit window table (keys, records of ``dtype``) from :meth:`DPAggregator.state_tables` or from the
    per-aggregate tables of earlier versions; units left with no count are dropped."""
    columns = []                         # (aggregate, keys, counts)
    for name, (keys, rows) in tables.items():
        rows = np.asarray(rows)
        if name == UNIT_WINDOWS_TABLE:
            columns += [(a, keys, rows[a]) for a in rows.dtype.names if a in dtype.names]
        elif name in dtype.names and rows.dtype.names == ("windows",):
            columns.append((name, keys, rows["windows"]))
    if not columns:
        return np.empty(0, dtype=np.int64), np.zeros(0, dtype=dtype)
    keys = np.unique(np.concatenate([np.asarray(k, dtype=np.int64) for _, k, _ in columns]))
    rows = np.zeros(len(keys), dtype=dtype)
    for a, k, counts in columns:
        rows[a][np.searchsorted(keys, np.asarray(k, dtype=np.int64))] = counts
    used = np.zeros(len(keys), dtype=bool)
    for a in dtype.names:
        used |= rows[a] > 0
    return keys[used], rows[used]


def _pack_counts(keys: np.ndarray, counts: np.ndarray) -> dict:
    """One aggregate's unit window counts as base64 of the hashes (uint64, ascending) and counts (uint16)."""
    hashes = np.asarray(keys, dtype=np.int64).view(np.uint64)
    order = np.argsort(hashes)
    return {"n": len(hashes), "hashes": base64.b64encode(hashes[order].astype("<u8").tobytes()).decode(),
            "counts": base64.b64encode(np.asarray(counts)[order].astype("<u2").tobytes()).decode()}


def _unpack_counts(p: dict) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`_pack_counts`, as the per-aggregate table of :data:`UNIT_WINDOW_FIELDS`."""
    keys = np.frombuffer(base64.b64decode(p["hashes"]), dtype="<u8").astype(np.uint64).view(np.int64)
    rows = np.zeros(len(keys), dtype=UNIT_WINDOW_FIELDS)
    rows["windows"] = np.frombuffer(base64.b64decode(p["counts"]), dtype="<u2")
    return keys, rows


def _half(counter: _Counter, terms: int, epsilon: float) -> float:
    """95% half-width of the noise of a sum of ``terms`` draws of ``counter`` at ``epsilon``: exact for one draw,
    normal approximation for several (see :func:`stream_anon.dp.continual.sum_ci95_half_width`)."""
    if terms <= 0:
        return 0.0
    if terms == 1:
        if counter.noise == "geometric" and counter.resolution != 1.0:
            steps = round(float(counter.sensitivity) / counter.resolution)
            return noise_ci95_half_width("geometric", epsilon, steps) * counter.resolution
        return noise_ci95_half_width(counter.noise, epsilon, counter.sensitivity)
    return Z95 * math.sqrt(terms * counter._var(epsilon))


def split_outputs(rows: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """(rows for ``anon.aggregates``, events for ``anon.metrics``)."""
    rows = list(rows)
    return [r for r in rows if r["type"] == "aggregate"], [r for r in rows if r["type"] != "aggregate"]
