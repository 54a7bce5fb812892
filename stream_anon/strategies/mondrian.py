"""Strict multidimensional Mondrian, counting distinct individuals.

LeFevre, DeWitt & Ramakrishnan, "Mondrian Multidimensional K-Anonymity", ICDE 2006. A partition is split at
the median of its widest normalized dimension when both halves keep records of at least k distinct individuals
(not k records: one person's many events must not fill a class, the CASTLE lesson); otherwise the next widest
dimension is tried, and a partition no dimension can split becomes a class. Categorical dimensions are split
on depth-first leaf codes, so each half stays a contiguous leaf range (a relaxed split on the hierarchy order).

This is the engine's default: over a window's buffer it places every record whenever the buffer holds at least
k individuals, and it is the offline reference the streaming loss is compared against.

>>> import numpy as np
>>> X = np.array([[0.], [1.], [2.], [3.], [10.], [11.]])
>>> units = np.array([1, 2, 3, 4, 5, 6])
>>> class Space: width = np.array([11.])
>>> sorted(sorted(c.tolist()) for c in Mondrian().form_classes(X, units, 3, Space(), None))
[[0, 1, 2], [3, 4, 5]]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_anon.strategies.partition import distinct_units, median_left, split_recursively


@dataclass(frozen=True)
class MondrianParams:
    """Strict Mondrian takes no parameters."""

    def check_config(self, sensitive: tuple[str, ...], qi_names: tuple[str, ...]) -> None:
        pass


class Mondrian:
    name = "mondrian"
    uses_sensitive = False
    Params = MondrianParams

    def __init__(self, **params):
        self.params = MondrianParams(**params)

    def form_classes(self, X, units, k, space, rng=None) -> list[np.ndarray]:
        n = len(X)
        if n == 0 or distinct_units(units) < k:
            return []
        width = np.where(space.width > 0, space.width, 1.0)

        def cut(idx):
            u = units[idx]
            if len(idx) < 2 * k:
                return None
            n_distinct = distinct_units(u)
            if n_distinct < 2 * k:
                return None
            all_distinct = n_distinct == len(idx)
            sub = X[idx]
            span = (sub.max(axis=0) - sub.min(axis=0)) / width
            for dim in np.argsort(-span, kind="stable"):
                if span[dim] <= 0:
                    break
                left = median_left(sub[:, dim])
                n_left = int(np.count_nonzero(left))
                if n_left == len(idx):
                    continue
                if all_distinct:
                    ok = n_left >= k and len(idx) - n_left >= k
                else:
                    ok = distinct_units(u[left]) >= k and distinct_units(u[~left]) >= k
                if ok:
                    return left
            return None

        return split_recursively(np.arange(n), cut)
