"""COUNT-query relative error (seed 002: Hasan, Jiang & Li, Future Internet 2017, Sec. 5; after Xiao & Tao's
and Li et al.'s evaluation protocol).

A query selects, per chosen QI, a set of leaf values (tree attribute) or a range (numeric attribute). The true
answer counts matching original records; the estimate sums, over released records, the product over the
queried attributes of the share of the released value that matches (uniformity assumption: the share of
leaves under a node, or the overlap of a released interval). Relative error |est - true| / max(true, 1).

These random queries follow the paper's protocol on a whole-table release (``stream-anon evaluate``'s
``count_query_error``). The questions an analyst of a stream asks (area x hour, station x hour, product x day, per
release) are :mod:`stream_anon.evaluate.workload`: the same uniform-spread estimate on the published boxes.

>>> import pandas as pd
>>> orig = pd.DataFrame({"n": [1, 2, 3, 4]})
>>> rel = pd.DataFrame({"n": [(1, 2), (1, 2), (3, 4), (3, 4)]})
>>> r = AnonymizedTable(orig, rel, ["n"], bounds={"n": (1, 4)})
>>> round(count_query_error(r, [{"n": (0.5, 1.2)}]), 3)   # true 1, estimate 2 * 0.2
0.6
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from stream_anon.metrics.base import AnonymizedTable, interval


def _match_share(r: AnonymizedTable, attr, value, cond) -> float:
    h = r.hierarchies.get(attr)
    if h is not None:
        first, last = h.node_range(str(value))
        leaves = h.leaves[first:last + 1]
        return sum(1 for leaf in leaves if leaf in cond) / len(leaves)
    lo, hi = interval(value)
    qlo, qhi = cond
    if hi == lo:
        return 1.0 if qlo <= lo <= qhi else 0.0
    return max(0.0, min(hi, qhi) - max(lo, qlo)) / (hi - lo)


def count_query_error(r: AnonymizedTable, queries: list[dict]) -> float:
    """Mean relative error of COUNT queries (each a dict attr -> set of leaves | (lo, hi)).

    Vectorized per attribute: the matching share is computed once per distinct released value."""
    kept = r.released[r.kept]
    factorized: dict = {}       # attribute -> (code per kept record, distinct released values)
    errors = []
    for q in queries:
        true = np.ones(r.n_records, bool)
        est = np.ones(len(kept))
        for a, c in q.items():
            true &= _true_matches(r, a, r.original[a], c)
            if a not in factorized:
                codes, uniques = pd.factorize(pd.Series([_key(v) for v in kept[a]], dtype=object))
                factorized[a] = (codes, list(uniques))
            codes, uniques = factorized[a]
            shares = np.array([_match_share(r, a, v, c) for v in uniques] + [0.0])
            est *= shares[codes]      # code -1 (a missing value) picks the trailing 0
        n_true = int(true.sum())
        errors.append(abs(float(est.sum()) - n_true) / max(n_true, 1))
    return float(np.mean(errors)) if errors else 0.0


def _key(v):
    return frozenset(v) if isinstance(v, (set, list)) else v


def _true_matches(r: AnonymizedTable, attr, column, cond) -> np.ndarray:
    if attr in r.hierarchies:
        return column.astype(str).isin(cond).to_numpy()
    x = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    return (cond[0] <= x) & (x <= cond[1])


def random_count_queries(r: AnonymizedTable, n: int, dims: int, selectivity: float, rng: np.random.Generator
                         ) -> list[dict]:
    """n random queries over ``dims`` QIs; each condition keeps about ``selectivity ** (1/dims)`` of its
    attribute's domain (a random contiguous block of leaves, or a random sub-range)."""
    per_attr = selectivity ** (1.0 / dims)
    out = []
    for _ in range(n):
        q: dict[str, set[str] | tuple[float, float]] = {}      # attr -> leaves, or (lo, hi)
        for a in rng.choice(r.qis, size=dims, replace=False):
            h = r.hierarchies.get(a)
            if h is not None:
                n_leaves = max(1, round(per_attr * h.n_leaves))
                first = int(rng.integers(0, h.n_leaves - n_leaves + 1))
                q[a] = set(h.leaves[first:first + n_leaves])
            else:
                L, U = r.bounds[a]
                width = per_attr * (U - L)
                start = float(rng.uniform(L, U - width))
                q[a] = (start, start + width)
        out.append(q)
    return out
