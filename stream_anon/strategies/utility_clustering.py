"""Utility-driven k-anonymization by clustering (seed 000).

Bhati, Maple, Pellicano, Sfar & Wiatrowski, "Utility-driven k-anonymization of public transport user data",
IEEE Access 9, 2021 (../shared/papers/000_*.txt, Algorithm 1):

- **Weights** from utility factors, w_a = U_a / sum U (Sec. III-A): manual integers 1..5, or automatic
  U_a = Shannon entropy of the attribute (numeric values bucketed first).
- **Distances** (Sec. III-B): numeric |v_i - v_j|; tree L_ij - 1 (leaves under the lowest common ancestor);
  graph = shortest path (networkx; edge ``weight`` when present, else hops). Normalized by the **max**
  method (U - L, L^T - 1, Diam(G)) or by **z-score** over all record pairs (Eq. 10-12; computed exactly,
  see :meth:`Attribute.zscore_stats`). Record distance D = sum_a w_a D_a.
- **Classes** (Algorithm 1): a head, **greedy** (a random record, from the seeded rng) or **density** (lowest
  mean distance to its k nearest remaining neighbours, Eq. 21, recomputed as records leave the pool), then
  its nearest neighbours until the class holds k distinct individuals [the paper counts records; counting
  individuals is the stream's requirement and equal when every record is its own individual].
- **C1 limits** (Sec. III-E): per attribute, the largest allowed raw spread of a class (numeric max - min,
  graph max shortest path, e.g. 4 hops; tree L - 1). A candidate class over a limit suppresses its head and
  puts the others back in the pool (Algorithm 1, lines 21-23).
- **Leftovers** (fewer than k individuals in the pool): ``"best_class"`` puts each in the class whose
  distortion Gamma_g^c grows least (Algorithm 1, line 28; "best" is our reading); ``"defer"`` leaves them
  out (the engine keeps them for a later window, where they may find a tighter class).

Choices the paper leaves open [ours]: ties in the neighbour order go to the earlier row; a missing value is
at the maximum distance from any present one; windows larger than ``max_block`` records are first cut by
median splits (each part keeping k individuals) because density needs the block's pairwise distances;
the automatic bucket width of a numeric attribute is its range / 96 (900 s over one day, the paper's choice
for ride start time). Z-score statistics and entropy weights are taken over the records being clustered:
they steer which records are grouped, while the engine's published loss (NCP) keeps fixed domain bounds.

>>> import pandas as pd
>>> df = pd.DataFrame({"x": [0.0, 1.0, 10.0, 11.0]})
>>> res = utility_clustering(df, {"x": (0, 20)}, k=2, normalization="max")
>>> sorted(sorted(c.tolist()) for c in res.classes)
[[0, 1], [2, 3]]
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import networkx as nx
import numpy as np
import pandas as pd

from stream_anon.errors import ConfigError
from stream_anon.metrics.distortion import entropy_factor, utility_weights
from stream_anon.strategies.partition import distinct_units
from stream_anon.strategies.tabular import (Attribute, QISpec, frame_attributes, generalize_classes,
                                            space_attributes)
from stream_anon.validation import MAX_COUNT, check_choice, check_integer, check_number

U_MAX = 5                        # largest manual utility factor (Sec. III-A)
NORMALIZATIONS = ("zscore", "max")
HEADS = ("density", "greedy")
LEFTOVERS = ("best_class", "defer")
ENTROPY_BUCKETS = 96             # automatic factor: numeric range / 96 per bucket (900 s over a day)


def _validate(prefix: str, factors, normalization, head, leftovers, max_block, limits, graphs=None):
    """The parameters of Algorithm 1; ``prefix`` starts every key (``"utility-clustering."`` for the function's
    arguments, ``""`` for :class:`UtilityClusteringParams`, whose keys the configuration loader prefixes)."""
    check_choice(normalization, f"{prefix}normalization", NORMALIZATIONS)
    check_choice(head, f"{prefix}head", HEADS)
    check_choice(leftovers, f"{prefix}leftovers", LEFTOVERS)
    check_integer(max_block, f"{prefix}max_block", 2, MAX_COUNT)
    for key, table in (("factors", factors if factors != "entropy" else None), ("limits", limits),
                       ("graphs", graphs)):
        if table is not None and not isinstance(table, Mapping):
            raise ConfigError(f"{prefix}{key}: expected a table quasi-identifier -> value"
                              f"{' (or entropy)' if key == 'factors' else ''}, got {table!r}")
    for name, u in (factors if isinstance(factors, Mapping) else {}).items():
        check_integer(u, f"{prefix}factors.{name}", 1, U_MAX)
    for name, v in (limits or {}).items():
        check_number(v, f"{prefix}limits.{name}", at_least=0)


def attribute_weights(attrs: list[Attribute], factors, owner_names: list[str] | None = None) -> np.ndarray:
    """w per attribute from utility factors: ``None`` (all 1), a mapping name -> 1..5 (missing names get 1),
    or ``"entropy"``. ``owner_names`` maps attributes to the configured QI (a geopoint's two axes share its
    factor, each taking half)."""
    names = owner_names or [a.name for a in attrs]
    share = pd.Series(names).map(pd.Series(names).value_counts()).to_numpy(dtype=float)
    if factors == "entropy":
        u = []
        for a in attrs:
            if a.kind == "numeric":
                x = a.numbers()
                x = x[~np.isnan(x)]
                rng = float(x.max() - x.min()) if len(x) else 0.0
                u.append(entropy_factor(x, bucket=rng / ENTROPY_BUCKETS) if rng > 0 else 0.0)
            else:
                u.append(entropy_factor(a.codes))
        u = np.array(u) / share
        if u.sum() <= 0:           # every attribute constant: any weighting gives the same classes
            u = np.ones(len(attrs)) / share
    else:
        u = np.array([float((factors or {}).get(n, 1)) for n in names]) / share
    return np.array(utility_weights(list(u)))


@dataclass
class ClusteringResult:
    classes: list[np.ndarray]           # row positions per class
    suppressed: np.ndarray              # row positions suppressed (C1) or left over
    weights: dict[str, float]
    released: pd.DataFrame | None = None
    qis: Mapping = field(default_factory=dict)

    def release(self, original: pd.DataFrame, sensitive: str | None = None, individual: str | None = None):
        """The :class:`stream_anon.metrics.AnonymizedTable` of this result, for the metrics."""
        from stream_anon.hierarchy import Hierarchy
        from stream_anon.metrics import AnonymizedTable

        hier = {q: s for q, s in self.qis.items() if isinstance(s, Hierarchy)}
        graphs = {q: s for q, s in self.qis.items() if isinstance(s, nx.Graph)}
        bounds = {q: tuple(s) for q, s in self.qis.items() if isinstance(s, tuple)}
        mask = np.zeros(len(original), bool)
        mask[self.suppressed] = True
        return AnonymizedTable(original, self.released, list(self.qis), sensitive=sensitive, individual=individual,
                       class_col="class_id", suppressed=mask, hierarchies=hier, graphs=graphs, bounds=bounds)


class _Normalized:
    """Weighted, normalized record distances over a set of attributes."""

    def __init__(self, attrs: list[Attribute], weights: np.ndarray, normalization: str, rows: np.ndarray):
        self.attrs, self.weights = attrs, weights
        if normalization == "max":
            self.shift = [0.0] * len(attrs)
            self.scale = [a.max_distance or 1.0 for a in attrs]
        else:
            stats = [a.zscore_stats() for a in attrs]
            self.shift = [m for m, _ in stats]
            self.scale = [s for _, s in stats]

    def pairwise(self, rows: np.ndarray) -> np.ndarray:
        D = np.zeros((len(rows), len(rows)))
        for a, w, m, s in zip(self.attrs, self.weights, self.shift, self.scale):
            if w:
                D += w * (a.pairwise(rows) - m) / s
        return D

    def class_distortion(self, rows: np.ndarray) -> float:
        """Gamma_g^c = |c| sum_a w_a spread_a(c) / max_a (Eq. 15, max-normalized whatever the distance)."""
        return len(rows) * sum(w * a.spread(rows) / (a.max_distance or 1.0)
                               for a, w in zip(self.attrs, self.weights))


def _split_blocks(attrs: list[Attribute], units: np.ndarray, k: int, max_block: int) -> list[np.ndarray]:
    """Median splits on the widest attribute until every part has at most ``max_block`` records (each part
    keeps k individuals; a part that cannot be split stays larger)."""
    keys = [a.order_key() for a in attrs]
    out, stack = [], [np.arange(len(units))]
    while stack:
        idx = stack.pop()
        if len(idx) <= max_block:
            out.append(idx)
            continue
        spans = []
        for a, key in zip(attrs, keys):
            v = key[idx]
            v = v[np.isfinite(v)]
            spans.append((v.max() - v.min()) / (a.max_distance or 1.0) if len(v) else 0.0)
        done = False
        for j in np.argsort(-np.array(spans), kind="stable"):
            v = keys[j][idx]
            med = np.median(v)
            left = v < med
            if not left.any() or left.all():
                left = v <= med
            if left.all() or not left.any():
                continue
            if distinct_units(units[idx[left]]) >= k and distinct_units(units[idx[~left]]) >= k:
                stack += [idx[~left], idx[left]]
                done = True
                break
        if not done:
            out.append(idx)
    return sorted(out, key=lambda b: b[0])


def _cluster_block(rows, dist: _Normalized, attrs, units, k, head, limits, rng):
    """Algorithm 1 on one block (row positions ``rows``): classes and suppressed heads."""
    m = len(rows)
    D = dist.pairwise(rows)
    uu = units[rows]
    alive = np.ones(m, bool)
    classes, suppressed = [], []
    limit_attrs = [(a, limits[a.name]) for a in attrs if a.name in limits]
    knn: np.ndarray | None = None           # each alive row's kk nearest alive rows, and their mean distance
    score: np.ndarray | None = None
    kk = 0
    while True:
        rem = np.flatnonzero(alive)
        if len(rem) == 0 or distinct_units(uu[rem]) < k:
            break
        if head == "greedy":
            h = int(rem[rng.integers(len(rem))]) if rng is not None else int(rem[0])
        else:
            want = min(k, len(rem) - 1)
            if want == 0:
                h = int(rem[0])
            else:
                if knn is None or want != kk:
                    kk, stale = want, rem
                    knn, score = np.zeros((m, kk), np.int64), np.full(m, np.inf)
                else:
                    assert score is not None        # set with knn
                    stale = rem[(~alive[knn[rem]]).any(axis=1)]
                if len(stale):
                    sub = D[np.ix_(stale, rem)]
                    sub[stale[:, None] == rem[None, :]] = np.inf
                    part = np.argpartition(sub, kk - 1, axis=1)[:, :kk]
                    knn[stale] = rem[part]
                    score[stale] = np.take_along_axis(sub, part, axis=1).mean(axis=1)
                h = int(rem[np.argmin(score[rem])])
        others = rem[rem != h]
        order = np.concatenate([[h], others[np.argsort(D[h, others], kind="stable")]])
        u = uu[order]
        _, first = np.unique(u, return_index=True)
        is_first = np.zeros(len(u), bool)
        is_first[first] = True
        cut = int(np.searchsorted(np.cumsum(is_first), k)) + 1
        members = order[:cut]
        if any(a.spread(rows[members]) > lim for a, lim in limit_attrs):
            suppressed.append(h)
            alive[h] = False
            continue
        classes.append(members)
        alive[members] = False
    return classes, suppressed, np.flatnonzero(alive)


def cluster(attrs: list[Attribute], units: np.ndarray, k: int, weights: np.ndarray, normalization="zscore",
            head="density", limits: Mapping[str, float] | None = None, leftovers="best_class",
            rng: np.random.Generator | None = None, max_block: int = 1000):
    """Algorithm 1 over attributes; returns (classes, suppressed, left over) as row positions."""
    limits = dict(limits or {})
    n = len(units)
    all_rows = np.arange(n)
    dist = _Normalized(attrs, weights, normalization, all_rows)
    classes, suppressed, leftover = [], [], []
    if n == 0 or distinct_units(units) < k:          # Algorithm 1, line 36: |T| < k
        return [], np.empty(0, np.int64), all_rows
    for block in _split_blocks(attrs, units, k, max_block):
        c, s, rest = _cluster_block(block, dist, attrs, units, k, head, limits, rng)
        classes += [block[x] for x in c]
        suppressed += [int(block[x]) for x in s]
        leftover += [int(block[x]) for x in rest]
    left = np.array(leftover, dtype=np.int64)
    if leftovers == "best_class" and classes and len(left):
        base = [dist.class_distortion(c) for c in classes]
        for r in left:
            grow = [dist.class_distortion(np.append(c, r)) - b for c, b in zip(classes, base)]
            j = int(np.argmin(grow))
            classes[j] = np.append(classes[j], r)
            base[j] += grow[j]
        left = np.empty(0, np.int64)
    return classes, np.array(sorted(suppressed), dtype=np.int64), left


def utility_clustering(df: pd.DataFrame, qis: Mapping[str, QISpec], k: int, individual: str | None = None,
                       factors: Mapping[str, int] | str | None = None, normalization: str = "zscore",
                       head: str = "density", limits: Mapping[str, float] | None = None,
                       leftovers: str = "best_class", seed: int = 0, max_block: int = 1000) -> ClusteringResult:
    """Seed 000's Algorithm 1 on a DataFrame.

    ``qis``: column -> Hierarchy (tree), networkx graph (stations) or (L, U) / None (numeric).
    ``individual``: count k in distinct values of this column (default: every row is its own individual).
    ``factors``: utility factors (column -> 1..5), ``"entropy"`` or ``None`` (equal weights).
    ``limits``: C1 per column, in the column's raw distance unit (seconds, hops, leaves - 1).
    Returns classes and suppressed rows (positions) and the released table (class generalizations, local
    recoding; suppressed rows all-None).
    """
    check_integer(k, "utility-clustering.k", 1, MAX_COUNT)
    _validate("utility-clustering.", factors, normalization, head, leftovers, max_block, limits)
    attrs = frame_attributes(df, qis)
    units = (pd.factorize(df[individual])[0] if individual else np.arange(len(df))).astype(np.int64)
    weights = attribute_weights(attrs, factors)
    classes, suppressed, left = cluster(attrs, units, k, weights, normalization, head, limits, leftovers,
                                        np.random.default_rng(seed), max_block)
    out = np.sort(np.concatenate([suppressed, left])).astype(np.int64)
    released = generalize_classes(df, classes, qis)
    return ClusteringResult(classes, out, {a.name: float(w) for a, w in zip(attrs, weights)}, released, dict(qis))


def load_station_graph(path: str | Path) -> nx.Graph:
    """A station graph from a CSV edge list with columns ``source,target[,weight]`` (undirected)."""
    g = nx.Graph()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            w = row.get("weight")
            g.add_edge(row["source"], row["target"], **({"weight": float(w)} if w not in (None, "") else {}))
    return g


@dataclass(frozen=True)
class UtilityClusteringParams:
    """``[anonymization.strategy_params]`` of ``utility-clustering`` (see the class docstring for each)."""
    factors: Mapping[str, int] | str | None = None
    normalization: str = "zscore"
    head: str = "density"
    limits: Mapping[str, float] | None = None
    leftovers: str = "defer"
    graphs: Mapping[str, object] | None = None
    max_block: int = 1000

    def __post_init__(self) -> None:
        _validate("", self.factors, self.normalization, self.head, self.leftovers, self.max_block, self.limits,
                  self.graphs)

    def check_config(self, sensitive: tuple[str, ...], qi_names: tuple[str, ...]) -> None:
        for key in ("factors", "limits", "graphs"):
            table = getattr(self, key)
            unknown = set(table) - set(qi_names) if isinstance(table, Mapping) else set()
            if unknown:
                raise ValueError(f"{key}: unknown quasi-identifiers {sorted(unknown)}")


class UtilityClustering:
    """Engine adapter of seed 000 over a window's buffer (one attribute per QI-space dimension).

    Parameters (``[anonymization] strategy_params``): ``factors`` (QI name -> 1..5, or ``"entropy"``),
    ``normalization`` (``"zscore"`` | ``"max"``), ``head`` (``"density"`` | ``"greedy"``), ``limits`` (QI name ->
    largest class spread in raw units: seconds for timestamps, hops for graph stations, leaves - 1 for trees),
    ``leftovers`` (``"defer"`` default here: the engine keeps them for the next window | ``"best_class"``),
    ``graphs`` (station QI name -> CSV edge list, ``source,target[,weight]`` over the hierarchy's leaves),
    ``max_block``. A suppressed head stays deferred; the engine suppresses it at its deadline unless an
    earlier class covers it.
    """
    name = "utility-clustering"
    uses_sensitive = False
    Params = UtilityClusteringParams

    def __init__(self, **params):
        self.params = p = UtilityClusteringParams(**params)
        self.factors, self.normalization, self.head = p.factors, p.normalization, p.head
        self.limits, self.leftovers, self.max_block = dict(p.limits or {}), p.leftovers, p.max_block
        self.graphs = {}
        for name, g in (p.graphs or {}).items():
            if isinstance(g, nx.Graph):
                self.graphs[name] = g
            elif not Path(g).exists():
                raise ValueError(f"utility-clustering.graphs.{name}: file not found: {g}")
            else:
                self.graphs[name] = load_station_graph(g)

    def form_classes(self, X, units, k, space, rng=None) -> list[np.ndarray]:
        if len(X) == 0 or distinct_units(units) < k:
            return []
        attrs = space_attributes(X, space, self.graphs)
        owners = [space.qis[o].name for o in space.owner] if hasattr(space, "qis") else None
        weights = attribute_weights(attrs, self.factors, owners)
        limits = {a.name: self.limits[a.name] for a in attrs if a.name in self.limits}
        classes, _, _ = cluster(attrs, np.asarray(units), k, weights, self.normalization, self.head, limits,
                                self.leftovers, rng, self.max_block)
        return classes
