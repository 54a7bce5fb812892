"""HeuristicMin: best-first search for the largest generalised table that meets every anonymity requirement.

Arca & Hewett, "Data privacy with heuristic anonymisation", IJICS 2023 (seed 001). A requirement
<R_i, k_i> (shield R_i, a set of attributes, with its own k_i) is violated by a row whose R_i-projection
holds fewer than k_i records (here: optionally k_i distinct individuals). Generalisation is by *attribute*:
taking a value to its parent takes all of the parent's descendants to the parent, in every row, so one
column can mix levels. A search node is a generalised table with (n = violating rows, m = rows).

- The node with the largest m is expanded first; ties: the smallest non-zero n, then generation order.
- A child per shield attribute B of a violated requirement: every B-value of a row violating a requirement
  whose shield contains B is generalised (with its siblings) to its parent [the paper's "for each violating
  row and applicable attribute B"; one child per attribute reproduces its Figure 5].
- Nodes with n = 0 are never expanded; a violating node with m <= the best compliant m is pruned
  (monotonicity: generalising never adds rows); the search stops when no such node is left.
- Duplicate states are detected with a closed set [needed to reproduce the paper's count of 9 distinct
  generalisations; the duplicates are still reported in ``HeuristicMinResult.duplicates``].
- The largest compliant table wins, ties to the first found (fewest generalisation steps).
- ``max_expansions`` bounds the search [ours, for streaming windows]: when it is hit without a compliant
  table (or every branch ended without one), the most promising node is generalised greedily (child with the
  most rows) until compliant. A row whose shield values are all at the root already (a missing value starts
  there) has no child in the paper's rule; the greedy finish then lifts whole columns (``_Table.lifts``),
  which ends at the all-root table at worst. Requirements that even the all-root table violates (fewer than k
  records or individuals in total) raise ValueError before any search.

>>> import pandas as pd
>>> from stream_anon.hierarchy import Hierarchy
>>> df = pd.DataFrame({"a": ["x", "y", "z"], "n": [3, 1, 4]})
>>> res = heuristicmin(df, {"a": Hierarchy.from_nested({"*": {"xy": ["x", "y"], "z": []}})}, k=4, count="n")
>>> res.table["a"].tolist(), (res.n, res.m)
(['xy', 'xy', 'z'], (0, 2))
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from stream_anon.hierarchy import Hierarchy
from stream_anon.strategies.tabular import row_groups
from stream_anon.validation import MAX_COUNT, check_integer

MAX_NUMERIC_DEPTH = 16     # a numeric QI's interval tree has 2**depth leaves


@dataclass(frozen=True)
class Requirement:
    """<shield, k>: every shield-projected tuple must hold at least k records (or individuals)."""
    shield: tuple[str, ...]
    k: int


@dataclass
class SearchNode:
    order: int                      # generation order (root = 0)
    n: int                          # violating rows
    m: int                          # rows
    parent: int | None
    attribute: str | None           # attribute generalised from the parent
    state: tuple = field(repr=False, default=())


@dataclass
class HeuristicMinResult:
    table: pd.DataFrame             # input records, attribute columns generalised (labels)
    rows: pd.DataFrame              # distinct generalised rows with their record counts
    n: int
    m: int
    nodes: list[SearchNode]         # every distinct state, generation order
    duplicates: list[tuple[int, str, int, int, int]]   # (parent, attribute, n, m, same-as order)
    expanded: list[int]             # orders of the expanded nodes
    best: int                       # order of the returned node

    @property
    def generated(self) -> int:
        """Distinct generalisations generated (root excluded)."""
        return len(self.nodes) - 1

    def children(self, order: int) -> list[SearchNode]:
        return [nd for nd in self.nodes if nd.parent == order]


class _Table:
    def __init__(self, df: pd.DataFrame, hierarchies: Mapping[str, Hierarchy], attributes: Sequence[str],
                 requirements: list[Requirement], count: str | None, unit: str | None) -> None:
        self.attributes = list(attributes)
        self.h = [hierarchies[a] for a in self.attributes]
        self.requirements = requirements
        self.uniq: list[list[str]] = []
        codes = []
        for a, h in zip(self.attributes, self.h):
            values = df[a].astype(str).to_numpy()
            uniq, inv = np.unique(values, return_inverse=True)
            for v in uniq:
                h.node_range(v)   # KeyError for a value outside the hierarchy
            self.uniq.append(list(uniq))
            codes.append(inv)
        self.codes = np.stack(codes, axis=1) if codes else np.zeros((len(df), 0), int)
        self.weight = (df[count].to_numpy(dtype=float) if count else np.ones(len(df)))
        self.unit = pd.factorize(df[unit])[0] if unit else None
        self.col = {a: j for j, a in enumerate(self.attributes)}
        self.node_id = [{lab: i for i, lab in enumerate(h.graph.nodes)} for h in self.h]
        self.n_nodes = [len(ids) for ids in self.node_id]

    def root_state(self) -> tuple:
        return tuple(tuple(u) for u in self.uniq)

    def evaluate(self, state):
        gen = np.stack([np.array([self.node_id[j][lab] for lab in state[j]])[self.codes[:, j]]
                        for j in range(len(state))], axis=1)
        every = list(range(len(state)))
        row = self._group(gen, every)
        m = int(row.max()) + 1 if len(row) else 0
        violating_by_req = []
        bad = np.zeros(m, bool)
        for req in self.requirements:
            cols = [self.col[a] for a in req.shield]
            pid = row if cols == every else self._group(gen, cols)
            if self.unit is None:
                cnt = np.bincount(pid, weights=self.weight)
            else:
                n_units = int(self.unit.max()) + 1
                pairs = np.unique(pid * n_units + self.unit)
                cnt = np.bincount(pairs // n_units, minlength=int(pid.max()) + 1)
            rec_bad = cnt[pid] < req.k
            rows_bad = np.zeros(m, bool)
            rows_bad[row[rec_bad]] = True
            violating_by_req.append(rec_bad)
            bad |= rows_bad
        return int(bad.sum()), m, violating_by_req

    def _group(self, gen, cols) -> np.ndarray:
        return row_groups(gen[:, cols], [self.n_nodes[j] for j in cols])

    def children(self, state, violating_by_req):
        out = []
        for a in self.attributes:
            j = self.col[a]
            h = self.h[j]
            recs = np.zeros(len(self.codes), bool)
            for req, rec_bad in zip(self.requirements, violating_by_req):
                if a in req.shield:
                    recs |= rec_bad
            if not recs.any():
                continue
            parents = set()
            for c in np.unique(self.codes[recs, j]):
                label = state[j][c]
                if label != h.root:
                    parents.add(next(iter(h.graph.predecessors(label))))
            if not parents:
                continue
            new = self._generalise(state, j, parents)
            if new != state:
                out.append((a, new))
        return out

    def _generalise(self, state, j: int, parents) -> tuple:
        """``state`` with every label of column j that lies under one of ``parents`` taken to that parent."""
        h = self.h[j]
        # widest (shallowest) parent first; a label moves up only to a strict ancestor (unary chains
        # share a leaf range, so containment alone is not enough)
        targets = sorted(((h.depth(p), h.node_range(p), p) for p in parents))
        labels = list(state[j])
        for i, lab in enumerate(labels):
            lo, hi = h.node_range(lab)
            for pdepth, (plo, phi), p in targets:
                if plo <= lo and hi <= phi and pdepth < h.depth(lab):
                    labels[i] = p
                    break
        return state[:j] + (tuple(labels),) + state[j + 1:]

    def lifts(self, state):
        """One child per column not yet at its root: every label of the column taken one level up.

        [ours, for the budget fallback] A row whose shield values are all at the root (a missing value
        starts there) has no child in the paper's rule, yet it can still be joined: by generalising the
        *other* rows' values. Lifting whole columns always reaches the all-root table, so the fallback
        ends at a compliant table whenever one exists.
        """
        out = []
        for a in self.attributes:
            j = self.col[a]
            h = self.h[j]
            parents = {next(iter(h.graph.predecessors(lab))) for lab in state[j] if lab != h.root}
            if parents:
                out.append((a, self._generalise(state, j, parents)))
        return out

    def top_state(self) -> tuple:
        return tuple(tuple(h.root for _ in u) for h, u in zip(self.h, self.uniq))


def heuristicmin(df: pd.DataFrame, hierarchies: Mapping[str, Hierarchy], k: int | None = None,
                 requirements: Sequence[Requirement | tuple] | None = None, attributes: Sequence[str] | None = None,
                 count: str | None = None, unit: str | None = None, max_expansions: int = 100_000
                 ) -> HeuristicMinResult:
    """Run HeuristicMin on ``df`` (one row per record, or per distinct tuple with a ``count`` column).

    ``attributes``: the columns that make a row (default: every column with a hierarchy); values are matched
    to hierarchy labels as strings. ``requirements``: ``[(shield, k), ...]``; default ``[(attributes, k)]``.
    ``unit``: count distinct individuals of this column instead of records.
    """
    attributes = list(attributes or hierarchies)
    if requirements is None:
        if k is None:
            raise ValueError("heuristicmin: give k or requirements")
        requirements = [Requirement(tuple(attributes), k)]
    reqs = [r if isinstance(r, Requirement) else Requirement(tuple(r[0]), int(r[1])) for r in requirements]
    for r in reqs:
        if r.k < 1 or not set(r.shield) <= set(attributes):
            raise ValueError(f"heuristicmin: requirement {r} needs k >= 1 and a shield within {attributes}")
    t = _Table(df, hierarchies, attributes, reqs, count, unit)

    if t.evaluate(t.top_state())[0]:      # the all-root table: one row, the most any generalisation can merge
        raise ValueError("heuristicmin: requirements cannot be met even at the hierarchy roots")
    root = t.root_state()
    n, m, vio = t.evaluate(root)
    nodes = [SearchNode(0, n, m, None, None, root)]
    seen = {root: 0}
    info = {0: vio}
    duplicates: list = []
    expanded: list[int] = []
    best = 0 if n == 0 else None
    heap = [] if n == 0 else [(-m, n, 0)]
    while heap:
        neg_m, _, order = heapq.heappop(heap)
        if best is not None and -neg_m <= nodes[best].m:
            break
        if len(expanded) >= max_expansions:
            heapq.heappush(heap, (neg_m, _, order))
            break
        expanded.append(order)
        for attr, state in t.children(nodes[order].state, info.pop(order)):
            if state in seen:
                other = nodes[seen[state]]
                duplicates.append((order, attr, other.n, other.m, other.order))
                continue
            cn, cm, cvio = t.evaluate(state)
            node = SearchNode(len(nodes), cn, cm, order, attr, state)
            nodes.append(node)
            seen[state] = node.order
            if cn == 0:
                if best is None or cm > nodes[best].m:
                    best = node.order
            else:
                info[node.order] = cvio
                heapq.heappush(heap, (-cm, cn, node.order))
    if best is None:
        # budget exhausted, or every branch ended at a row the paper's rule cannot generalise: greedy descent
        # from the most promising frontier node (or, with an empty frontier, the most promising node seen)
        order = heap[0][2] if heap else min((nd for nd in nodes if nd.n), key=lambda nd: (-nd.m, nd.n, nd.order)).order
        while nodes[order].n:
            kids = []
            state_now = nodes[order].state
            candidates = t.children(state_now, info.pop(order, None) or t.evaluate(state_now)[2]) or t.lifts(state_now)
            for attr, state in candidates:
                if state in seen:
                    kids.append(nodes[seen[state]])
                    continue
                cn, cm, cvio = t.evaluate(state)
                node = SearchNode(len(nodes), cn, cm, order, attr, state)
                nodes.append(node)
                seen[state] = node.order
                info[node.order] = cvio
                kids.append(node)
            order = max(kids, key=lambda nd: (nd.n == 0, nd.m, -nd.n)).order
        best = order
    return _result(df, t, nodes, duplicates, expanded, best, count)


def _result(df, t, nodes, duplicates, expanded, best, count) -> HeuristicMinResult:
    state = nodes[best].state
    table = df.copy()
    for j, a in enumerate(t.attributes):
        table[a] = np.array(state[j], dtype=object)[t.codes[:, j]]
    weights = df[count] if count else pd.Series(1, index=df.index)
    rows = (table[t.attributes].assign(_records=weights.to_numpy())
            .groupby(t.attributes, sort=False, as_index=False)["_records"].sum()
            .rename(columns={"_records": "records"}))
    return HeuristicMinResult(table, rows, nodes[best].n, nodes[best].m, nodes, duplicates, expanded, best)


def interval_hierarchy(lower: float, upper: float, depth: int, name: str = "") -> Hierarchy:
    """A binary interval tree over [lower, upper] with 2**depth leaf bins, for numeric attributes [ours].

    Labels carry enough significant digits to tell adjacent bin edges apart (a 30-hour span of Unix times
    needs 10, not the 6 of ``%g``); a degenerate range [L, L] is widened to [L, L + 1], the same unit width
    the adapters bin a zero-width dimension with.
    """
    if not upper > lower:
        upper = lower + 1.0
    step = (upper - lower) / 2 ** depth
    digits = max(6, int(np.ceil(np.log10(max(abs(lower), abs(upper)) / step))) + 2)

    def fmt(x):
        return f"{x:.{digits}g}"

    def build(lo, hi, d):
        if d == 0:
            return []
        mid = (lo + hi) / 2
        return {f"[{fmt(lo)}, {fmt(mid)})": build(lo, mid, d - 1), f"[{fmt(mid)}, {fmt(hi)}]": build(mid, hi, d - 1)}
    return Hierarchy.from_nested({f"[{fmt(lower)}, {fmt(upper)}]*": build(lower, upper, depth)}, name)


@dataclass(frozen=True)
class HeuristicMinParams:
    """``[anonymization.strategy_params]`` of ``heuristicmin``: ``numeric_depth`` (interval-tree levels for
    numeric QIs, 1..16) and ``max_expansions`` (best-first expansions before the greedy finish, >= 1)."""
    numeric_depth: int = 4
    max_expansions: int = 200

    def __post_init__(self) -> None:
        check_integer(self.numeric_depth, "numeric_depth", 1, MAX_NUMERIC_DEPTH)
        check_integer(self.max_expansions, "max_expansions", 1, MAX_COUNT)

    def check_config(self, sensitive: tuple[str, ...], qi_names: tuple[str, ...]) -> None:
        pass


class HeuristicMin:
    """Engine adapter: HeuristicMin over a window's buffer, requirement <all QI dimensions, k individuals>.

    Categorical dimensions use their configured hierarchy; numeric ones a binary interval tree of
    ``numeric_depth`` levels over the configured bounds; a missing value starts at the root. Records are
    grouped by generalised tuple; a group below k individuals stays unassigned (deferred).
    """
    name = "heuristicmin"
    uses_sensitive = False
    Params = HeuristicMinParams

    def __init__(self, **params) -> None:
        self.params = p = HeuristicMinParams(**params)
        self.numeric_depth, self.max_expansions = p.numeric_depth, p.max_expansions
        self._trees: dict = {}

    def _hierarchy(self, space, d: int) -> Hierarchy:
        qi = space.qis[space.owner[d]] if hasattr(space, "qis") else None
        if qi is not None and qi.kind in ("categorical", "station"):
            return qi.hierarchy
        key = (d, float(space.lower[d]), float(space.upper[d]))
        if key not in self._trees:
            self._trees[key] = interval_hierarchy(space.lower[d], space.upper[d], self.numeric_depth)
        return self._trees[key]

    def form_classes(self, X, units, k, space, rng=None) -> list[np.ndarray]:
        n = len(X)
        if n == 0 or len(np.unique(units)) < k:
            return []
        cols, hier = {}, {}
        for d in range(X.shape[1]):
            h = self._hierarchy(space, d)
            name = f"d{d}"
            hier[name] = h
            x = X[:, d]
            missing = x < space.lower[d]
            if h.n_leaves and name and (hasattr(space, "qis") and space.qis[space.owner[d]].kind in ("categorical", "station")):
                idx = np.clip(x, 0, h.n_leaves - 1).astype(int)
            else:
                width = (space.upper[d] - space.lower[d]) or 1.0
                idx = np.clip(((x - space.lower[d]) / width * h.n_leaves).astype(int), 0, h.n_leaves - 1)
            labels = np.array(h.leaves, dtype=object)[idx]
            labels[missing] = h.root
            cols[name] = labels
        df = pd.DataFrame(cols)
        df["_unit"] = units
        res = heuristicmin(df, hier, k=k, unit="_unit", max_expansions=self.max_expansions)
        key = res.table[list(hier)].astype(str).agg("\x1f".join, axis=1) if len(hier) > 1 else res.table["d0"]
        classes = []
        for idx in pd.Series(np.arange(n)).groupby(key.to_numpy()).groups.values():
            idx = np.asarray(idx)
            if len(np.unique(units[idx])) >= k:
                classes.append(idx)
        return classes
