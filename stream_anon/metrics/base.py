"""The input convention shared by every metric: an :class:`AnonymizedTable` (original table + its anonymized form).

A metric is a plain function ``metric(release, ...) -> float`` (or a dict for per-attribute families).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence, cast

import numpy as np
import pandas as pd

from stream_anon.hierarchy import Hierarchy

_INTERVAL = re.compile(r"^\s*[\[(]\s*([-+0-9.eE]+)\s*,\s*([-+0-9.eE]+)\s*[\])]\s*$")


@dataclass
class AnonymizedTable:
    """An original table and its anonymized release, record by record.

    - ``original``: one row per input record, raw values (QIs, sensitive attribute, individual id).
    - ``released``: same index as ``original``; the generalized QI values of each record. A categorical value
      is a node label of its hierarchy; a numeric value is a number, a ``(lo, hi)`` pair, a ``pd.Interval``
      or a string ``"[lo, hi]"``; a graph value (station) is a label or a set of labels. Content of
      suppressed rows is ignored.
    - ``qis``: the quasi-identifier columns (present in both frames).
    - ``sensitive``: sensitive column (read from ``released`` if present there, else from ``original``).
    - ``individual``: column of ``original`` naming the individual (k is counted in distinct individuals);
      ``None``: every record is its own individual.
    - ``class_col``: column of ``released`` with the equivalence-class id; ``None``: classes are the distinct
      released QI tuples.
    - ``suppressed``: boolean mask over records; ``None``: rows whose released QIs are all missing
      (``"*"`` is not taken as suppression: it is often a hierarchy root).
    - ``hierarchies``: categorical QI -> :class:`~stream_anon.hierarchy.Hierarchy`.
    - ``bounds``: numeric QI -> (L, U) domain; default: min and max of the original column.
    - ``graphs``: graph QI (stations) -> ``networkx`` graph (seed 000's graph distance).
    """

    original: pd.DataFrame
    released: pd.DataFrame
    qis: Sequence[str]
    sensitive: str | None = None
    individual: str | None = None
    class_col: str | None = None
    suppressed: np.ndarray | None = None
    hierarchies: Mapping[str, Hierarchy] = field(default_factory=dict)
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    graphs: Mapping = field(default_factory=dict)

    def __post_init__(self):
        self.qis = list(self.qis)
        if len(self.original) != len(self.released) or not self.original.index.equals(self.released.index):
            raise ValueError("AnonymizedTable: original and released must have the same index (one row per record)")
        missing = [q for q in self.qis if q not in self.original or q not in self.released]
        if missing:
            raise ValueError(f"AnonymizedTable: quasi-identifiers {missing} missing from original or released")
        if self.suppressed is None:
            self.suppressed = self.released[self.qis].isna().all(axis=1).to_numpy()
        self.suppressed = np.asarray(self.suppressed, dtype=bool)
        bounds = dict(self.bounds)
        for q in self.qis:
            if q not in self.hierarchies and q not in self.graphs and q not in bounds:
                col = pd.to_numeric(self.original[q], errors="coerce")
                if col.notna().any():
                    bounds[q] = (float(col.min()), float(col.max()))
        self.bounds = bounds

    @classmethod
    def identity(cls, original: pd.DataFrame, qis, **kw) -> "AnonymizedTable":
        """The raw data as a release (no generalization, no suppression): the thesis's m_min reference."""
        return cls(original, original.copy(), qis, suppressed=np.zeros(len(original), bool), **kw)

    # -- sizes ------------------------------------------------------------------------------------------------
    @property
    def kept(self) -> np.ndarray:
        return ~cast(np.ndarray, self.suppressed)         # set by __post_init__

    @property
    def n_records(self) -> int:
        return len(self.original)

    @property
    def n_released(self) -> int:
        return int(self.kept.sum())

    # -- columns of the kept records --------------------------------------------------------------------------
    def class_ids(self) -> pd.Series:
        """Class id of every kept record."""
        rel = self.released[self.kept]
        if self.class_col is not None:
            return rel[self.class_col]
        key = rel[self.qis[0]].astype(str)
        for q in self.qis[1:]:
            key = key + "\x1f" + rel[q].astype(str)
        return key

    def individuals(self) -> pd.Series:
        orig = self.original[self.kept]
        if self.individual is None:
            return pd.Series(np.arange(len(orig)), index=orig.index)
        return orig[self.individual]

    def sensitive_values(self, kept_only: bool = True) -> pd.Series:
        if self.sensitive is None:
            raise ValueError("this metric needs AnonymizedTable.sensitive")
        src = self.released if self.sensitive in self.released else self.original
        return src[self.sensitive][self.kept] if kept_only else self.original[self.sensitive]

    def kind(self, attr: str) -> str:
        if attr in self.hierarchies:
            return "tree"
        if attr in self.graphs:
            return "graph"
        return "numeric"


def interval(value) -> tuple[float, float]:
    """(lo, hi) of a released numeric value: number, pair, ``pd.Interval`` or ``"[lo, hi]"``."""
    if isinstance(value, pd.Interval):
        return float(value.left), float(value.right)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return float(value[0]), float(value[1])
    if isinstance(value, str):
        m = _INTERVAL.match(value)
        if m:
            return float(m.group(1)), float(m.group(2))
    x = float(value)
    return x, x


def leaves_under(h: Hierarchy, label) -> int:
    lo, hi = h.node_range(str(label))
    return hi - lo + 1


def tree_height(h: Hierarchy) -> int:
    return max(h.depth(leaf) for leaf in h.leaves)


def lca(h: Hierarchy, labels) -> str:
    """Closest common ancestor of node labels."""
    ranges = [h.node_range(str(v)) for v in labels]
    return h.generalize(min(r[0] for r in ranges), max(r[1] for r in ranges))[2]


def cell_loss(release: AnonymizedTable, attr: str, value, original=None) -> float:
    """Normalized loss of one released cell in [0, 1].

    Tree: (leaves(node) - 1) / (leaves(root) - 1) (Iyengar, KDD 2002); with ``original`` the node is the
    closest common ancestor of original and released value (cross-data form). Numeric: (hi - lo) / (U - L);
    with ``original`` outside the interval the interval is widened to include it. Graph: maximum shortest
    path inside the released station set / diameter (seed 000).
    """
    kind = release.kind(attr)
    if kind == "tree":
        h = release.hierarchies[attr]
        node = str(value) if original is None else lca(h, [value, original])
        return (leaves_under(h, node) - 1) / max(h.n_leaves - 1, 1)
    if kind == "graph":
        return graph_spread(release.graphs[attr], value if original is None else _as_set(value) | {original})
    lo, hi = interval(value)
    if original is not None:
        o = float(original)
        lo, hi = min(lo, o), max(hi, o)
    L, U = release.bounds[attr]
    return (hi - lo) / (U - L) if U > L else 0.0


def _as_set(value) -> set:
    if isinstance(value, (set, frozenset, list, tuple)):
        return set(value)
    return {value}


_DIAM: dict[int, float] = {}


def graph_spread(graph, stations) -> float:
    """max shortest path between the stations / diameter of the graph (seed 000's normalized D^G)."""
    import networkx as nx

    stations = list(_as_set(stations))
    if len(stations) < 2:
        return 0.0
    key = id(graph)
    if key not in _DIAM:
        _DIAM[key] = float(nx.diameter(graph.to_undirected() if graph.is_directed() else graph))
    worst = 0.0
    for i, s in enumerate(stations):
        dist = nx.single_source_shortest_path_length(graph, s)
        worst = max(worst, max(dist[t] for t in stations[i + 1:]) if i + 1 < len(stations) else 0)
    return worst / _DIAM[key] if _DIAM[key] else 0.0


def min_max(m: float, m_min: float, m_max: float) -> float:
    """Min-max scaling (m - m_min) / (m_max - m_min) (Singer 2023, Section 4.4.5); 0 if the range is empty."""
    return (m - m_min) / (m_max - m_min) if m_max != m_min else 0.0
