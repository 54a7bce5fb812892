"""One closed window's events as columns: step 1 of the walk of a DP value (:mod:`stream_anon.dp`).

:class:`WindowColumns` holds the fields the aggregates read (field -> list of values, in the window's order) and
factorizes each field once per window, for every aggregate: its distinct values and one integer code per event.
Each aggregate's work is then numpy on codes (:mod:`~stream_anon.dp.cells`, :mod:`~stream_anon.dp.contribution`),
with per-window results kept in :attr:`WindowColumns.memo` for the other aggregates of the window.

Factorization uses a Python dict, so two values are one distinct value exactly when a dict (``mapping.get``,
``dict.fromkeys``) would take them as one key: every per-distinct-value answer equals the per-event answer of
:mod:`~stream_anon.dp.per_event` (:meth:`stream_anon.dp.specs.GroupKey.keys_of` caches by the same rule).
Unhashable values (a list or an object in a JSON field) get the code of :data:`UNHASHABLE`.

>>> wc = WindowColumns({"line": ["a", "b", "a", None]})
>>> codes, distinct = wc.factorized("line")
>>> codes.tolist(), distinct
([0, 1, 0, 2], ['a', 'b', None])
"""
from __future__ import annotations

import collections
from typing import Any

import numpy as np

UNHASHABLE = object()      # the distinct "value" of every unhashable value of a column


def factorize(values: list) -> tuple[np.ndarray, list]:
    """(int64 code of each value, distinct values in order of first appearance); unhashable values all get the
    code of :data:`UNHASHABLE` (last in the distinct values)."""
    # a new key's code is the number of keys before it: one dict lookup per value, all of it in C (the loop
    # ``setdefault(v, len(index))`` in Python took ~40% longer on the Oyster windows)
    index: collections.defaultdict[Any, int] = collections.defaultdict()
    index.default_factory = index.__len__
    try:
        codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    except TypeError:
        seen: dict[Any, int] = {}
        setdefault = seen.setdefault
        code_list: list[int] = []
        unhashable = []
        for i, v in enumerate(values):
            try:
                code_list.append(setdefault(v, len(seen)))
            except TypeError:
                code_list.append(-1)
                unhashable.append(i)
        distinct = list(seen)
        arr = np.array(code_list, dtype=np.int64)
        arr[unhashable] = len(distinct)
        return arr, distinct + [UNHASHABLE]
    return codes, list(index)


class WindowColumns:
    """A window's events as columns (see the module docstring). ``columns``: field -> list of values, every list
    of the same length; a field not given reads as ``None`` for every event."""

    def __init__(self, columns: dict[str, list], n: int | None = None):
        self.columns = columns
        self.n = len(next(iter(columns.values()))) if n is None and columns else int(n or 0)
        self._factorized: dict = {}
        self._coalesced: dict = {}
        self._types: dict = {}
        self.memo: dict = {}        # the aggregates' per-window results, shared by them (cells, values, units)

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
