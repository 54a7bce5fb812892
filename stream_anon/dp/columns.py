"""One closed window's events as columns, for the DP aggregates (issue 11: the per-event path cost as much as the
anonymization itself).

:class:`WindowColumns` holds the fields the aggregates read (field -> list of values, in the window's order) and
computes, once per window and shared by every aggregate, what they all need: each field's values factorized
(distinct values and one integer code per event), the group-key cell of every event per group-by dimension, the
numeric values and their validity, and the privacy unit's codes. Per aggregate the work is then numpy on codes.

Factorization uses a Python dict, so two values are one distinct value exactly when a dict (``mapping.get``,
``dict.fromkeys``) would take them as one key: every per-distinct-value answer equals the per-event answer of the
per-event implementation (:meth:`stream_anon.dp.specs.GroupKey.keys_of` caches by the same rule). Unhashable
values (a list or an object in a JSON field) get the code of :data:`UNHASHABLE`.

>>> wc = WindowColumns({"line": ["a", "b", "a", None]})
>>> codes, distinct = wc.factorized("line")
>>> codes.tolist(), distinct
([0, 1, 0, 2], ['a', 'b', None])
>>> rank, units, first = UnitGroups(np.array([3, 1, 3, 3, 1])).subset(np.arange(5))
>>> (rank < 2).tolist()                     # each unit's first 2 events (contribution bounding)
[True, True, True, False, True]
"""
from __future__ import annotations

import collections
import math

import numpy as np

UNHASHABLE = object()      # the distinct "value" of every unhashable value of a column


def factorize(values: list) -> tuple[np.ndarray, list]:
    """(int64 code of each value, distinct values in order of first appearance); unhashable values all get the
    code of :data:`UNHASHABLE` (last in the distinct values)."""
    # a new key's code is the number of keys before it: one dict lookup per value, all of it in C (the loop
    # ``setdefault(v, len(index))`` in Python took ~40% longer on the Oyster windows)
    index = collections.defaultdict()
    index.default_factory = index.__len__
    try:
        codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    except TypeError:
        index = {}
        setdefault = index.setdefault
        codes = []
        unhashable = []
        for i, v in enumerate(values):
            try:
                codes.append(setdefault(v, len(index)))
            except TypeError:
                codes.append(-1)
                unhashable.append(i)
        distinct = list(index)
        arr = np.array(codes, dtype=np.int64)
        arr[unhashable] = len(distinct)
        return arr, distinct + [UNHASHABLE]
    return codes, list(index)


class UnitGroups:
    """A window's events grouped by unit once (one stable sort of their unit codes), for the subsets its
    aggregates keep: a subset's units and each of its events' rank among its unit's events (in the window's
    order) in linear time, where ``np.unique`` and a rank by unit would sort again per aggregate. ``rank < C`` is
    the rule of :func:`stream_anon.dp.contribution.bound_contributions` (each unit's first ``C`` events).

    >>> g = UnitGroups(np.array([3, 1, 3, 3, 1, 2]))
    >>> rank, units, first = g.subset(np.array([0, 1, 3, 4]))
    >>> rank.tolist(), units.tolist(), first.tolist()
    ([0, 0, 1, 1], [1, 3], [1, 0])
    """

    def __init__(self, codes: np.ndarray):
        self.codes = np.asarray(codes)
        self.order = np.argsort(self.codes, kind="stable")     # a unit's events together, in their order

    def subset(self, events: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``events`` (indices into the window, increasing): each one's rank among the events of its unit
        in the subset (0 for the first), the subset's unit codes (ascending) and the index of each unit's first
        event."""
        n, k = len(self.codes), len(events)
        if k == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=self.codes.dtype), np.zeros(0, dtype=np.int64)
        mask = np.zeros(n, dtype=bool)
        mask[events] = True
        order = self.order[mask[self.order]]
        codes = self.codes[order]
        starts = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(k) - np.repeat(starts, np.diff(np.append(starts, k)))
        return rank[events], codes[starts], order[starts]


class WindowColumns:
    """A window's events as columns (see the module docstring). ``columns``: field -> list of values, every list
    of the same length; a field not given reads as ``None`` for every event."""

    def __init__(self, columns: dict[str, list], n: int | None = None):
        self.columns = columns
        self.n = len(next(iter(columns.values()))) if n is None and columns else int(n or 0)
        self._factorized: dict = {}
        self._coalesced: dict = {}
        self._cells: dict = {}
        self._numeric: dict = {}
        self._types: dict = {}
        self.memo: dict = {}        # consumers' own per-window results (the aggregator's unit hashes)

    @classmethod
    def from_flats(cls, flats: list[dict], fields) -> "WindowColumns":
        """Columns of flat events (dicts keyed by dotted paths)."""
        return cls({f: [e.get(f) for e in flats] for f in fields}, len(flats))

    def column(self, field: str) -> list:
        col = self.columns.get(field)
        return col if col is not None else [None] * self.n

    def types(self, field: str) -> set:
        """The Python types of a field's values."""
        hit = self._types.get(field)
        if hit is None:
            hit = self._types[field] = set(map(type, self.column(field)))
        return hit

    def code_of_none(self, field) -> int:
        """The code of ``None`` in :meth:`factorized` (-1 when no value is null)."""
        key = ("none", field)
        hit = self.memo.get(key)
        if hit is None:
            _, distinct = self.factorized(field)
            hit = self.memo[key] = next((i for i, v in enumerate(distinct) if v is None), -1)
        return hit

    def factorized(self, field) -> tuple[np.ndarray, list]:
        """:func:`factorize` of a field (a name) or of the first non-null value of several (a tuple)."""
        hit = self._factorized.get(field)
        if hit is None:
            col = self.coalesced(field) if isinstance(field, tuple) else self.column(field)
            hit = self._factorized[field] = factorize(col)
        return hit

    def coalesced(self, fields: tuple[str, ...]) -> list:
        """Per event, the value of the first of ``fields`` that is not null (``GroupKey.key_of``'s rule)."""
        if len(fields) == 1:
            return self.column(fields[0])
        hit = self._coalesced.get(fields)
        if hit is None:
            cols = [self.column(f) for f in fields]
            if len(cols) == 2:
                hit = [a if a is not None else b for a, b in zip(*cols)]
            else:
                hit = [next((v for v in vals if v is not None), None) for vals in zip(*cols)]
            self._coalesced[fields] = hit
        return hit

    def group_cells(self, group, known: dict | None = None) -> np.ndarray:
        """Index in ``group.domain`` of every event's key (``GroupKey``), -1 when it has none. ``known``: raw value
        -> index, kept by the caller from window to window (a key is a function of the value alone)."""
        hit = self._cells.get(id(group))
        if hit is None:
            codes, distinct = self.factorized(group.fields if len(group.fields) > 1 else group.fields[0])
            known = {} if known is None else known
            position = None
            cell_of = np.empty(len(distinct), dtype=np.int64)
            for j, v in enumerate(distinct):
                if v is UNHASHABLE:
                    cell_of[j] = -1
                    continue
                # a bool equals 1 or 0 as a dict key but has no hour: never remembered nor looked up
                cell = known.get(v) if type(v) is not bool else None
                if cell is None:
                    if position is None:
                        position = {d: i for i, d in enumerate(group.domain)}
                    key = group._value_key(v)
                    cell = -1 if key is None else position[key]
                    if type(v) is not bool:
                        known[v] = cell
                cell_of[j] = cell
            hit = self._cells[id(group)] = cell_of[codes] if len(codes) else np.empty(0, dtype=np.int64)
        return hit

    def numeric(self, field: str) -> tuple[np.ndarray, np.ndarray]:
        """(valid mask, values as floats, 0 where not valid): valid is a finite int or float that is not a bool
        (the per-event test of the aggregates' value fields)."""
        hit = self._numeric.get(field)
        if hit is None:
            col = self.column(field)
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
            hit = self._numeric[field] = (valid, values)
        return hit
