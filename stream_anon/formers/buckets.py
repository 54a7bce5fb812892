"""The m-invariant former's buckets: the invariant value of each record as text, the rows and values of each
individual in a close (:class:`RowValues`), and the value-aware Mondrian split of a bucket into classes (phase 3 of
:mod:`stream_anon.formers.minvariant`)."""
from __future__ import annotations

import numpy as np

from stream_anon.formers.counterfeits import counterfeit_need
from stream_anon.strategies.partition import split_recursively


def invariant_text(v) -> str | None:
    """The text form of an invariant value (as the checker compares them); None for null and containers."""
    if v is None or isinstance(v, (dict, list, tuple)):
        return None
    if isinstance(v, bool):
        return str(v).lower()
    return v if isinstance(v, str) else str(v)


# ------------------------------------------------------------------------------------------ value-aware Mondrian
def split_bucket(X: np.ndarray, unit: np.ndarray, pair_value: np.ndarray, pair: np.ndarray, s: int, k: int, m: int,
                 width: np.ndarray, tolerance: int = 0, presence: bool = True) -> list[np.ndarray]:
    """Split one bucket's records into classes (phase 3).

    ``X`` (n, D) codes, ``unit`` (n,) local individual ids, ``pair`` (n,) local ids of (individual, value) pairs and
    ``pair_value`` (P,) the signature-value index of each pair (-1 for a null value), ``s`` signature size. A cut
    along the widest normalized dimension (then the next) is taken at the boundary nearest the median among those
    leaving k real individuals on both sides whose halves need at most ``tolerance`` more counterfeit individuals
    than the node; an individual whose records fall on both sides counts on both.
    """
    width = np.where(width > 0, width, 1.0)
    return split_recursively(np.arange(len(X)), lambda idx: _best_cut(
        X[idx], unit[idx], pair[idx], pair_value, s, k, m, width, tolerance, presence))


def _node_counts(unit, pair, pair_value, s):
    """(real individuals per signature value, individuals, individuals holding a null value) of a node."""
    if len(unit) == 0:
        return np.zeros(s, dtype=np.int64), 0, 0
    # local ids are small non-negative integers: counting beats sorting
    n = int(np.count_nonzero(np.bincount(unit)))
    pv = pair_value[np.flatnonzero(np.bincount(pair))]
    c = np.bincount(np.where(pv >= 0, pv, s), minlength=s + 1)      # last column: null
    return c[:s], n, c[s]


def _best_cut(X, unit, pair, pair_value, s, k, m, width, tolerance, presence):
    n_rows = len(X)
    c, n, z = _node_counts(unit, pair, pair_value, s)
    if n < 2 * k:
        return None
    need = int(counterfeit_need(c[None], np.array([n]), m, presence, np.array([z]))[0])
    span = (X.max(axis=0) - X.min(axis=0)) / width
    for dim in np.argsort(-span, kind="stable"):
        if span[dim] <= 0:
            break
        order = np.argsort(X[:, dim], kind="stable")
        col = X[order, dim]
        u, p = unit[order], pair[order]
        # first / last occurrence of each individual and each (individual, value) pair along the sorted column
        first_u, last_u = _first_last(u)
        first_p, last_p = _first_last(p)
        # candidate cuts: left = rows [0, b) for b where the column value changes
        bounds = np.flatnonzero(col[1:] != col[:-1]) + 1
        if len(bounds) == 0:
            continue
        left_n = np.concatenate([[0], np.cumsum(first_u)])[bounds]
        right_n = np.concatenate([np.cumsum(last_u[::-1])[::-1], [0]])[bounds]
        ok = (left_n >= k) & (right_n >= k)
        if not ok.any():
            continue
        bounds, left_n, right_n = bounds[ok], left_n[ok], right_n[ok]
        pv = pair_value[p]
        col = np.where(pv >= 0, pv, s)                       # column s: null values
        onehot = np.zeros((n_rows, s + 1), dtype=np.int64)
        onehot[np.flatnonzero(first_p), col[first_p]] = 1
        left_c = np.vstack([np.zeros((1, s + 1), dtype=np.int64), np.cumsum(onehot, axis=0)])[bounds]
        onehot[:] = 0
        onehot[np.flatnonzero(last_p), col[last_p]] = 1
        right_c = np.vstack([np.cumsum(onehot[::-1], axis=0)[::-1], np.zeros((1, s + 1), dtype=np.int64)])[bounds]
        total = (counterfeit_need(left_c[:, :s], left_n, m, presence, left_c[:, s])
                 + counterfeit_need(right_c[:, :s], right_n, m, presence, right_c[:, s]))
        good = total <= need + tolerance
        if not good.any():
            continue
        cand = bounds[good]
        b = int(cand[np.argmin(np.abs(cand - n_rows / 2))])
        mask = np.zeros(n_rows, dtype=bool)
        mask[order[:b]] = True
        return mask
    return None


def _first_last(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks of the first and of the last occurrence of each value of ``a`` (in array order), from one
    stable sort: within a run of equal values the positions ascend.

    >>> [m.astype(int).tolist() for m in _first_last(np.array([3, 1, 3, 2, 1]))]
    [[1, 1, 0, 1, 0], [0, 0, 1, 1, 1]]
    """
    n = len(a)
    first, last = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    if n == 0:
        return first, last
    order = np.argsort(a, kind="stable")
    change = np.flatnonzero(a[order[1:]] != a[order[:-1]])
    first[order[np.concatenate([[0], change + 1])]] = True
    last[order[np.concatenate([change, [n - 1]])]] = True
    return first, last


class RowValues:
    """The invariant values of a close's rows as integer codes, and the (individual, value) structure phases 1 and 3
    read, computed with numpy once per close instead of per row in Python."""

    def __init__(self, values: list, units: np.ndarray):
        self.value_list = [v for v in dict.fromkeys(values) if v is not None]     # first-appearance order
        self.code_of = {v: i for i, v in enumerate(self.value_list)}
        self.code_of[None] = -1
        n = len(values)
        self.code = np.fromiter(map(self.code_of.__getitem__, values), dtype=np.int64, count=n)
        _, first = np.unique(self.code, return_index=True)
        self.first_row = first[1:] if n and self.code[first[0]] < 0 else first    # per value, by code
        if n:
            self.uids, self.unit_of_row = np.unique(units, return_inverse=True)
        else:
            self.uids, self.unit_of_row = np.empty(0, np.int64), np.empty(0, np.int64)
        self.unit_of_row = self.unit_of_row.astype(np.int64, copy=False)
        n_units = len(self.uids)
        self._base = len(self.value_list) + 1
        keys = np.unique(self.unit_of_row * self._base + (self.code + 1))    # distinct (individual, value) pairs
        self._pair_unit, self._pair_code = keys // self._base, keys % self._base - 1
        valued = self._pair_code >= 0
        self.n_values = np.bincount(self._pair_unit[valued], minlength=n_units)
        self.unit_null = np.zeros(n_units, dtype=bool)
        self.unit_null[self._pair_unit[~valued]] = True
        self._row_order = None

    def unit_sets(self) -> list[frozenset]:
        """Per individual, the set of its non-null values (shared frozensets: read, never changed)."""
        valued = self._pair_code >= 0
        single = np.full(len(self.uids), -1, dtype=np.int64)
        single[self._pair_unit[valued]] = self._pair_code[valued]
        vl = self.value_list
        sets = [frozenset((v,)) for v in vl] + [frozenset()]       # code -1 (no value) reads the last one
        out = list(map(sets.__getitem__, single.tolist()))
        for ui in np.flatnonzero(self.n_values > 1).tolist():     # rare: suppressed in phase 1
            out[ui] = frozenset(vl[c] for c in self._pair_code[valued & (self._pair_unit == ui)].tolist())
        return out

    def rows_of(self, ui: int) -> list[int]:
        return np.flatnonzero(self.unit_of_row == ui).tolist()

    def rows_of_units(self, members) -> np.ndarray:
        """The rows of the given individuals, ascending."""
        mask = np.zeros(len(self.uids), dtype=bool)
        mask[members] = True
        return np.flatnonzero(mask[self.unit_of_row])

    def pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(local id of each row's (individual, value) pair, numbered in order of first appearance in ``rows``;
        the value code of each pair, -1 for null)."""
        keys = self.unit_of_row[rows] * self._base + (self.code[rows] + 1)
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
        pair_code = np.empty(len(uniq), dtype=np.int64)
        pair_code[rank] = uniq % self._base - 1
        return rank[inverse.reshape(-1)], pair_code

    def columns_for(self, sig) -> np.ndarray:
        """Value code -> column of ``sig`` (-1: not in it; the last entry, read by the null code -1, is -1)."""
        out = np.full(len(self.value_list) + 1, -1, dtype=np.int64)
        for i, v in enumerate(sig):
            code = self.code_of.get(v)
            if code is not None and code >= 0:
                out[code] = i
        return out

    def class_counts(self, rows: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, int]:
        """(distinct individuals per column of a class's rows, individuals with a null value); ``columns`` maps a
        value code (and -1 for null, the last entry) to its column, -1 for a value outside them."""
        keys = np.unique(self.unit_of_row[rows] * self._base + (self.code[rows] + 1))
        codes = keys % self._base - 1
        nulls = int(np.count_nonzero(codes < 0))
        cols = columns[codes[codes >= 0]]
        if (cols < 0).any():
            raise RuntimeError("a class's value is outside its columns")
        return cols, nulls


# ------------------------------------------------------------------------------------------ the former
