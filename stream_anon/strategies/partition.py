"""Top-down median partitioning with a pluggable acceptance rule.

The split rule of Mondrian (LeFevre et al., ICDE 2006; :mod:`stream_anon.strategies.mondrian`) with the
"both halves have k individuals" test replaced by any predicate on a candidate part. The seed 002 (bucket
l-diversity) and seed 003 (severity-sized, AS_e <= l_e) strategies use it. A split is kept only when both
halves are accepted, so every part returned is accepted when the whole input is; if the whole input is not
accepted, nothing is returned (the rows stay unassigned).

>>> import numpy as np
>>> keys = np.array([[0.], [1.], [2.], [3.]])
>>> [p.tolist() for p in median_partition(keys, lambda idx: len(idx) >= 2)]
[[0, 1], [2, 3]]
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def distinct_units(units: np.ndarray) -> int:
    """How many distinct individuals ``units`` holds (k counts individuals, not records)."""
    if len(units) < 2:
        return len(units)
    s = np.sort(units)
    return int(np.count_nonzero(s[1:] != s[:-1])) + 1


def split_recursively(root: np.ndarray, cut: Callable[[np.ndarray], np.ndarray | None]) -> list[np.ndarray]:
    """Depth-first top-down splitting shared by every Mondrian-style former: ``cut(idx)`` returns the boolean mask
    of the left part of ``idx``, or None to keep ``idx`` as a leaf. Leaves come left part first (the order the
    callers' class ids and seeded choices depend on)."""
    out, stack = [], [root]
    while stack:
        idx = stack.pop()
        left = cut(idx)
        if left is None:
            out.append(idx)
        else:
            stack += [idx[~left], idx[left]]
    return out


def median_left(col: np.ndarray) -> np.ndarray:
    """Mondrian's strict cut of one column: values below the median, or up to it when none is below."""
    median = np.partition(col, len(col) // 2)[len(col) // 2]
    left = col < median
    return left if left.any() else col <= median


def median_partition(keys: np.ndarray, accept: Callable[[np.ndarray], bool], width: np.ndarray | None = None,
                     dims: list[int] | None = None, relaxed: bool = False) -> list[np.ndarray]:
    """Parts (row-index arrays, in row order of their first member) of ``keys`` (n, D).

    A part is split at the median of its widest dimension (span / ``width``), trying the next widest when the
    halves are not both accepted; ``dims`` restricts the split dimensions (seed 002 splits on duration only).
    ``relaxed``: cut the part's rows sorted by the dimension (ties by row order) in two equal halves, so equal
    values may land on both sides (LeFevre et al.'s relaxed partitioning); strict: values below the median
    against the rest.
    """
    n = len(keys)
    if n == 0:
        return []
    root = np.arange(n)
    if not accept(root):
        return []
    keys = np.asarray(keys, dtype=float)
    if width is None:
        width = np.nanmax(keys, axis=0) - np.nanmin(keys, axis=0) if n else np.ones(keys.shape[1])
    width = np.where(np.asarray(width) > 0, width, 1.0)
    candidates = np.array(dims if dims is not None else range(keys.shape[1]))

    def cut(idx):
        sub = keys[idx][:, candidates]
        span = (sub.max(axis=0) - sub.min(axis=0)) / width[candidates]
        for j in np.argsort(-span, kind="stable"):
            if span[j] <= 0:
                break
            col = sub[:, j]
            if relaxed:
                left = np.zeros(len(col), bool)
                left[np.argsort(col, kind="stable")[: len(col) // 2]] = True
            else:
                left = median_left(col)
            if left.all() or not left.any():
                continue
            if accept(idx[left]) and accept(idx[~left]):
                return left
        return None

    out = split_recursively(root, cut)
    return sorted(out, key=lambda p: p[0])


def frame_keys(attrs) -> np.ndarray:
    """(n, D) ordering keys of :class:`~stream_anon.strategies.tabular.Attribute` objects, a missing numeric
    value placed one unit below the column's smallest value."""
    cols = []
    for a in attrs:
        k = a.order_key().astype(float)
        finite = np.isfinite(k)
        if not finite.all():
            k = np.where(finite, k, (k[finite].min() - 1.0) if finite.any() else 0.0)
        cols.append(k)
    return np.stack(cols, axis=1) if cols else np.zeros((0, 0))
