"""Mondrian that cuts positions along the H3 hierarchy (issue 44).

Strict Mondrian (LeFevre, DeWitt & Ramakrishnan, ICDE 2006; :mod:`stream_anon.strategies.mondrian`) cuts a
geopoint as two numeric axes, so its boxes ignore H3 cells: a class whose members share no cell of the coarsest
allowed resolution is published as the whole domain. Here an H3 geopoint (``hierarchy = "h3"``) is one
hierarchical dimension instead, cut top-down like a categorical hierarchy (the multi-way split of Mondrian's
hierarchical attributes, ICDE 2006 section 4; Uber's H3, h3geo.org, for the cells):

- a part starts at the root (the whole domain, ``"*"``); its first cut is into the cells of the **start
  resolution**, the coarsest allowed one whose cells stand for less than the whole domain in the engine's NCP
  (``(7 ** (rmax - r) - 1) / (N - 1) < 1``, N the domain's finest cells: a cell no larger than the declared
  domain); each further cut is into the cells one resolution finer, down to the finest allowed;
- a part at cell c of resolution r is cut into the cells of resolution r + 1 of its positions
  (``latlng_to_cell``: H3 children do not tile their parent, so a child here is "the members whose r + 1 cell
  is x", which keeps every member of a part in one cell of each resolution it was cut at); every child holding
  records of at least k distinct individuals becomes a part; the children below k pool, and stay at cell c as
  one part when they hold k individuals together, else join the smallest kept child, which then stays at c;
  nothing is dropped. A part whose positions all fall in one child goes down a level without a split;
- the other dimensions (time, numbers, categories, lat/lon geopoints) are cut at the median as strict Mondrian
  does, both halves holding k individuals.

Positions first (``position_first = true``, the default): a part is cut along its H3 geopoints before any other
dimension, so a class is formed in the finest cell that holds k individuals and the other QIs are cut inside
it. ``position_first = false`` tries every dimension by its normalized span (an H3 part's span is its cell's
NCP), the widest first, as Mondrian.

A class formed in cell c has every member's position in c, so the engine's published cell (the finest common
cell of the members within the allowed resolutions, :func:`stream_anon.h3cells.common_cell`) is c or a
cell inside it; a class left at the root publishes the whole domain or a shared cell of an allowed resolution
(configure the coarsest allowed resolution as the start resolution, as ``calibrate --suggest`` does, so that no
cell larger than the domain is ever published). Deterministic: no randomness, children in cell-id order.

>>> import numpy as np
>>> X = np.array([[0.], [1.], [2.], [3.], [10.], [11.]])
>>> class Space: width = np.array([11.])
>>> sorted(sorted(c.tolist()) for c in H3Mondrian().form_classes(X, np.arange(6), 3, Space(), None))
[[0, 1, 2], [3, 4, 5]]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_anon.h3cells import cells_of_points
from stream_anon.strategies.partition import distinct_units, median_left
from stream_anon.validation import check_bool, check_choice


def dense_codes(values: np.ndarray) -> np.ndarray:
    """``values`` (int64, -1 for none) as 0, 1, ... in value order, -1 kept: small codes that combine with a
    unit code into one sortable key."""
    distinct, code = np.unique(values, return_inverse=True)
    return code.reshape(-1) - int(len(distinct) > 0 and distinct[0] < 0)


class GeoLevels:
    """One H3 geopoint of the buffer: its dimensions, start and finest resolution, the NCP of a cell per
    resolution, and each row's cell per resolution from start to finest, as a dense code (0, 1, ... in cell-id
    order; -1 for a missing position)."""

    def __init__(self, X: np.ndarray, d: int, rmin: int, rmax: int, n_cells: int, lower: np.ndarray):
        ncp = {r: min(1.0, (7.0 ** (rmax - r) - 1.0) / max(n_cells - 1.0, 1.0)) for r in range(rmin, rmax + 1)}
        self.start = next((r for r in range(rmin, rmax + 1) if ncp[r] < 1.0), rmax)
        self.rmax, self.d, self.ncp = rmax, d, ncp
        lat, lon = X[:, d], X[:, d + 1]
        present = (lat >= lower[d]) & (lon >= lower[d + 1])       # a missing position is coded below the domain
        cells = np.full((rmax - rmin + 1, len(X)), -1, dtype=np.int64)     # one contiguous row per resolution
        cells[:, present] = cells_of_points(lat[present], lon[present], rmin, rmax).T
        self.cells: dict[int, np.ndarray] = {r: dense_codes(cells[r - rmin]) for r in range(self.start, rmax + 1)}

    def at_root(self, idx: np.ndarray) -> bool:
        """Whether rows ``idx`` share no cell of the start resolution (their class publishes the whole domain)."""
        c = self.cells[self.start][idx]
        return bool(c[0] < 0 or (c != c[0]).any())

    def span(self, level: int | None) -> float:
        """NCP of a part at ``level`` (None: the root, the whole domain)."""
        return 1.0 if level is None else self.ncp[level]

    def next_level(self, level: int | None) -> int | None:
        nxt = self.start if level is None else level + 1
        return nxt if nxt <= self.rmax else None


@dataclass(frozen=True)
class H3MondrianParams:
    """``position_first``: cut H3 positions before the other dimensions; ``whole_domain``: what becomes of due
    records left at the root of an H3 geopoint, ``"publish"`` (as the whole domain) or ``"withhold"`` (left to the
    former: an earlier class covering them, else suppressed; module docstring)."""
    position_first: bool = True
    whole_domain: str = "publish"

    def __post_init__(self):
        check_bool(self.position_first, "position_first")
        check_choice(self.whole_domain, "whole_domain", ("publish", "withhold"))

    def check_config(self, sensitive: tuple[str, ...], qi_names: tuple[str, ...]) -> None:
        pass


class H3Mondrian:
    name = "h3-mondrian"
    uses_sensitive = False
    uses_due = True               # the former passes ``due=``: which rows must be placed at this close
    Params = H3MondrianParams

    def __init__(self, **params):
        self.params = H3MondrianParams(**params)

    def form_classes(self, X, units, k, space, rng=None, due: np.ndarray | None = None) -> list[np.ndarray]:
        n = len(X)
        if n == 0 or distinct_units(units) < k:
            return []
        width = np.where(space.width > 0, space.width, 1.0)
        geos = [GeoLevels(X, d, rmin, rmax, n_cells, space.lower)
                for _, d, rmin, rmax, n_cells in getattr(space, "h3_qis", ())]
        h3_dims = {g.d + a for g in geos for a in (0, 1)}
        other = np.array([j for j in range(X.shape[1]) if j not in h3_dims], dtype=np.int64)
        # units as 0, 1, ...: a (cell, unit) or (side, unit) pair is one integer key, counted with one sort
        units = np.unique(units, return_inverse=True)[1].reshape(-1)
        buf = _Buffer(X, X[:, other], units, int(units.max()) + 1, k, geos, other, width)
        out: list[np.ndarray] = []
        stack = [(np.arange(n), (None,) * len(geos), (UNKNOWN,) * len(geos))]
        while stack:
            idx, levels, blocked = stack.pop()
            # below 2k records no cut leaves k on both sides: a leaf (not 2k individuals, as Mondrian: one vehicle
            # drives through many cells, so two cells may hold k individuals each out of fewer than 2k)
            parts = self._cut(buf, idx, levels, blocked) if len(idx) >= 2 * k else None
            if parts is None:
                if due is None or not any(g.at_root(idx) for g in geos):
                    out.append(idx)
                else:
                    out += self._wait(idx, units, k, due, self.params.whole_domain == "withhold")
            else:
                stack += reversed(parts)          # depth first, parts in order (as split_recursively)
        return out

    @staticmethod
    def _wait(idx, units, k, due, withhold: bool) -> list[np.ndarray]:
        """A class left at the root of an H3 geopoint (it would publish the whole domain): its records that are
        not due wait for the next close, where more records may share their cells; the due ones form the class when
        they hold k individuals, else the whole part does (a due record needs the company)."""
        d = due[idx]
        if withhold or not d.any():
            return []
        if d.all() or distinct_units(units[idx[d]]) < k:
            return [idx]
        return [idx[d]]

    def _cut(self, buf: "_Buffer", idx, levels, blocked):
        """The parts ``[(rows, levels, blocked)]`` of one cut of ``idx``, or None when no dimension can be cut."""
        candidates = []          # (position-first rank, -span, order, kind, which)
        for g, geo in enumerate(buf.geos):
            if geo.next_level(levels[g]) is not None:
                candidates.append((0 if self.params.position_first else 1, -geo.span(levels[g]), g, "h3", g))
        if self.params.position_first:          # the positions first: the other spans only when no cell cuts
            for *_, g in sorted(candidates):
                parts, blocked = _cut_cells(buf, idx, levels, blocked, g)
                if parts is not None:
                    return parts
            candidates = []
        if len(buf.other):
            sub = buf.X_other[idx]
            span = (sub.max(axis=0) - sub.min(axis=0)) / buf.width[buf.other]
            candidates += [(1, -s, len(buf.geos) + j, "num", int(buf.other[j])) for j, s in enumerate(span) if s > 0]
        for *_, kind, which in sorted(candidates):
            if kind == "h3":
                parts, blocked = _cut_cells(buf, idx, levels, blocked, which)
            else:
                parts = _cut_median(buf, idx, levels, blocked, which)
            if parts is not None:
                return parts
        return None


@dataclass(frozen=True)
class _Buffer:
    """What every cut of one ``form_classes`` call reads: the codes, the columns that are not H3 positions, the
    units as 0, 1, ... (``n_units`` of them), k, the H3 geopoints, the domain widths."""
    X: np.ndarray
    X_other: np.ndarray
    units: np.ndarray
    n_units: int
    k: int
    geos: list
    other: np.ndarray
    width: np.ndarray


def _cut_median(buf: _Buffer, idx, levels, blocked, dim):
    """Mondrian's strict median cut of ``idx`` on ``dim`` when both halves hold k individuals, else None."""
    left = median_left(buf.X[idx, dim])
    if left.all() or not left.any():
        return None
    sides = np.unique(buf.units[idx] * 2 + left)          # distinct (unit, side) pairs; the left is side 1
    in_left = np.count_nonzero(sides & 1)
    if in_left >= buf.k and len(sides) - in_left >= buf.k:
        return [(idx[left], levels, blocked), (idx[~left], levels, blocked)]
    return None


def _cut_cells(buf: _Buffer, idx, levels, blocked, g):
    """Children of ``idx`` at the next resolution of H3 geopoint ``g`` holding k individuals; the rest pooled at
    this level (module docstring). Returns ``(parts, blocked)``: the parts or None, and ``blocked`` with what a
    failed cut tells of every subset of ``idx`` at this level (``blocked[g]``): a subset holds no more individuals
    per cell than ``idx``, so where ``idx`` has no child of k individuals (NO_CELL) none of its subsets has, and
    where it has one child ``x`` and a rest below k, a subset is cut only by going down into ``x`` whole."""
    geo, k = buf.geos[g], buf.k
    nxt = geo.next_level(levels[g])
    c = geo.cells[nxt][idx]
    if c[0] >= 0 and (c == c[0]).all():
        # every position in one child (a part holds k individuals): down as far as they share a cell, no split
        while nxt < geo.rmax and (c := geo.cells[nxt + 1][idx])[0] >= 0 and (c == c[0]).all():
            nxt += 1
        return [(idx, _with(levels, g, nxt), _with(blocked, g, UNKNOWN))], blocked
    if blocked[g] is not UNKNOWN:
        return None, blocked
    pair_cells = np.unique(c * buf.n_units + buf.units[idx]) // buf.n_units    # one entry per distinct (cell, unit)
    first = np.ones(len(pair_cells), dtype=bool)
    first[1:] = pair_cells[1:] != pair_cells[:-1]
    starts = np.flatnonzero(first)
    cells, counts = pair_cells[starts], np.diff(np.append(starts, len(pair_cells)))
    kept = np.flatnonzero((counts >= k) & (cells >= 0))
    if len(kept) == 0:
        return None, _with(blocked, g, NO_CELL)
    rest_mask = np.ones(len(idx), dtype=bool)
    children = []
    for cell in cells[kept].tolist():          # in cell-id order; each child's rows in the part's order
        rows = c == cell
        rest_mask &= ~rows
        children.append(idx[rows])
    rest = idx[rest_mask]
    rest_blocked = NO_CELL
    if len(rest) and distinct_units(buf.units[rest]) < k:
        if len(kept) == 1:
            # the pooled rest would take the only child back to this level
            return None, _with(blocked, g, int(cells[kept[0]]))
        smallest = int(np.argmin(counts[kept]))
        rest_blocked = int(cells[kept[smallest]])
        rest = np.sort(np.concatenate([children.pop(smallest), rest]))
    down = _with(levels, g, nxt)
    parts = [(child, down, _with(blocked, g, UNKNOWN)) for child in children]
    if len(rest):
        parts.append((rest, levels, _with(blocked, g, rest_blocked)))
    return parts, blocked


UNKNOWN, NO_CELL = None, -1       # what is known of a part's cut at an H3 geopoint's level (_cut_cells)


def _with(values: tuple, g: int, value) -> tuple:
    return values[:g] + (value,) + values[g + 1:]
