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

The cut is computed one depth at a time, every part of that depth at once (numpy sorts over all their rows; a
recursive cut would pay numpy's per-call cost once per part), and the leaves are returned in the order a recursive,
depth-first cut gives them.

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
from stream_anon.strategies.partition import distinct_units
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
        # row i: resolution start + i
        self.codes = np.stack([dense_codes(cells[r - rmin]) for r in range(self.start, rmax + 1)])
        self.n_codes = int(self.codes.max()) + 1 if self.codes.size else 1

    def shared(self, rows: np.ndarray, seg: np.ndarray, resolutions: slice = slice(None)) -> np.ndarray:
        """(parts, resolutions): whether part j (rows ``rows[seg[j]:seg[j + 1]]``) has its positions in one cell of
        each resolution (``resolutions`` of start..finest)."""
        c = self.codes[resolutions, rows]
        low = np.minimum.reduceat(c, seg, axis=1)
        return ((low >= 0) & (low == np.maximum.reduceat(c, seg, axis=1))).T

    def span(self, level: np.ndarray) -> np.ndarray:
        """NCP of parts at ``level`` (-1: the root, the whole domain)."""
        return np.array([1.0 if r < 0 else self.ncp[r] for r in level.tolist()])


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
        geos = [GeoLevels(X, d, rmin, rmax, n_cells, space.lower)
                for _, d, rmin, rmax, n_cells in getattr(space, "h3_qis", ())]
        h3_dims = {g.d + a for g in geos for a in (0, 1)}
        other = np.array([j for j in range(X.shape[1]) if j not in h3_dims], dtype=np.int64)
        # units as 0, 1, ...: a (part, cell, unit) or (part, unit, side) triple is one integer key, counted by a sort
        units = np.unique(units, return_inverse=True)[1].reshape(-1)
        cut = _Cuts(X, units, int(units.max()) + 1, k, geos, other, np.where(space.width > 0, space.width, 1.0),
                    self.params.position_first)
        leaves: list[tuple[tuple, np.ndarray, bool]] = []       # (path, rows, left at the root of a geopoint)
        parts = _Parts.root(n, len(geos))
        while len(parts.rows):
            children = _Children(parts)
            # below 2k records no cut leaves k on both sides: a leaf (not 2k individuals, as Mondrian: one vehicle
            # drives through many cells, so two cells may hold k individuals each out of fewer than 2k)
            is_cut = cut.all_parts(parts, parts.sizes >= 2 * k, children)
            at_root = np.zeros(len(parts.paths), dtype=bool)
            for g in geos:
                at_root |= ~g.shared(parts.rows, parts.seg, slice(0, 1))[:, 0]
            for j in np.flatnonzero(~is_cut).tolist():
                leaves.append((parts.paths[j], parts.rows[parts.seg[j]:parts.seg[j] + parts.sizes[j]], at_root[j]))
            parts = children.done()
        leaves.sort(key=lambda leaf: leaf[0])               # depth first, parts in order (as split_recursively)
        withhold = self.params.whole_domain == "withhold"
        out: list[np.ndarray] = []
        for _, idx, root in leaves:
            if due is None or not root:
                out.append(idx)
            else:
                out += self._wait(idx, units, k, due, withhold)
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


UNKNOWN, NO_CELL = -2, -1       # what is known of a part's cut at an H3 geopoint's level (_Cuts.cells)


class _Parts:
    """The parts of one depth of the cut, all at once: ``rows`` grouped by part (each part's rows ascending, as
    cut from its parent), ``seg``/``sizes`` where each part's rows start and how many; per part its resolution at
    each H3 geopoint (``level``, -1: the root), what is known of its cut there (``blocked``: UNKNOWN, NO_CELL, or
    the one child cell a subset may only descend into; _Cuts.cells) and its ``path``, the ordinals of the cuts that
    made it from the root: leaves in path order are the depth-first order of a recursive Mondrian."""

    def __init__(self, rows, part, level, blocked, paths):
        self.rows, self.level, self.blocked, self.paths = rows, level, blocked, paths
        self.seg = np.searchsorted(part, np.arange(len(paths)))
        self.sizes = np.diff(np.append(self.seg, len(rows)))

    @classmethod
    def root(cls, n: int, n_geos: int) -> "_Parts":
        return cls(np.arange(n), np.zeros(n, dtype=np.int64), np.full((1, n_geos), -1, dtype=np.int64),
                   np.full((1, n_geos), UNKNOWN, dtype=np.int64), [()])

    def positions(self, which: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For parts ``which`` (ascending): the positions of their rows in ``rows``, each row's index into
        ``which``, and where each part's rows start among those positions."""
        sizes = self.sizes[which]
        local = np.repeat(np.arange(len(which)), sizes)
        starts = np.cumsum(sizes) - sizes
        pos = self.seg[which][local] + (np.arange(len(local)) - starts[local])
        return pos, local, starts


class _Children:
    """The parts the cuts of one depth make: each row of the parents gets its child's label (-1: a leaf's row)."""

    def __init__(self, parents: _Parts):
        self.parents = parents
        self.label = np.full(len(parents.rows), -1, dtype=np.int64)
        # one array per add(), concatenated by done()
        self.parent: list[np.ndarray] = []
        self.ordinal: list[np.ndarray] = []
        self.level: list[np.ndarray] = []
        self.blocked: list[np.ndarray] = []
        self.count = 0

    def add(self, parent: np.ndarray, ordinal: np.ndarray, level: np.ndarray, blocked: np.ndarray) -> np.ndarray:
        """New parts (children of ``parent``, ``ordinal``-th of their cut); returns their labels."""
        labels = np.arange(self.count, self.count + len(parent))
        self.count += len(parent)
        self.parent.append(parent)
        self.ordinal.append(ordinal)
        self.level.append(level)
        self.blocked.append(blocked)
        return labels

    def done(self) -> _Parts:
        keep = self.label >= 0
        order = np.argsort(self.label[keep], kind="stable")         # stable: each part's rows stay ascending
        rows, part = self.parents.rows[keep][order], self.label[keep][order]
        n_geos = self.parents.level.shape[1]
        if not self.count:
            return _Parts(rows, part, np.empty((0, n_geos), dtype=np.int64), np.empty((0, n_geos), dtype=np.int64),
                          [])
        paths = self.parents.paths
        new_paths = [paths[p] + (o,) for p, o in zip(np.concatenate(self.parent).tolist(),
                                                        np.concatenate(self.ordinal).tolist())]
        return _Parts(rows, part, np.concatenate(self.level), np.concatenate(self.blocked), new_paths)


def _with(table: np.ndarray, g: np.ndarray, column) -> np.ndarray:
    """``table`` (parts, geopoints) with row j's entry at geopoint ``g[j]`` set to ``column`` (or its j-th)."""
    out = table.copy()
    out[np.arange(len(out)), g] = column
    return out


def _run_starts(values: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts (bool per entry)."""
    out = np.ones(len(values), dtype=bool)
    out[1:] = values[1:] != values[:-1]
    return out


def _distinct(columns: list[np.ndarray], bounds: list[int]) -> list[np.ndarray]:
    """The distinct rows of integer columns (``0 <= columns[i] < bounds[i]``), in sorted order, as columns: one
    sort of a packed key when the key fits in 62 bits, else a lexsort."""
    if not len(columns[0]):
        return list(columns)
    total = 1
    for b in bounds:
        total *= int(b)
    if total < 1 << 62:
        key = columns[0].astype(np.int64)
        for col, b in zip(columns[1:], bounds[1:]):
            key = key * int(b) + col
        key = np.sort(key)
        key = key[_run_starts(key)]
        out = []
        for b in reversed(bounds[1:]):
            key, rest = np.divmod(key, int(b))
            out.append(rest)
        return [key, *reversed(out)]
    order = np.lexsort(columns[::-1])
    cols = [c[order] for c in columns]
    new = np.zeros(len(order), dtype=bool)
    new[0] = True
    for c in cols:
        new[1:] |= c[1:] != c[:-1]
    return [c[new] for c in cols]


class _Cuts:
    """The cuts of every part of one depth at once: for each part its candidate dimensions in Mondrian's order
    (H3 geopoints first with ``position_first``, then the widest normalized span; ties by dimension), each tried
    on the parts not yet cut: :meth:`cells` along an H3 geopoint, :meth:`median` on another dimension."""

    def __init__(self, X, units, n_units, k, geos, other, width, position_first):
        self.X, self.units, self.n_units, self.k, self.geos = X, units, n_units, k, geos
        self.other, self.width, self.position_first = other, width, position_first
        self.X_other = X[:, other]
        # every geopoint's cell codes in one array (geopoint, resolution from its start, row); -1 past its finest
        depth = max((geo.codes.shape[0] for geo in geos), default=0)
        self.codes = np.full((len(geos), depth, len(X)), -1, dtype=np.int64)
        for g, geo in enumerate(geos):
            self.codes[g, :geo.codes.shape[0]] = geo.codes
        self.start = np.array([geo.start for geo in geos], dtype=np.int64)
        self.n_codes = max((geo.n_codes for geo in geos), default=1)

    def all_parts(self, parts: _Parts, todo: np.ndarray, children: _Children) -> np.ndarray:
        """Cut the parts ``todo`` (bool per part), adding the children to ``children``; returns which were cut."""
        is_cut = np.zeros(len(parts.paths), dtype=bool)
        which = np.flatnonzero(todo)
        if not len(which):
            return is_cut
        candidates = self._candidates(parts, which)
        pending = np.ones(len(which), dtype=bool)
        G = len(self.geos)
        for dims in candidates.T:
            for sel in (np.flatnonzero(pending & (dims >= 0) & (dims < G)), np.flatnonzero(pending & (dims >= G))):
                if len(sel):
                    ok = (self.cells(parts, which[sel], dims[sel], children) if dims[sel[0]] < G
                          else self.median(parts, which[sel], self.other[dims[sel] - G], children))
                    pending[sel[ok]] = False
            if not pending.any():
                break
        is_cut[which[~pending]] = True
        return is_cut

    def _candidates(self, parts: _Parts, which: np.ndarray) -> np.ndarray:
        """(parts, dimensions): each part's dimensions in the order they are tried (H3 geopoint g as g, other
        dimension j as len(geos) + j), -1 where none is left (a finest level, a span of 0)."""
        G, D = len(self.geos), len(self.other)
        rank = np.full((len(which), G + D), 2)
        span = np.zeros((len(which), G + D))
        for g, geo in enumerate(self.geos):
            level = parts.level[which, g]
            rank[:, g] = np.where(level < geo.rmax, 0 if self.position_first else 1, 2)
            span[:, g] = geo.span(level)
        if D:
            pos, _, starts = parts.positions(which)
            sub = self.X_other[parts.rows[pos]]
            span[:, G:] = (np.maximum.reduceat(sub, starts) - np.minimum.reduceat(sub, starts)) / self.width[self.other]
            rank[:, G:] = np.where(span[:, G:] > 0, 1, 2)
        dims = np.broadcast_to(np.arange(G + D), rank.shape)
        order = np.lexsort((dims, -span, rank), axis=-1)
        return np.where(np.take_along_axis(rank, order, axis=-1) < 2, order, -1)

    def median(self, parts: _Parts, which: np.ndarray, dim: np.ndarray, children: _Children) -> np.ndarray:
        """Mondrian's strict median cut of each part on its column ``dim`` (values below the median, or up to it
        when none is below), kept when both halves hold k individuals; returns which parts were cut."""
        pos, local, starts = parts.positions(which)
        sizes = parts.sizes[which]
        rows = parts.rows[pos]
        vals = self.X[rows, dim[local]]
        median = vals[np.lexsort((vals, local))][starts + sizes // 2]
        left = vals < median[local]
        none = np.bincount(local[left], minlength=len(which)) == 0
        left |= none[local] & (vals <= median[local])
        n_left = np.bincount(local[left], minlength=len(which))
        part, _, side = _distinct([local, self.units[rows], left.astype(np.int64)], [len(which), self.n_units, 2])
        in_left = np.bincount(part[side == 1], minlength=len(which))
        in_right = np.bincount(part[side == 0], minlength=len(which))
        ok = (n_left > 0) & (n_left < sizes) & (in_left >= self.k) & (in_right >= self.k)
        if ok.any():
            two = np.repeat(which[ok], 2)
            labels = children.add(two, np.tile([0, 1], ok.sum()), parts.level[two], parts.blocked[two])
            mine = ok[local]
            children.label[pos[mine]] = labels[2 * np.cumsum(ok)[local[mine]] - 2 + (~left[mine])]
        return ok

    def cells(self, parts: _Parts, which: np.ndarray, g: np.ndarray, children: _Children) -> np.ndarray:
        """Cut each part into its cells of the next resolution of its H3 geopoint ``g`` (module docstring);
        returns which parts were cut. A failed cut is recorded in ``parts.blocked`` for the part's subsets at this
        level: a subset holds no more individuals per cell than its part, so where the part has no child of k
        individuals (NO_CELL) none of its subsets has, and where it has one child x and a rest below k, a subset
        is cut only by going down into x whole."""
        k, own = self.k, np.arange(len(which))
        level = parts.level[which, g]
        nxt = np.where(level < 0, self.start[g], level + 1) - self.start[g]       # from the geopoint's start
        pos, local, starts = parts.positions(which)
        rows = parts.rows[pos]
        every = self.codes[g[local], :, rows]                     # (rows, resolutions)
        c = every[np.arange(len(rows)), nxt[local]]
        low = np.minimum.reduceat(every, starts)
        shared = (low >= 0) & (low == np.maximum.reduceat(every, starts))       # (parts, resolutions)
        one = shared[own, nxt]
        ok = one.copy()
        if one.any():
            # every position in one child (a part holds k individuals): down as far as they share a cell, no split
            breaks = (np.arange(shared.shape[1]) > nxt[:, None]) & ~shared
            depth = self.start[g] - 1 + np.where(breaks.any(axis=1), np.argmax(breaks, axis=1), shared.shape[1])
            labels = children.add(which[one], np.zeros(one.sum(), dtype=np.int64),
                                  _with(parts.level[which[one]], g[one], depth[one]),
                                  _with(parts.blocked[which[one]], g[one], UNKNOWN))
            children.label[pos[one[local]]] = labels[np.cumsum(one)[local[one[local]]] - 1]
        todo = ~one & (parts.blocked[which, g] == UNKNOWN)
        if not todo.any():
            return ok
        mine = todo[local]
        tl, tc, tu, tpos = local[mine], c[mine], self.units[rows[mine]], pos[mine]
        n_codes = self.n_codes + 1                # cells shifted by one: -1 (no position) is 0
        dl, dc, du = _distinct([tl, tc + 1, tu], [len(which), n_codes, self.n_units])     # (part, cell, unit)
        gstart = np.flatnonzero(_run_starts(dl) | _run_starts(dc))
        g_part, g_cell = dl[gstart], dc[gstart] - 1
        g_count = np.diff(np.append(gstart, len(dl)))          # individuals per (part, cell)
        kept = (g_count >= k) & (g_cell >= 0)
        n_kept = np.bincount(g_part[kept], minlength=len(which))
        # the rest of a part: its rows in cells below k individuals, and how many individuals they hold
        rest_trip = ~np.repeat(kept, g_count)
        rest_part, _ = _distinct([dl[rest_trip], du[rest_trip]], [len(which), self.n_units])
        rest_units = np.bincount(rest_part, minlength=len(which))
        row_group = np.searchsorted(g_part * n_codes + dc[gstart], tl * n_codes + tc + 1)
        row_kept = kept[row_group]
        rest_rows = np.bincount(tl[~row_kept], minlength=len(which))
        short = todo & (rest_rows > 0) & (rest_units < k)
        kept_groups = np.flatnonzero(kept)
        # the smallest kept child of each part (fewest individuals, then lowest cell): joins a short rest
        by_size = kept_groups[np.lexsort((g_cell[kept_groups], g_count[kept_groups], g_part[kept_groups]))]
        smallest = np.full(len(which), -1)
        by_part = g_part[by_size]
        first_kept = _run_starts(by_part)
        smallest[by_part[first_kept]] = by_size[first_kept]
        fail_none = todo & (n_kept == 0)
        fail_one = short & (n_kept == 1)
        blocked = parts.blocked[which, g]
        blocked[fail_none] = NO_CELL
        blocked[fail_one] = g_cell[smallest[fail_one]]
        parts.blocked[which, g] = blocked
        success = todo & ~fail_none & ~fail_one
        merged = success & short
        # children: the kept cells of a cut part but its merged one, in cell order, then the rest if any
        child_groups = kept_groups[success[g_part[kept_groups]]]
        child_groups = child_groups[~(merged[g_part[child_groups]] & (smallest[g_part[child_groups]] == child_groups))]
        cp = g_part[child_groups]
        first_of_part = np.searchsorted(cp, cp)
        ordinal = np.arange(len(cp)) - first_of_part
        group_label = np.full(len(g_part), -1)
        group_label[child_groups] = children.add(which[cp], ordinal,
                                                 _with(parts.level[which[cp]], g[cp], self.start[g[cp]] + nxt[cp]),
                                                 _with(parts.blocked[which[cp]], g[cp], UNKNOWN))
        has_rest = success & ((rest_rows > 0) | merged)
        rp = np.flatnonzero(has_rest)
        n_children = np.bincount(cp, minlength=len(which))
        rest_label = np.full(len(which), -1)
        rest_label[rp] = children.add(which[rp], n_children[rp], parts.level[which[rp]],
                                      _with(parts.blocked[which[rp]], g[rp],
                                            np.where(merged[rp], g_cell[smallest[rp]], NO_CELL)))
        lab = group_label[row_group]
        lab = np.where(lab >= 0, lab, rest_label[tl])
        take = success[tl]
        children.label[tpos[take]] = lab[take]
        ok |= success
        return ok
