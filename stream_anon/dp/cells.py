"""Cell keys: which cell of an aggregate's configured domain each event of a window falls in, and each cell's labels.
Step 2 of the walk of a DP value (:mod:`stream_anon.dp`).

An aggregate's domain is fixed by its configuration (:attr:`~stream_anon.dp.specs.AggregateSpec.domain`): every
cell is released whether or not the data holds it, so publication never depends on the data. Cells are numbered
row-major over the group-by dimensions (the first dimension varies slowest); a histogram's cell is ``group cell *
bins + bin`` (its bins vary fastest). Per window and aggregate, :meth:`CellKeys.of_window` gives, for the events
its ``where`` filter keeps, their cell (or none: a key outside the domain, counted as ``out_of_domain``), whether
their value is usable (``missing`` otherwise) and the value; all of it numpy over the window's factorized columns
(:mod:`~stream_anon.dp.columns`), one Python step per distinct value. Inputs where a dict's notion of one value is
not the per-event rule's (an unhashable filter value, a bool in an hour field) return None: the caller takes the
per-event path (:mod:`~stream_anon.dp.per_event`), which gives the same answer event by event.

Each cell's labels (:class:`CellLabels`: its ``group`` and ``group_key``, as dicts and as JSON) are computed once
per aggregate; the released block (:mod:`~stream_anon.dp.release`) refers to them.

>>> from stream_anon.dp.specs import parse_dp_config
>>> from stream_anon.dp.columns import WindowColumns
>>> cfg = parse_dp_config({"stream": {"privacy_unit": "card"}, "dp": {"epsilon_budget": 1.0},
...     "aggregates": [{"name": "n", "kind": "count", "epsilon": 0.5, "max_contributions": 1,
...                     "group_by": [{"name": "line", "field": "line", "values": ["a", "b"]}]}]})
>>> keys = CellKeys()
>>> c = keys.of_window(cfg.aggregates[0], WindowColumns({"line": ["b", "z", "a"]}))
>>> c.cell[~c.key_none].tolist(), int(c.key_none.sum()), keys.labels(cfg.aggregates[0]).pairs[1]
([1, 0], 1, ({'line': 'b'}, 'b'))
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass

import numpy as np

from stream_anon.dp.columns import UNHASHABLE, WindowColumns
from stream_anon.dp.specs import AggregateSpec, GroupKey

KNOWN_CELLS_MAX = 100_000      # raw values whose group cell is remembered between windows, per dimension


class CellLabels:
    """Per cell of an aggregate's domain: its ``group`` (key name -> value) and ``group_key`` (:attr:`pairs`), the
    JSON members of both (:attr:`json`) and ``group_key``'s JSON string without its opening quote
    (:attr:`key_tails`, to follow a prefix in one string)."""

    def __init__(self, spec: AggregateSpec):
        names = spec.key_names
        self.pairs = [(dict(zip(names, key)), "|".join(map(str, key))) for key in spec.domain]
        compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        self.json = [f'"group":{compact(g)},"group_key":{compact(k)}'.encode() for g, k in self.pairs]
        self.key_tails = [compact(k)[1:].encode() for _, k in self.pairs]


@dataclass
class EventCells:
    """One window's events for one aggregate: those its ``where`` keeps (``positions``, indices into the window,
    increasing) and, for each, its cell (meaningless where ``key_none``), whether it has no cell, whether its value
    is usable, and the value (floats for numbers, bools for a ratio's numerator; None for a count)."""
    positions: np.ndarray
    cell: np.ndarray
    key_none: np.ndarray
    valid: np.ndarray
    values: np.ndarray | None


class CellKeys:
    """The cell keys of an aggregator's aggregates: each event's cell per window (:meth:`of_window`), each
    cell's labels (:meth:`labels`), and the cell of each group key (:meth:`index`, for the per-event path)."""

    def __init__(self) -> None:
        self._labels: dict[str, CellLabels] = {}
        self._index: dict[str, dict] = {}
        self._known: dict[int, dict] = {}      # per group-by dimension: raw value -> cell (in memory only)

    def labels(self, spec: AggregateSpec) -> CellLabels:
        hit = self._labels.get(spec.name)
        if hit is None:
            hit = self._labels[spec.name] = CellLabels(spec)
        return hit

    def index(self, spec: AggregateSpec) -> dict:
        """Group key (a tuple of domain values, no bin) -> its group cell."""
        hit = self._index.get(spec.name)
        if hit is None:
            keys = itertools.product(*(g.domain for g in spec.group_by))
            hit = self._index[spec.name] = {k: i for i, k in enumerate(keys)}
        return hit

    def of_window(self, spec: AggregateSpec, wc: WindowColumns) -> EventCells | None:
        """The aggregate's :class:`EventCells` of the window; None where the per-event rule must decide (module
        docstring)."""
        if any(g.kind == "hour" and any(bool in wc.types(f) for f in g.fields) for g in spec.group_by):
            # a bool has no hour but equals 1 or 0, so which of them the per-event rule sees first decides: as it
            return None
        selected = np.ones(wc.n, dtype=bool)
        for k, allowed in spec.where:
            codes, distinct = wc.factorized(k)
            if distinct and distinct[-1] is UNHASHABLE:
                return None
            selected &= np.array([v in allowed for v in distinct], dtype=bool)[codes]
        positions = np.flatnonzero(selected)
        m = len(positions)
        cell = np.zeros(m, dtype=np.int64)
        key_none = np.zeros(m, dtype=bool)
        for g in spec.group_by:                      # row-major over the group-by domains
            known = self._known.setdefault(id(g), {})
            if len(known) > KNOWN_CELLS_MAX:          # e.g. every distinct time of an hour key: start again
                known.clear()
            d = group_cells(wc, g, known)[positions]
            key_none |= d < 0
            cell = cell * len(g.domain) + d
        vf = spec.value_field
        values: np.ndarray | None = None
        if vf is None:
            valid = np.ones(m, dtype=bool)
        elif spec.kind == "ratio":
            codes, distinct = wc.factorized(vf)
            valid = np.array([v is not None for v in distinct], dtype=bool)[codes[positions]]
            numerator = np.array([v is not UNHASHABLE and v in spec.numerator_values for v in distinct],
                                 dtype=bool)
            values = numerator[codes[positions]]
        else:
            ok, nums = numeric(wc, vf)
            valid, values = ok[positions], nums[positions]
        if spec.kind == "histogram":            # values outside the edges are clamped into the end bins
            assert values is not None, "a histogram has a value field (parse_aggregate)"
            nb = len(spec.bins) - 1
            b = np.clip(np.searchsorted(spec.bins, values, side="right") - 1, 0, nb - 1)
            cell = cell * nb + b.astype(np.int64)
        return EventCells(positions, cell, key_none, valid, values)


_NEW = -2          # group_cells: a value not in ``known`` yet


def group_cells(wc: WindowColumns, group: GroupKey, known: dict) -> np.ndarray:
    """Index in ``group.domain`` of every event's key, -1 when it has none; once per window and dimension.
    ``known``: raw value -> index, kept by the caller from window to window (a key is a function of the value
    alone)."""
    memo_key = ("cells", id(group))
    hit = wc.memo.get(memo_key)
    if hit is None:
        codes, distinct = wc.factorized(group.fields if len(group.fields) > 1 else group.fields[0])
        position = None
        cell_of = np.empty(len(distinct), dtype=np.int64)
        todo = range(len(distinct))
        if distinct and bool not in set(map(type, distinct)):
            # the values seen in earlier windows, looked up in C; only the new ones go through the loop below
            cell_of[:] = np.fromiter(map(known.get, distinct, itertools.repeat(_NEW)), dtype=np.int64,
                                     count=len(distinct))
            todo = np.flatnonzero(cell_of == _NEW).tolist()
        for j in todo:
            v = distinct[j]
            if v is UNHASHABLE:
                cell_of[j] = -1
                continue
            # a bool equals 1 or 0 as a dict key but has no hour: never remembered nor looked up
            cell = known.get(v) if type(v) is not bool else None
            if cell is None:
                if position is None:
                    position = {d: i for i, d in enumerate(group.domain)}
                key = group.value_key(v)
                cell = -1 if key is None else position[key]
                if type(v) is not bool:
                    known[v] = cell
            cell_of[j] = cell
        hit = wc.memo[memo_key] = cell_of[codes] if len(codes) else np.empty(0, dtype=np.int64)
    return hit


def numeric(wc: WindowColumns, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, values as floats, 0 where not valid) of a value field, once per window: valid is a finite int
    or float that is not a bool (the per-event test of the aggregates' value fields)."""
    memo_key = ("numeric", field)
    hit = wc.memo.get(memo_key)
    if hit is None:
        col = wc.column(field)
        types = set(map(type, col))
        if types <= {int, float}:
            # an int too large for a float raises here, as math.isfinite does in the per-event test
            values = np.array(col, dtype=float) if col else np.empty(0)
            valid = np.isfinite(values) if float in types else np.ones(len(col), dtype=bool)
        elif types <= {int, float, type(None)}:     # numbers and nulls (a JSON field that may be absent)
            values = np.array([0 if v is None else v for v in col], dtype=float)
            valid = np.fromiter([v is not None for v in col], dtype=bool, count=len(col))
            if float in types:
                valid &= np.isfinite(values)
        else:
            valid = np.fromiter((v is not None and not isinstance(v, bool) and isinstance(v, (int, float))
                                 and math.isfinite(v) for v in col), dtype=bool, count=len(col))
            values = np.array([float(v) if ok else 0.0 for v, ok in zip(col, valid.tolist())], dtype=float)
        values = np.where(valid, values, 0.0)
        hit = wc.memo[memo_key] = (valid, values)
    return hit
