"""Shared pieces of the batch (DataFrame) forms of the strategies: attribute kinds, per-attribute distances,
and the generalization of a table by classes into the :class:`stream_anon.metrics.AnonymizedTable` format.

A quasi-identifier is described by what it is generalized with:
- a :class:`~stream_anon.hierarchy.Hierarchy` (categorical, tree): published as the lowest common ancestor;
- a ``networkx`` graph (stations, seed 000): published as the set of its members' stations;
- ``(L, U)`` bounds or ``None`` (numeric): published as ``(min, max)`` of the members (a number when equal).

The engine adapters describe each dimension of a :class:`~stream_anon.engine.space.QISpace` the same way
(:func:`space_attributes`), so one distance implementation serves the stream and the batch forms.

>>> import pandas as pd
>>> from stream_anon.hierarchy import Hierarchy
>>> df = pd.DataFrame({"g": ["a", "b", "a"], "x": [1.0, 3.0, 2.0]})
>>> rel = generalize_classes(df, [np.array([0, 1])], {"g": Hierarchy.flat(["a", "b"]), "x": None})
>>> rel.loc[0, "g"], rel.loc[0, "x"], rel.loc[2, "g"] is None
('*', (1.0, 3.0), True)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, TypeAlias

import networkx as nx
import numpy as np
import pandas as pd

from stream_anon.hierarchy import Hierarchy

MISSING = -1      # code of a missing value in a tree/graph attribute
# what a quasi-identifier is generalized with (module docstring); networkx is untyped, so a graph is Any to mypy
QISpec: TypeAlias = "Hierarchy | nx.Graph | tuple[float, float] | None"


@dataclass
class Attribute:
    """One quasi-identifier over n records, with the raw (non-normalized) distances of seed 000, Sec. III-B.

    Numeric: ``x`` holds the values and D^N = |x_i - x_j|. Tree and graph: ``codes`` index ``values`` (distinct
    values, ``MISSING`` for a missing value) and ``matrix`` holds D^T = L_ij - 1 (leaves under the lowest
    common ancestor, minus one) or D^G = shortest path between them. ``max_distance`` is the normalizer of
    the max method: U - L, L^T - 1 or Diam(G). A missing value is at ``max_distance`` from any present one.
    """
    name: str
    kind: str                           # "numeric" | "tree" | "graph"
    max_distance: float
    x: np.ndarray | None = None
    codes: np.ndarray | None = None
    values: list | None = None
    matrix: np.ndarray | None = None
    hierarchy: Hierarchy | None = None
    graph: object = None

    def numbers(self) -> np.ndarray:
        """``x`` of a numeric attribute (its constructors always set it)."""
        assert self.x is not None, f"{self.name}: a numeric attribute without values"
        return self.x

    def coded(self) -> tuple[np.ndarray, np.ndarray]:
        """``(codes, matrix)`` of a tree or graph attribute (its constructors always set both, and ``values``)."""
        assert self.codes is not None and self.matrix is not None, f"{self.name}: a coded attribute without codes"
        return self.codes, self.matrix

    def distances_to(self, rows: np.ndarray, j: int) -> np.ndarray:
        """Raw distance from record j to each record in ``rows``."""
        if self.kind == "numeric":
            x = self.numbers()
            d = np.abs(x[rows] - x[j])
            return np.where(np.isnan(d), np.where(np.isnan(x[rows]) & np.isnan(x[j]), 0.0,
                                                  self.max_distance), d)
        codes, matrix = self.coded()
        return matrix[codes[rows], codes[j]]

    def pairwise(self, rows: np.ndarray) -> np.ndarray:
        if self.kind == "numeric":
            x = self.numbers()[rows]
            d = np.abs(x[:, None] - x[None, :])
            nan = np.isnan(d)
            if nan.any():
                both = np.isnan(x)[:, None] & np.isnan(x)[None, :]
                d = np.where(nan, np.where(both, 0.0, self.max_distance), d)
            return d
        codes, matrix = self.coded()
        c = codes[rows]
        return matrix[np.ix_(c, c)]

    def spread(self, rows: np.ndarray) -> float:
        """Raw generalization size of a class: max - min, or the largest pairwise distance of its values."""
        if self.kind == "numeric":
            x = self.numbers()[rows]
            if np.isnan(x).any():
                return self.max_distance if not np.isnan(x).all() else 0.0
            return float(x.max() - x.min())
        codes, matrix = self.coded()
        c = np.unique(codes[rows])
        return float(matrix[np.ix_(c, c)].max()) if len(c) > 1 else 0.0

    def order_key(self) -> np.ndarray:
        """A one-dimensional ordering of the records for median splits: the value, the leaf code, or the
        distance from the first station seen."""
        if self.kind == "numeric":
            x = self.numbers()
            return np.where(np.isnan(x), -np.inf, x)
        codes, matrix = self.coded()
        if self.kind == "tree":      # codes index the sorted leaf codes present: hierarchy order
            return codes.astype(float)
        return matrix[codes, 0]

    def zscore_stats(self) -> tuple[float, float]:
        """Mean and standard deviation of D over all ordered record pairs (seed 000, Eq. 10-12), exact.

        Numeric: E|X - Y| from the sorted values (Gini mean difference) and E(X - Y)^2 = 2 Var X, so no
        O(n^2) pass. Tree/graph: frequency-weighted over the distinct values, p^T D p and p^T D^2 p."""
        if self.kind == "numeric":
            x = self.numbers()
            x = np.sort(x[~np.isnan(x)])
            n = len(x)
            if n < 2:
                return 0.0, 1.0
            mean = float(2.0 * np.sum((2 * np.arange(1, n + 1) - n - 1) * x) / (n * n))
            second = 2.0 * float(x.var())
        else:
            codes, matrix = self.coded()
            assert self.values is not None, f"{self.name}: a coded attribute without values"
            counts = np.bincount(codes, minlength=len(self.values)).astype(float)
            p = counts / counts.sum()
            mean = float(p @ matrix @ p)
            second = float(p @ (matrix ** 2) @ p)
        std = float(np.sqrt(max(second - mean * mean, 0.0)))
        return mean, (std if std > 0 else 1.0)


def row_groups(values: np.ndarray, radices) -> np.ndarray:
    """Dense group id per row of the (n, D) non-negative int ``values`` (column d below ``radices[d]``),
    numbered in lexicographic order of the rows, as ``np.unique(values, axis=0, return_inverse=True)``.

    One int64 key per row in mixed radix, re-numbered densely before it could overflow: a 1-D sort instead
    of ``np.unique(axis=0)``'s row sort, which dominated the lattice and search strategies' run time.

    >>> row_groups(np.array([[1, 0], [0, 2], [1, 0]]), [2, 3]).tolist()
    [1, 0, 1]
    """
    key = np.zeros(len(values), np.int64)
    bound = 1
    for d, radix in enumerate(radices):
        radix = int(radix)
        if bound * radix >= 2 ** 62:
            key = np.unique(key, return_inverse=True)[1].ravel()
            bound = int(key.max()) + 1 if len(key) else 1
        key = key * radix + values[:, d]
        bound *= radix
    return np.unique(key, return_inverse=True)[1].ravel()


def tree_matrix(h: Hierarchy, leaf_codes: np.ndarray) -> np.ndarray:
    """D^T between leaves (by leaf code): leaves under their lowest common ancestor minus one."""
    u = len(leaf_codes)
    m = np.zeros((u, u))
    for a in range(u):
        for b in range(a + 1, u):
            lo, hi = sorted((int(leaf_codes[a]), int(leaf_codes[b])))
            nlo, nhi, _ = h.generalize(lo, hi)
            m[a, b] = m[b, a] = nhi - nlo
    return m


_DIAMETER: dict[int, float] = {}


def graph_diameter(graph) -> float:
    """Diam(G) over the whole graph (weighted by ``weight`` when edges carry one): fixed by the graph, not by
    the data, so the max normalization does not drift between windows."""
    key = id(graph)
    if key not in _DIAMETER:
        g = graph.to_undirected() if graph.is_directed() else graph
        lengths = dict(nx.all_pairs_dijkstra_path_length(g, weight="weight"))
        _DIAMETER[key] = float(max(max(d.values()) for d in lengths.values()))
    return _DIAMETER[key]


def graph_matrix(graph, values: list) -> np.ndarray:
    """D^G between stations: shortest path (networkx Dijkstra on ``weight``, hops when edges have none)."""
    u = len(values)
    m = np.zeros((u, u))
    index = {v: i for i, v in enumerate(values)}
    for a, v in enumerate(values):
        lengths = nx.single_source_dijkstra_path_length(graph, v, weight="weight")
        for w, d in lengths.items():
            b = index.get(w)
            if b is not None:
                m[a, b] = d
    return m


def _with_missing(codes: np.ndarray, m: np.ndarray, max_distance: float) -> tuple[np.ndarray, np.ndarray]:
    """Append a 'missing' value: at max distance from every present value, 0 from itself."""
    if not (codes == MISSING).any():
        return codes, m
    u = len(m)
    out = np.full((u + 1, u + 1), max_distance)
    out[:u, :u] = m
    out[u, u] = 0.0
    return np.where(codes == MISSING, u, codes), out


def frame_attributes(df: pd.DataFrame, qis: Mapping[str, QISpec]) -> list[Attribute]:
    """Attributes of a DataFrame; ``qis`` maps a column to a Hierarchy, a networkx graph, (L, U) or None."""
    attrs = []
    for name, spec in qis.items():
        col = df[name]
        if isinstance(spec, Hierarchy):
            labels = col.astype(object).where(col.notna(), None)
            leaf = spec.codes(None if v is None else str(v) for v in labels)
            unknown = [v for v, c in zip(labels, leaf) if c < 0 and v is not None]
            if unknown:
                raise ValueError(f"{name}: value {unknown[0]!r} is not a leaf of its hierarchy")
            present = np.unique(leaf[leaf >= 0])
            codes = np.where(leaf >= 0, np.searchsorted(present, leaf), MISSING)
            md = float(spec.n_leaves - 1)
            codes, m = _with_missing(codes, tree_matrix(spec, present), md)
            attrs.append(Attribute(name, "tree", md, codes=codes, values=[spec.leaves[c] for c in present],
                                   matrix=m, hierarchy=spec))
        elif isinstance(spec, nx.Graph):
            present = [v for v in pd.unique(col.dropna())]
            missing_nodes = [v for v in present if v not in spec]
            if missing_nodes:
                raise ValueError(f"{name}: station {missing_nodes[0]!r} is not in the graph")
            index = {v: i for i, v in enumerate(present)}
            codes = np.array([index[v] if v in index else MISSING for v in col.where(col.notna(), None)])
            md = graph_diameter(spec)
            codes, m = _with_missing(codes, graph_matrix(spec, present), md)
            attrs.append(Attribute(name, "graph", md, codes=codes, values=present, matrix=m, graph=spec))
        else:
            x = pd.to_numeric(col, errors="raise").to_numpy(dtype=float)
            lo, hi = spec if spec is not None else (np.nanmin(x), np.nanmax(x))
            attrs.append(Attribute(name, "numeric", float(hi - lo) or 1.0, x=x))
    return attrs


def space_attributes(X: np.ndarray, space, graphs: Mapping[str, object] | None = None) -> list[Attribute]:
    """Attributes of a window's code matrix: one per dimension of the QI space (a geopoint gives two numeric
    dimensions). A ``station`` QI with a graph in ``graphs`` uses graph distances, any other categorical or
    station QI its hierarchy; codes below the domain (missing values) become missing."""
    graphs = graphs or {}
    attrs = []
    for d in range(X.shape[1]):
        qi = space.qis[space.owner[d]] if hasattr(space, "qis") else None
        x = X[:, d]
        missing = x < space.lower[d]
        if qi is not None and qi.kind in ("categorical", "station"):
            leaf = np.where(missing, MISSING, x).astype(np.int64)
            present = np.unique(leaf[leaf >= 0])
            codes = np.where(leaf >= 0, np.searchsorted(present, leaf), MISSING)
            if qi.kind == "station" and qi.name in graphs:
                g = graphs[qi.name]
                values = [qi.hierarchy.leaves[c] for c in present]
                md = graph_diameter(g)
                codes, m = _with_missing(codes, graph_matrix(g, values), md)
                attrs.append(Attribute(qi.name, "graph", md, codes=codes, values=values, matrix=m, graph=g))
            else:
                md = float(qi.hierarchy.n_leaves - 1)
                codes, m = _with_missing(codes, tree_matrix(qi.hierarchy, present), md)
                attrs.append(Attribute(qi.name, "tree", md, codes=codes, values=list(present), matrix=m,
                                       hierarchy=qi.hierarchy))
        else:
            name = qi.name if qi is not None else f"d{d}"
            attrs.append(Attribute(name, "numeric", float(space.width[d]) or 1.0,
                                   x=np.where(missing, np.nan, x)))
    return attrs


def generalize_classes(df: pd.DataFrame, classes, qis: Mapping[str, QISpec], class_col: str = "class_id"
                       ) -> pd.DataFrame:
    """The released table: every record of a class gets the class's generalization (local recoding); records
    in no class are suppressed (all QIs None, class id -1). Same index as ``df``; non-QI columns are kept."""
    out = df.copy()
    for name in qis:
        out[name] = pd.Series([None] * len(df), index=df.index, dtype=object)
    out[class_col] = -1
    pos_index = df.index
    for cid, rows in enumerate(classes):
        rows = np.asarray(rows)
        idx = pos_index[rows]
        out.loc[idx, class_col] = cid
        for name, spec in qis.items():
            vals = df[name].iloc[rows]
            present = vals.dropna()
            value: object         # a label, a set of stations, (min, max) or one number
            if isinstance(spec, Hierarchy):
                if len(present) < len(vals):
                    value = spec.root
                else:
                    codes = spec.codes(str(v) for v in present)
                    value = spec.generalize(codes.min(), codes.max())[2]
            elif isinstance(spec, nx.Graph):
                value = frozenset(present) if len(present) == len(vals) else frozenset(spec.nodes)
            else:
                x = pd.to_numeric(present).to_numpy(dtype=float)
                if len(x) < len(vals):
                    value = tuple(spec) if spec is not None else (np.nan, np.nan)
                else:
                    value = float(x[0]) if x.min() == x.max() else (float(x.min()), float(x.max()))
            out.loc[idx, name] = pd.Series([value] * len(idx), index=idx, dtype=object)
    return out
