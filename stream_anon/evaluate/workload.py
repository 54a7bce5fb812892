"""The analyst's workload: a fixed, seeded set of range-count queries over a stream's quasi-identifiers, answered
from published boxes (uniform spread inside each box) and from the raw events (the truth).

Three families, the questions an analyst of fare or trip data asks (issue 29):

- ``area x hour``: events in one area during one clock hour (UTC). Area: the parent node of a station or
  categorical place's leaf in its hierarchy (Oyster: the fare zone, or the bus route group); for a geopoint, a cell
  of a :data:`AREA_GRID_DEG` degree grid;
- ``station x hour``: events at one station during one hour: a leaf of the place hierarchy, or for a geopoint the
  box of +-:data:`STATION_HALF_DEG` degrees around a position seen in the data (a Citi Bike dock);
- ``product x day``: events of one value of the product field during one UTC day. Product: the first sensitive
  field with a category domain (Oyster: ``fare_product``, Citi Bike: ``payload.usertype``), published as it is.

The place is the first station QI, else the first categorical QI with a hierarchy deeper than one level, else the
first geopoint; the time is the first timestamp QI. A family whose dimensions the stream lacks is left out.

**Cells.** Each family's cells are drawn from the events themselves (``per_family`` distinct cells, each that of
an event picked with seed ``seed``): the cells an analyst asks about are those where something happened, so the
workload weighs busy cells as the data do, and every query has a true count of at least 1 over the run. The
workload depends on the events and the seed only, never on what a strategy published: the streaming release and
offline Mondrian are asked the same questions.

**Answers.** All coordinates are the engine's codes (:class:`~stream_anon.engine.space.QISpace`: leaf codes of a
hierarchy, seconds, degrees) plus one axis for the product (its index in the domain's values). A published box
answers a query with the share of the box inside the query's range (the uniform-spread assumption of the
COUNT-query error of :mod:`stream_anon.metrics.queries`): integer leaves for a hierarchy (leaves of the query's node among the
published node's), length for a half-open time interval, length for a closed numeric or geopoint interval (a
zero-width side: 1 when the point lies inside). A record's estimate is the product over the axes; a query's
answer the sum over the published records. Suppressed records answer nothing; the truth counts them.

**Error.** ``|estimate - truth| / truth`` per query with a true count above 0 (in the release, or over the run),
summarized per family (mean, median, 90th percentile) and over all queries.

>>> lo, hi = np.array([[0.0, 0.0]]), np.array([[3.0, 10.0]])   # one record: leaves 0..3, time [0, 10)
>>> kinds = np.array([LEAVES, HALF_OPEN])
>>> q_lo, q_hi = np.array([[0.0, 5.0]]), np.array([[0.0, 10.0]])   # leaf 0, time [5, 10)
>>> box_answers(kinds, lo, hi, q_lo, q_hi)   # 1/4 of the leaves x 1/2 of the time
array([[0.125]])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stream_anon.engine.records import get_path
from stream_anon.engine.space import QISpace, inner_box, iso, parse_time

HOUR_S, DAY_S = 3600.0, 86400.0
AREA_GRID_DEG = 0.01            # geopoint areas: 0.01 degree cells (about 1.1 km x 0.85 km at 40 N)
STATION_HALF_DEG = 0.0005       # geopoint stations: +-0.0005 degrees (about 50 m) around a seen position
PER_FAMILY = 100
FAMILIES = ("area x hour", "station x hour", "product x day")
LEAVES, HALF_OPEN, CLOSED = 0, 1, 2     # how an axis measures overlap


@dataclass
class QuerySpace:
    """The axes of the workload for one stream: its QI codes plus the product axis (index in ``product_values``)."""

    space: QISpace
    kinds: np.ndarray                      # (A,) LEAVES / HALF_OPEN / CLOSED
    time_dim: int | None
    place: tuple | None                    # ("tree", dim, hierarchy) or ("geo", lat dim)
    product_field: str | None
    product_values: tuple = ()
    product_other: str | None = None

    @classmethod
    def of(cls, config) -> "QuerySpace":
        space = QISpace(config)
        kinds, time_dim, tree, geo, d = [], None, None, None, 0
        for qi in config.quasi_identifiers:
            if qi.kind in ("categorical", "station"):
                kinds.append(LEAVES)
                deep = any(qi.hierarchy.depth(leaf) > 1 for leaf in qi.hierarchy.leaves)
                if tree is None and (qi.kind == "station" or deep):
                    tree = (d, qi.hierarchy)
            elif qi.kind == "timestamp":
                kinds.append(HALF_OPEN)
                time_dim = d if time_dim is None else time_dim
            else:
                kinds += [CLOSED] * qi.dims
                if qi.kind == "geopoint" and geo is None:
                    geo = d
            d += qi.dims
        place = ("tree", *tree) if tree is not None else ("geo", geo) if geo is not None else None
        product = next((dom for dom in config.domains if dom.type == "category" and dom.values), None)
        kinds.append(LEAVES)
        return cls(space, np.array(kinds), time_dim, place, product and product.field,
                   product.values if product else (), product.other if product else None)

    @property
    def axes(self) -> int:
        return len(self.kinds)

    def product_codes(self, values) -> np.ndarray:
        """Index of each value in the product domain (a value outside: the domain's ``other``, else -1)."""
        index = {v: i for i, v in enumerate(self.product_values)}
        other = index.get(self.product_other, -1)
        return np.array([index.get(v, -1 if v is None else other) for v in values], dtype=float)

    def points(self, events: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """The events as points (n, A) and which of them encode (a value outside the domains: False)."""
        fields = sorted({f for q in self.space.qis for f in q.fields})
        X, reasons = self.space.encode({f: [get_path(e, f) for e in events] for f in fields})
        product = self.product_codes([_text(get_path(e, self.product_field)) for e in events]) \
            if self.product_field else np.full(len(events), -1.0)
        return np.column_stack([X, product]), np.array([r is None for r in reasons], dtype=bool)

    def boxes(self, records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Published records (docs/contracts.md section 5) as boxes (m, A): every QI's published value as the
        code range it covers (a hierarchy node: its leaves; a time interval: [from, to) in seconds; an H3 cell:
        its inner box), the product value as a point."""
        m, s = len(records), self.space
        lo, hi = np.empty((m, self.axes)), np.empty((m, self.axes))
        d = 0
        for qi in s.qis:
            whole = (s.lower[d:d + qi.dims], s.upper[d:d + qi.dims])
            for i, r in enumerate(records):
                # a value this reader cannot place counts as the whole domain (the audit's coverage check is what
                # judges published values; here they only answer queries)
                lo[i, d:d + qi.dims], hi[i, d:d + qi.dims] = whole
                g = (r.get("qi") or {}).get(qi.name) or {}
                try:
                    if qi.kind in ("categorical", "station"):
                        assert qi.hierarchy is not None     # the config requires one for these kinds
                        lo[i, d], hi[i, d] = qi.hierarchy.node_range(g["label"])
                    elif qi.kind == "geopoint" and "h3" in g:
                        if g["h3"] != "*":
                            (lo[i, d], hi[i, d]), (lo[i, d + 1], hi[i, d + 1]) = inner_box(g["h3"])
                    elif qi.kind == "geopoint":
                        (lo[i, d], hi[i, d]), (lo[i, d + 1], hi[i, d + 1]) = g["lat"], g["lon"]
                    elif qi.kind == "timestamp":
                        a, b = parse_time(g["from"]), parse_time(g["to"])
                        if a is not None and b is not None:
                            lo[i, d], hi[i, d] = a, b
                    else:
                        lo[i, d], hi[i, d] = float(g["from"]), float(g["to"])
                except (KeyError, TypeError, ValueError):
                    lo[i, d:d + qi.dims], hi[i, d:d + qi.dims] = whole
            d += qi.dims
        if self.product_field:
            lo[:, d] = hi[:, d] = self.product_codes([_text((r.get("sensitive") or {}).get(self.product_field))
                                                      for r in records])
        else:
            lo[:, d] = hi[:, d] = -1.0
        return lo, hi


def _text(v):
    return None if v is None else str(v).lower() if isinstance(v, bool) else str(v)


@dataclass
class Workload:
    """The queries: family and readable cell of each, and their ranges (Q, A): a LEAVES axis [lo, hi] in leaf
    codes, a HALF_OPEN axis [lo, hi), a CLOSED axis [lo, hi]; an axis the query does not constrain: (-inf, inf)."""

    family: np.ndarray
    label: list[str]
    lo: np.ndarray
    hi: np.ndarray
    seed: int = 0
    families: tuple = field(default=())

    def __len__(self) -> int:
        return len(self.label)


def analyst_workload(qs: QuerySpace, points: np.ndarray, seed: int = 0, per_family: int = PER_FAMILY) -> Workload:
    """The seeded workload over the cells of ``points`` (module docstring)."""
    rng = np.random.default_rng(seed)
    fams, labels, los, his = [], [], [], []
    A = qs.axes
    for family in FAMILIES:
        cells = _family_cells(qs, points, family)
        if cells is None:
            continue
        keys, ranges = cells
        order = rng.permutation(len(keys))
        seen: set = set()
        for i in order:
            if keys[i] is None or keys[i] in seen:
                continue
            seen.add(keys[i])
            lo, hi = np.full(A, -np.inf), np.full(A, np.inf)
            for axis, (a, b) in ranges(i).items():
                lo[axis], hi[axis] = a, b
            fams.append(family)
            labels.append(_describe(qs, family, lo, hi, iso))
            los.append(lo)
            his.append(hi)
            if len(seen) == per_family:
                break
    return Workload(np.array(fams, dtype=object), labels, np.array(los).reshape(-1, A), np.array(his).reshape(-1, A),
                    seed, tuple(dict.fromkeys(fams)))


def _family_cells(qs: QuerySpace, X: np.ndarray, family: str):
    """(one hashable key per point, point index -> {axis: (lo, hi)}) of a family's cells, None without its dims."""
    t = qs.time_dim
    if t is None or not len(X):
        return None
    valid = X[:, t] >= qs.space.lower[t]
    period = DAY_S if family == "product x day" else HOUR_S
    start = np.floor(X[:, t] / period) * period

    def with_time(i, extra):
        return {t: (start[i], start[i] + period), **extra}
    if family == "product x day":
        if not qs.product_field:
            return None
        p = qs.axes - 1
        ok = valid & (X[:, p] >= 0)
        keys: list[tuple | None] = [(start[i], X[i, p]) if ok[i] else None for i in range(len(X))]
        return keys, lambda i: with_time(i, {p: (X[i, p], X[i, p])})
    if qs.place is None:
        return None
    if qs.place[0] == "tree":
        _, d, h = qs.place
        ok = valid & (X[:, d] >= 0)
        if family == "station x hour":
            keys = [(start[i], X[i, d]) if ok[i] else None for i in range(len(X))]
            return keys, lambda i: with_time(i, {d: (X[i, d], X[i, d])})
        parents = {}
        for code in np.unique(X[ok, d]).astype(int):
            leaf = h.label_of_leaf(code)
            parent = next(iter(h.graph.predecessors(leaf)), h.root)
            parents[code] = h.node_range(parent)
        keys = [(start[i], parents[int(X[i, d])]) if ok[i] else None for i in range(len(X))]
        return keys, lambda i: with_time(i, {d: parents[int(X[i, d])]})
    d = qs.place[1]
    ok = valid & (X[:, d] >= qs.space.lower[d]) & (X[:, d + 1] >= qs.space.lower[d + 1])
    if family == "station x hour":
        keys = [(start[i], round(X[i, d], 6), round(X[i, d + 1], 6)) if ok[i] else None for i in range(len(X))]
        return keys, lambda i: with_time(i, {d: (X[i, d] - STATION_HALF_DEG, X[i, d] + STATION_HALF_DEG),
                                                    d + 1: (X[i, d + 1] - STATION_HALF_DEG,
                                                            X[i, d + 1] + STATION_HALF_DEG)})
    g = AREA_GRID_DEG
    cell = np.floor(X[:, d:d + 2] / g) * g
    keys = [(start[i], round(cell[i, 0], 6), round(cell[i, 1], 6)) if ok[i] else None for i in range(len(X))]
    # the cell's upper edge belongs to the next cell: the closed range ends just below it
    return keys, lambda i: with_time(i, {d: (cell[i, 0], np.nextafter(cell[i, 0] + g, -np.inf)),
                                                d + 1: (cell[i, 1], np.nextafter(cell[i, 1] + g, -np.inf))})


def _describe(qs: QuerySpace, family: str, lo, hi, iso) -> str:
    t = qs.time_dim
    when = iso(lo[t])[:10] if family == "product x day" else iso(lo[t])[:13] + "h"
    if family == "product x day":
        return f"{qs.product_field}={qs.product_values[int(lo[-1])]} on {when}"
    assert qs.place is not None                 # a place family has cells only with a place
    if qs.place[0] == "tree":
        _, d, h = qs.place
        return f"{h.generalize(lo[d], hi[d])[2]} at {when}"
    d = qs.place[1]
    return f"lat [{lo[d]:.4f}, {hi[d]:.4f}] lon [{lo[d + 1]:.4f}, {hi[d + 1]:.4f}] at {when}"


# ------------------------------------------------------------------------------------------------ answers
QUERY_CHUNK = 64        # queries answered at once: (distinct boxes x chunk) floats in memory


def _shares(kind: int, a, b, c, d) -> np.ndarray:
    """Share of the boxes' [a, b] (column vectors) inside the queries' [c, d] (row vectors) along one axis."""
    if kind == LEAVES:
        return np.clip(np.minimum(b, d) - np.maximum(a, c) + 1.0, 0.0, None) / (b - a + 1.0)
    width = b - a
    overlap = np.clip(np.minimum(b, d) - np.maximum(a, c), 0.0, None)
    inside = (c <= a) & ((a < d) if kind == HALF_OPEN else (a <= d))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(width > 0, overlap / np.where(width > 0, width, 1.0), inside.astype(float))


def box_answers(kinds: np.ndarray, lo: np.ndarray, hi: np.ndarray, q_lo: np.ndarray, q_hi: np.ndarray,
                weight: np.ndarray | None = None, group: np.ndarray | None = None, n_groups: int = 1) -> np.ndarray:
    """(n_groups, Q) answers: per group, the sum over its boxes (``weight`` records each) of the product over the
    axes of the box's share inside each query. A point is a box with lo == hi: its answer is 1 inside, else 0,
    so the truth is ``box_answers(kinds, X, X, ...)``."""
    from scipy import sparse

    m = len(lo)
    weight = np.ones(m) if weight is None else np.asarray(weight, dtype=float)
    group = np.zeros(m, dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    out = np.zeros((n_groups, len(q_lo)))
    if not m or not len(q_lo):
        return out
    # boxes repeat (every record of a class): answer each distinct (group, box) once, weighted
    rows, inverse = np.unique(np.column_stack([group, lo, hi]), axis=0, return_inverse=True)
    w = np.bincount(inverse.ravel(), weights=weight, minlength=len(rows))
    A = lo.shape[1]
    g, blo, bhi = rows[:, 0].astype(np.int64), rows[:, 1:1 + A], rows[:, 1 + A:]
    onehot = sparse.csr_matrix((w, (g, np.arange(len(rows)))), shape=(n_groups, len(rows)))
    for start in range(0, len(q_lo), QUERY_CHUNK):
        ql, qh = q_lo[start:start + QUERY_CHUNK], q_hi[start:start + QUERY_CHUNK]
        share = np.ones((len(rows), len(ql)))
        for axis in range(A):
            c, d = ql[:, axis], qh[:, axis]
            if np.isinf(c).all() and np.isinf(d).all():
                continue
            share *= _shares(int(kinds[axis]), blo[:, axis:axis + 1], bhi[:, axis:axis + 1], c[None, :], d[None, :])
        out[:, start:start + len(ql)] = onehot @ share
    return out


def relative_errors(estimate: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``|estimate - truth| / truth`` where the truth is above 0, NaN elsewhere (no events: no relative error)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(truth > 0, np.abs(estimate - truth) / np.where(truth > 0, truth, 1.0), np.nan)


def summarize(workload: Workload, estimate: np.ndarray, truth: np.ndarray, digits: int = 4) -> dict:
    """Per family and over all queries (one row of answers): ``queries`` with a true count above 0, ``mean``,
    ``median`` and ``p90`` of their relative errors (None without such a query)."""
    err = relative_errors(np.asarray(estimate, dtype=float), np.asarray(truth, dtype=float))
    out = {}
    for name, mask in [(f, workload.family == f) for f in workload.families] + [("all", np.ones(len(err), bool))]:
        e = err[mask]
        e = e[~np.isnan(e)]
        out[name] = {"queries": int(len(e)),
                     **{k: (round(float(fn(e)), digits) if len(e) else None)
                        for k, fn in (("mean", np.mean), ("median", np.median),
                                      ("p90", lambda x: np.percentile(x, 90)))}}
    return out
