"""Grouping (slicing-style) anonymization of bike-sharing trips (seed 002).

Hasan, Jiang & Li, "An effective grouping method for privacy-preserving bike sharing data publishing",
Future Internet 9(4), 2017 (../shared/papers/002_*.txt), after Slicing (Li, Li, Zhang & Molloy, TKDE 2012):

1. **Attribute grouping**: attributes correlated by the mean-square contingency coefficient
   phi^2(A1, A2) = 1/(min(d1, d2) - 1) sum_ij (f_ij - f_i. f_.j)^2 / (f_i. f_.j) share a column; distance
   1 - phi^2, clustered by k-medoids (PAM). With a dozen attributes at most, the PAM objective is minimized
   exactly by trying every medoid set [ours: exact, deterministic]. A float attribute is first cut into
   ``bins`` equal-width bins [ours; the paper works on value frequencies]; integers and labels are used as is.
2. **Tuple grouping**: Mondrian-style top-down splits **without generalization** into buckets, on
   ``bucket_by`` (the paper: trip duration, by its toy example), using relaxed median cuts (the sorted rows
   halved; ties may straddle), which reproduces the paper's toy buckets.
3. **Column permutation**: in each bucket, every column's values are permuted at random (a multi-attribute
   column moves as one), breaking the links between columns.
4. **Column generalization**: attributes in ``generalize`` are published at a given hierarchy node (the
   paper: Gender -> "Person").
5. **Privacy check** (Slicing's l-diversity): a split is kept only if both buckets pass. For tuple t and
   bucket B, Slicing's p(t, s) = sum_B p(t, B) p(s | t, B) is a convex combination of the p(s | t, B), so
   requiring p(s | t, B) <= 1/l in every bucket (the share of s among the bucket's tuples that agree with t
   on the QI part of the sensitive column) makes every tuple l-diverse [ours: a sufficient check that is
   local to a bucket, so a split can be tested on its own]. That is frequency l-diversity
   (:class:`stream_anon.criteria.FrequencyLDiversity`) of every such group; with ``individual`` (the engine: the
   privacy unit) the shares are counted in individuals, each weighing 1 over its trips [ours]. ``k``
   additionally asks for k distinct individuals per bucket (the stream's requirement: one rider has many trips).

The batch form returns a DataFrame of original values permuted within buckets. The engine adapter
(:class:`Grouping`) forms the same l-diverse buckets over a window, but the engine publishes a bucket as the
members' generalized box, never permuted raw values: permutation keeps every exact value, which the engine's
published-class contract does not allow. Use :func:`grouping_anonymize` for the paper's release. Its parameters
steer the search only: to have the former enforce l on every published class and the audit check it, list
``kind = "frequency_l_diversity"`` (the same test) in ``[[anonymization.criteria]]``.

>>> import pandas as pd
>>> df = pd.DataFrame({"d": [5, 1, 4, 2, 6, 3], "s": list("abcabc")})
>>> res = grouping_anonymize(df, bucket_by=["d"], sensitive=["s"], l=3, columns=[["d"], ["s"]])
>>> [sorted(b.tolist()) for b in res.buckets]      # longer trips (rows 0, 2, 4), shorter trips
[[0, 2, 4], [1, 3, 5]]
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from stream_anon.criteria import Classes, Column, FrequencyLDiversity, KIndividuals
from stream_anon.errors import ConfigError
from stream_anon.strategies.partition import median_partition
from stream_anon.validation import MAX_COUNT, check_bool, check_integer, check_strings, check_text

MAX_EXACT_ATTRIBUTES = 16


def _discrete(col: pd.Series, bins: int) -> pd.Series:
    if pd.api.types.is_float_dtype(col) and col.nunique() > bins:   # continuous values only; codes stay
        return pd.cut(col, bins, labels=False)
    return col.astype(str)


def phi_squared(a: pd.Series, b: pd.Series) -> float:
    """Mean-square contingency coefficient of two discrete columns (Slicing, Sec. 3.1), in [0, 1]."""
    table = pd.crosstab(a, b).to_numpy(dtype=float)
    d = min(table.shape)
    if d < 2:
        return 0.0
    f = table / table.sum()
    expected = f.sum(axis=1, keepdims=True) * f.sum(axis=0, keepdims=True)
    return float(((f - expected) ** 2 / expected).sum() / (d - 1))


def attribute_distances(df: pd.DataFrame, attributes: Sequence[str], bins: int = 10) -> np.ndarray:
    """1 - phi^2 between every pair of attributes."""
    disc = {a: _discrete(df[a], bins) for a in attributes}
    m = len(attributes)
    out = np.zeros((m, m))
    for i, j in itertools.combinations(range(m), 2):
        out[i, j] = out[j, i] = 1.0 - phi_squared(disc[attributes[i]], disc[attributes[j]])
    return out


def k_medoids(distance: np.ndarray, n_clusters: int) -> tuple[np.ndarray, list[int]]:
    """Exact PAM objective minimum (sum of distances to the nearest medoid) over every medoid set; ties go
    to the lexicographically first set. Returns labels (index of the medoid among ``medoids``) and medoids."""
    m = len(distance)
    if not 1 <= n_clusters <= m:
        raise ValueError(f"grouping.n_columns: between 1 and {m} attributes, got {n_clusters}")
    if m > MAX_EXACT_ATTRIBUTES:
        raise ValueError(f"grouping: at most {MAX_EXACT_ATTRIBUTES} attributes for exact k-medoids, got {m}")
    best: list[int] | None = None
    best_cost = np.inf
    for medoids in itertools.combinations(range(m), n_clusters):
        cost = distance[:, medoids].min(axis=1).sum()
        if cost < best_cost - 1e-12:
            best, best_cost = list(medoids), cost
    assert best is not None, "k_medoids: distances must be finite"     # then the first set has a finite cost
    labels = np.argmin(distance[:, best], axis=1)
    labels[best] = np.arange(n_clusters)        # a medoid belongs to its own cluster, even at distance ties
    return labels, best


def group_attributes(df: pd.DataFrame, attributes: Sequence[str], n_columns: int, bins: int = 10
                     ) -> list[list[str]]:
    """Columns (lists of attributes) by k-medoids on 1 - phi^2, in the order of their first attribute."""
    labels, _ = k_medoids(attribute_distances(df, list(attributes), bins), n_columns)
    groups: dict[int, list[str]] = {}
    for a, lab in zip(attributes, labels):
        groups.setdefault(int(lab), []).append(a)
    return list(groups.values())


class DiversityCheck:
    """Per-bucket l-diversity of Slicing (see module doc): frequency l-diversity
    (:class:`~stream_anon.criteria.FrequencyLDiversity`, counted in individuals) of the sensitive column within each
    group of the bucket's tuples that agree on the column's QI part, plus at least ``k`` distinct individuals.
    Without ``units`` every tuple is its own individual (the paper's setting)."""

    def __init__(self, sensitive_codes: np.ndarray, qi_part_codes: np.ndarray | None, l: int, units=None,
                 k: int = 1):
        self.column = Column(np.asarray(sensitive_codes, dtype=np.int64))
        self.q = None if qi_part_codes is None else np.asarray(qi_part_codes)
        self.units = np.arange(len(self.column.codes)) if units is None else np.asarray(units)
        self.k_rule = KIndividuals(k)
        self.l_rule = FrequencyLDiversity("s", l)

    def __call__(self, idx: np.ndarray) -> bool:
        if len(idx) == 0 or not self.k_rule.holds(Classes.single(self.units[idx]))[0]:
            return False
        if self.q is None:
            groups = [idx]
        else:       # the tuples of idx by their QI part: one group per distinct value
            order = idx[np.argsort(self.q[idx], kind="stable")]
            q = self.q[order]
            groups = np.split(order, np.flatnonzero(q[1:] != q[:-1]) + 1)
        return bool(self.l_rule.holds(Classes.of(groups, self.units, {"s": self.column})).all())


def _codes(df: pd.DataFrame, cols: Sequence[str]) -> np.ndarray | None:
    if not cols:
        return None
    key = df[list(cols)].astype(str).agg("\x1f".join, axis=1) if len(cols) > 1 else df[cols[0]].astype(str)
    return pd.factorize(key)[0]


@dataclass
class GroupingResult:
    buckets: list[np.ndarray]          # row positions per bucket
    columns: list[list[str]]           # attribute groups (permuted together)
    released: pd.DataFrame             # permuted values, ``bucket`` column; rows in bucket order
    suppressed: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


def grouping_anonymize(df: pd.DataFrame, bucket_by: Sequence[str], sensitive: Sequence[str], l: int,
                       columns: Sequence[Sequence[str]] | None = None, attributes: Sequence[str] | None = None,
                       n_columns: int | None = None, individual: str | None = None, k: int = 1,
                       generalize: Mapping[str, str] | None = None, bins: int = 10, seed: int = 0
                       ) -> GroupingResult:
    """Seed 002's Grouping on a DataFrame.

    ``bucket_by``: numeric columns the buckets are split on (the paper: trip duration). ``sensitive``: the
    attributes whose values must be l-diverse (the paper: start/end time); they must lie in one column.
    ``columns``: the attribute groups, or ``None`` to compute them from ``attributes`` with ``n_columns``
    k-medoids clusters. ``generalize``: attribute -> published label (e.g. ``{"gender": "Person"}``).
    Rows of ``df`` outside every bucket (the whole table fails the check) are suppressed.
    Returns the buckets and the released table: for each bucket its rows with each column's values permuted
    together (``bucket`` column added; the released index is the source row the *first* column came from).
    """
    if not isinstance(l, int) or l < 1:
        raise ValueError(f"grouping.l: a positive integer, got {l!r}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"grouping.k: a positive integer, got {k!r}")
    if columns is None:
        if attributes is None or n_columns is None:
            raise ValueError("grouping: give columns, or attributes and n_columns for k-medoids")
        columns = group_attributes(df, attributes, n_columns, bins)
    attr_groups = [list(c) for c in columns]
    holding = [c for c in attr_groups if set(sensitive) & set(c)]
    if len(holding) != 1 or not set(sensitive) <= set(holding[0]):
        raise ValueError(f"grouping.sensitive: {list(sensitive)} must all lie in one column of {attr_groups}")
    qi_part = [a for a in holding[0] if a not in sensitive]
    units = pd.factorize(df[individual])[0] if individual else None
    sensitive_codes = _codes(df, sensitive)
    assert sensitive_codes is not None          # sensitive lies in one column (checked above): not empty
    check = DiversityCheck(sensitive_codes, _codes(df, qi_part), l, units, k)
    keys = df[list(bucket_by)].to_numpy(dtype=float)
    buckets = median_partition(keys, check, relaxed=True)
    rng = np.random.default_rng(seed)
    parts = []
    for b, rows in enumerate(buckets):
        piece = {}
        first = None
        for cols in attr_groups:
            perm = rows[rng.permutation(len(rows))]
            first = perm if first is None else first
            for a in cols:
                piece[a] = df[a].to_numpy()[perm]
        out = pd.DataFrame(piece, index=df.index[first])[[a for c in attr_groups for a in c]]
        out["bucket"] = b
        parts.append(out)
    released = pd.concat(parts) if parts else pd.DataFrame(columns=[a for c in attr_groups for a in c] + ["bucket"])
    for a, label in (generalize or {}).items():
        released[a] = label
    placed = np.concatenate(buckets) if buckets else np.empty(0, np.int64)
    return GroupingResult(buckets, attr_groups, released, np.setdiff1d(np.arange(len(df)), placed))


@dataclass(frozen=True)
class GroupingParams:
    """``[anonymization.strategy_params]`` of ``grouping``: ``field`` (a sensitive field, required), ``l``
    (distinct values per bucket), ``split_on`` (QI names whose dimensions are split; default all), ``relaxed``.

    >>> GroupingParams(field="payload.usertype", l=0)
    Traceback (most recent call last):
    ...
    stream_anon.errors.ConfigError: l: must be in [1, 1000000], got 0
    """
    field: str = ""
    l: int = 2
    split_on: Sequence[str] = ()
    relaxed: bool = True

    def __post_init__(self) -> None:
        if self.field == "":
            raise ConfigError("field: the sensitive field to keep l-diverse is required")
        check_text(self.field, "field")
        check_integer(self.l, "l", 1, MAX_COUNT)
        split_on = self.split_on or []
        check_strings(list(split_on) if isinstance(split_on, tuple) else split_on, "split_on")
        check_bool(self.relaxed, "relaxed")
        object.__setattr__(self, "split_on", tuple(split_on))

    def check_config(self, sensitive: tuple[str, ...], qi_names: tuple[str, ...]) -> None:
        if self.field not in sensitive:
            raise ValueError(f"field: {self.field!r} is not listed in sensitive.fields")
        unknown = set(self.split_on) - set(qi_names)
        if unknown:
            raise ValueError(f"split_on: unknown quasi-identifiers {sorted(unknown)}")


class Grouping:
    """Engine adapter: l-diverse buckets over a window (relaxed median splits), each with k individuals.

    Parameters: ``field`` (sensitive field whose values must be l-diverse per bucket), ``l``, ``split_on``
    (QI names whose dimensions are split, default all; the paper splits on trip duration), ``relaxed``.
    The engine publishes each bucket as its generalized box (see the module docstring for why not the
    permuted values).
    """
    name = "grouping"
    uses_sensitive = True
    Params = GroupingParams

    def __init__(self, **params):
        self.params = p = GroupingParams(**params)
        self.field, self.l, self.split_on, self.relaxed = p.field, p.l, list(p.split_on), p.relaxed

    def criteria(self, k: int, sensitive: dict | None = None) -> tuple:
        """What its buckets meet besides k (``stream-anon evaluate`` checks them): frequency l-diversity of the
        field."""
        return (FrequencyLDiversity(self.field, self.l),)

    def form_classes(self, X, units, k, space, rng=None, sensitive=None) -> list[np.ndarray]:
        if sensitive is None or self.field not in sensitive:
            raise ValueError(f"grouping.field: {self.field!r} is not a configured sensitive field")
        codes = Column.encode(sensitive[self.field]).codes
        dims = None
        if self.split_on:
            names = [space.qis[o].name for o in space.owner]
            unknown = set(self.split_on) - set(names)
            if unknown:
                raise ValueError(f"grouping.split_on: unknown quasi-identifiers {sorted(unknown)}")
            dims = [d for d, nm in enumerate(names) if nm in self.split_on]
        check = DiversityCheck(codes, None, self.l, np.asarray(units), k)
        return median_partition(X, check, width=space.width, dims=dims, relaxed=self.relaxed)

