"""The quasi-identifier space: events -> interval codes, class boxes -> published generalizations and NCP.

Every quasi-identifier becomes one or two numeric dimensions:
- numeric and timestamp: the value (epoch seconds for timestamps) inside fixed configured bounds [L, U];
- categorical and station: the depth-first leaf code of the value in its hierarchy (see ``hierarchy.py``);
- geopoint: latitude and longitude, each a numeric dimension.
A missing value is encoded one domain width below L, so partitioning strategies separate missing from present
values first; a class holding a missing value publishes the whole domain for that attribute (it covers
"unknown" honestly).

Published time intervals are half-open, ``[from, to)``, and snapped outward to the configured granularity
(``[anonymization] time_granularity_s``, default 60 s): ``from = floor(min / g) * g``, ``to = floor(max / g) * g +
g``. A class whose members share one exact minute publishes ``[t, t + 60 s)``, never a zero-width interval; the
whole-domain interval of a missing time is snapped the same way. Numeric intervals are closed ``[from, to]``,
snapped outward the same way to the quasi-identifier's ``granularity`` within its domain (:func:`snap_numeric`):
no bound is a member's exact value off the grid.

**Positions along H3** (``hierarchy = "h3"``, ``resolutions = [rmin, rmax]``): a geopoint is still encoded as
latitude and longitude (partitioning strategies split on them), but a class publishes one H3 cell: the cell of
the finest resolution r in [rmin, rmax] at which all its members' positions fall in the same cell
(``h3.latlng_to_cell(lat, lon, r)``), else the whole domain (``"*"``). Its NCP counts cells:
``(7 ** (rmax - r) - 1) / (N - 1)`` (capped at 1), the share of the domain's finest cells it stands for, where N is
the number of resolution-rmax cells whose centres lie in the configured [lower, upper] box (1 for ``"*"``, 0 for a
cell at rmax). Its box for reuse tests is an axis-aligned box inside the cell (a record in it is in the cell; the
engine checks reuse exactly with h3 as well).

Normalized certainty penalty (NCP) per dimension is (hi - lo) / (U - L) of the published (snapped) interval
(Xu et al., "Utility-based anonymization using local recoding", KDD 2006; categorical form
(leaves(node) - 1) / (leaves(root) - 1) as in CASTLE, Cao et al., ICDE 2008). A record's NCP is the
weighted mean over attributes (a geopoint counts once, its two axes averaged).
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from functools import lru_cache
from itertools import repeat
from typing import Protocol

import numpy as np

from stream_anon.config import QuasiIdentifier
from stream_anon.h3cells import common_cell, common_cells, h3_package as _h3
from stream_anon.hierarchy import Hierarchy


@lru_cache(maxsize=8192)     # published bounds are snapped to the time granularity: few distinct values
def iso(ts: float) -> str:
    """ISO-8601 UTC form of epoch seconds; a time outside datetime's years 1-9999 (a schema-valid
    ``9999-12-31T23:59:59-23:59`` is one) keeps its number rather than raise inside a dead-letter reason.

    >>> iso(0.0), iso(253402387140.0)
    ('1970-01-01T00:00:00+00:00', '253402387140.0 s since the epoch')
    """
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()
    except (ValueError, OverflowError, OSError):
        return f"{ts!r} s since the epoch"


class HasQuasiIdentifiers(Protocol):
    """What :class:`QISpace` reads of a configuration: its quasi-identifiers (a :class:`StreamConfig`, or the
    evaluation's table of them; ``anonymization.time_granularity_s`` when present)."""

    @property
    def quasi_identifiers(self) -> tuple[QuasiIdentifier, ...]: ...


class QISpace:
    """Encodes flat events into an (n, D) float matrix and turns class boxes into published values."""

    def __init__(self, config: HasQuasiIdentifiers):
        self.qis: tuple[QuasiIdentifier, ...] = config.quasi_identifiers
        lower, upper, weight, owner = [], [], [], []
        for qi_index, qi in enumerate(self.qis):
            if qi.kind in ("categorical", "station"):
                lower.append(0.0)
                upper.append(float(_tree(qi).n_leaves - 1))
                weight.append(qi.weight)
            elif qi.kind == "geopoint":
                lower += list(qi.lower)
                upper += list(qi.upper)
                weight += [qi.weight / 2, qi.weight / 2]
            else:
                lower.append(qi.lower[0])
                upper.append(qi.upper[0])
                weight.append(qi.weight)
            owner += [qi_index] * qi.dims
        self.lower = np.array(lower)
        self.upper = np.array(upper)
        self.width = self.upper - self.lower
        total = sum(weight)
        self.weight = np.array(weight) / (total if total > 0 else 1.0)
        self.owner = np.array(owner)
        self.missing_code = self.lower - self.width   # below the domain: see module docstring
        self.dims = len(lower)
        g = float(getattr(getattr(config, "anonymization", None), "time_granularity_s", 60.0))
        self.granularity = g
        self.time_dims = np.array([d for d, qi_index in enumerate(owner)
                                   if self.qis[qi_index].kind == "timestamp"], dtype=np.int64)
        # H3 geopoints: (qi index, first dim, rmin, rmax, number of rmax cells of the domain)
        self.h3_qis: list[tuple[int, int, int, int, int]] = []
        d = 0
        for qi_index, qi in enumerate(self.qis):
            if qi.kind == "geopoint" and qi.h3 is not None:
                self.h3_qis.append((qi_index, d, qi.h3[0], qi.h3[1], h3_domain_cells(qi.lower, qi.upper, qi.h3[1])))
            d += qi.dims

    # -- encoding ---------------------------------------------------------------------------------------------
    def encode(self, columns: dict[str, list]) -> tuple[np.ndarray, list[str | None]]:
        """Encode QI columns (flat field path -> values) into codes.

        Returns the (n, D) code matrix and, per record, None or the reason it must be rejected
        (a value outside the configured domain or unknown to the hierarchy).
        """
        n = len(next(iter(columns.values()))) if columns else 0
        X = np.empty((n, self.dims))
        reasons: list[str | None] = [None] * n
        d = 0
        for qi in self.qis:
            if qi.kind == "geopoint":
                for axis, field in enumerate(qi.fields):
                    X[:, d + axis] = self._numeric(columns[field], d + axis, qi, reasons, field)
            else:
                values = _coalesce([columns[f] for f in qi.fields])
                if qi.kind in ("categorical", "station"):
                    codes = _leaf_codes(qi.hierarchy, values)
                    for i in np.flatnonzero(codes < 0):
                        if values[i] is None:
                            codes[i] = self.missing_code[d]
                        elif reasons[i] is None:
                            reasons[i] = f"{qi.name}: value is not in hierarchy {_tree(qi).name!r}"
                    X[:, d] = codes
                else:
                    X[:, d] = self._numeric(values, d, qi, reasons, qi.fields[0])
            d += qi.dims
        return X, reasons

    def _numeric(self, values, d, qi, reasons, field) -> np.ndarray:
        lo, hi = self.lower[d], self.upper[d]
        if qi.kind == "timestamp" and set(map(type, values)) == {str}:
            # the usual batch: time strings repeat at the source's resolution, each parsed once
            parsed = {v: _parse_iso(v) for v in dict.fromkeys(values)}
            if None not in parsed.values():
                out = np.fromiter(map(parsed.__getitem__, values), dtype=float, count=len(values))
                if ((out >= lo) & (out <= hi)).all():
                    return out
        out = np.empty(len(values))
        parse = parse_time if qi.kind == "timestamp" else _parse_number
        fast = _parse_iso if qi.kind == "timestamp" else None
        for i, v in enumerate(values):
            if v is None:
                out[i] = self.missing_code[d]
                continue
            x = fast(v) if fast is not None and type(v) is str else parse(v)
            if x is None:
                if reasons[i] is None:
                    reasons[i] = f"{qi.name}: {field} value is not a valid {qi.kind}"
                out[i] = self.missing_code[d]
            elif not lo <= x <= hi:
                if reasons[i] is None:
                    bounds = (iso(lo), iso(hi)) if qi.kind == "timestamp" else (lo, hi)
                    reasons[i] = f"{qi.name}: {field} value outside configured domain [{bounds[0]}, {bounds[1]}]"
                out[i] = self.missing_code[d]
            else:
                out[i] = x
        return out

    # -- generalization ---------------------------------------------------------------------------------------
    def snap(self, lo: np.ndarray, hi: np.ndarray, members: tuple | None = None) -> tuple[np.ndarray, np.ndarray, list]:
        """Snap raw class boxes (m, D) to publishable intervals; also returns category labels per box (and the
        H3 cell of an H3 geopoint). ``members``: ``(codes, starts)``, the codes of every box's records one box
        after the other, box j's from ``starts[j]``; with them an H3 cell is exact (every member in it), without
        them it is the common cell of the box's corners (an estimate, for the formers' loss tests)."""
        lo = lo.copy()
        hi = hi.copy()
        raw_lo = lo.copy()
        missing = lo < self.lower
        lo[missing] = self.lower[np.nonzero(missing)[1]]
        hi[missing] = self.upper[np.nonzero(missing)[1]]
        labels: list[dict] = [dict() for _ in range(len(lo))]
        d = 0
        for qi in self.qis:
            if qi.kind in ("categorical", "station"):
                tree = _tree(qi)
                for j in range(len(lo)):
                    nlo, nhi, label = tree.generalize(lo[j, d], hi[j, d])
                    lo[j, d], hi[j, d] = nlo, nhi
                    labels[j][qi.name] = label
            elif qi.kind == "geopoint" and qi.h3 is not None:
                cells = self._h3_cells(d, qi.h3, raw_lo, lo, hi, members)
                for j, cell in enumerate(cells):
                    labels[j][qi.name] = cell
                    if cell is None:
                        lo[j, d:d + 2], hi[j, d:d + 2] = self.lower[d:d + 2], self.upper[d:d + 2]
                    else:
                        (lo[j, d], hi[j, d]), (lo[j, d + 1], hi[j, d + 1]) = inner_box(cell)
            elif qi.kind == "geopoint" and qi.grid:
                for axis in (d, d + 1):
                    lo[:, axis] = np.maximum(self.lower[axis], np.floor(lo[:, axis] / qi.grid) * qi.grid)
                    hi[:, axis] = np.minimum(self.upper[axis], np.ceil(hi[:, axis] / qi.grid) * qi.grid)
            elif qi.kind == "timestamp":
                lo[:, d], hi[:, d] = snap_time(lo[:, d], hi[:, d], self.granularity)
            elif qi.kind == "numeric" and qi.granularity:
                lo[:, d], hi[:, d] = snap_numeric(lo[:, d], hi[:, d], qi.granularity, self.lower[d], self.upper[d])
            d += qi.dims
        return lo, hi, labels

    def _h3_cells(self, d: int, resolutions: tuple[int, int], raw_lo, lo, hi, members) -> list:
        """Per box, the cell of the H3 geopoint at columns d, d + 1 (:meth:`snap`): None for a box with a missing
        position (the whole domain), else the common cell of its members, or of its corners without them."""
        present = (raw_lo[:, d] >= self.lower[d]) & (raw_lo[:, d + 1] >= self.lower[d + 1])
        out: list = [None] * len(lo)
        which = np.flatnonzero(present)
        if not len(which):
            return out
        if members is not None:
            codes, starts = members
            sizes = np.diff(np.append(starts, len(codes)))
            rows = codes[np.repeat(present, sizes)]
            lat, lon, sizes = rows[:, d], rows[:, d + 1], sizes[present]
        else:
            lat = np.stack([lo[which, d], lo[which, d], hi[which, d], hi[which, d]], axis=1).ravel()
            lon = np.stack([lo[which, d + 1], hi[which, d + 1], lo[which, d + 1], hi[which, d + 1]], axis=1).ravel()
            sizes = np.full(len(which), 4)
        for j, cell in zip(which.tolist(), common_cells(lat, lon, np.cumsum(sizes) - sizes, resolutions)):
            out[j] = cell
        return out

    def ncp(self, lo: np.ndarray, hi: np.ndarray, labels: list | None = None) -> np.ndarray:
        """Weighted NCP of snapped boxes (m, D) -> (m,); an H3 geopoint counts cells (module docstring): from
        ``labels`` (of :meth:`snap`), else from the common cell of the snapped box's corners."""
        # a snapped time interval may reach past the domain by less than one granule: at most the whole domain
        per_dim = np.minimum((hi - lo) / self.width, 1.0)
        if self.h3_qis:
            per_dim = per_dim.copy()
            for qi_index, d, rmin, rmax, n_cells in self.h3_qis:
                name = self.qis[qi_index].name
                for j in range(len(lo)):
                    if labels is not None:
                        cell = labels[j][name]
                    elif lo[j, d] <= self.lower[d] and hi[j, d] >= self.upper[d]:
                        cell = None
                    else:
                        cell = common_cell(np.array([lo[j, d], hi[j, d]]), np.array([lo[j, d + 1], hi[j, d + 1]]),
                                           (rmin, rmax))
                    per_dim[j, d] = per_dim[j, d + 1] = h3_ncp(cell, rmax, n_cells)
        return per_dim @ self.weight

    def describe(self, lo: np.ndarray, hi: np.ndarray, labels: dict) -> dict:
        """The published form of one snapped box (docs/contracts.md section 5)."""
        out = {}
        d = 0
        for qi in self.qis:
            if qi.kind in ("categorical", "station"):
                out[qi.name] = {"label": labels[qi.name]}
            elif qi.kind == "geopoint" and qi.h3 is not None:
                cell = labels.get(qi.name)
                out[qi.name] = {"h3": "*"} if cell is None else {"h3": cell, "resolution": h3_resolution(cell)}
            elif qi.kind == "geopoint":
                out[qi.name] = {"lat": [_num(lo[d]), _num(hi[d])], "lon": [_num(lo[d + 1]), _num(hi[d + 1])]}
            elif qi.kind == "timestamp":
                out[qi.name] = {"from": iso(lo[d]), "to": iso(hi[d])}
            else:
                out[qi.name] = {"from": _num(lo[d]), "to": _num(hi[d])}
            d += qi.dims
        return out

    def in_published_cells(self, x: np.ndarray, generalization: dict) -> bool:
        """Whether a record's codes ``x`` lie in the H3 cells of a published generalization (True without H3)."""
        for qi_index, d, _, _, _ in self.h3_qis:
            cell = generalization[self.qis[qi_index].name].get("h3")
            if cell == "*":
                continue
            if x[d] < self.lower[d] or x[d + 1] < self.lower[d + 1]:
                return False                                      # a missing position: only "*" covers it
            if _h3().latlng_to_cell(float(x[d]), float(x[d + 1]), h3_resolution(cell)) != cell:
                return False
        return True

    def coverage_box(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Boxes for reuse tests: a dimension published as the whole domain also covers missing values."""
        full = (lo <= self.lower) & (hi >= self.upper)
        if len(self.time_dims):     # half-open [from, to): the closed test x <= hi must exclude ``to`` itself
            hi = hi.copy()
            hi[..., self.time_dims] = np.nextafter(hi[..., self.time_dims], -np.inf)
        return np.where(full, -np.inf, lo), np.where(full, np.inf, hi)


def snap_time(lo, hi, granularity: float):
    """Half-open time bounds ``[from, to)`` snapped outward to ``granularity`` seconds (never zero width).

    >>> snap_time(np.array([3600.0, 30.0]), np.array([3600.0, 150.0]), 60.0)
    (array([3600.,    0.]), array([3660.,  180.]))
    """
    g = float(granularity)
    return np.floor(lo / g) * g, (np.floor(hi / g) + 1.0) * g


# -- H3 -----------------------------------------------------------------------------------------------------------
def snap_numeric(lo, hi, granularity: float, lower: float, upper: float):
    """Closed numeric bounds ``[from, to]`` snapped outward to ``granularity`` as times are (``from = floor(min/g)
    * g``, ``to = floor(max/g) * g + g``), within the domain: a bound is a multiple of ``g`` or a domain bound,
    never a member's exact value off the grid, and never zero width.

    >>> [b.tolist() for b in snap_numeric(np.array([10345.0, 7.0]), np.array([10345.0, 19.0]), 1000.0, 0.0, 2e4)]
    [[10000.0, 0.0], [11000.0, 1000.0]]
    >>> [b.tolist() for b in snap_numeric(np.array([0.31, 0.3]), np.array([0.37, 0.3]), 0.1, 0.0, 0.35)]
    [[0.3, 0.3], [0.35, 0.35]]
    """
    g = float(granularity)
    f, t = np.floor(lo / g) * g, np.floor(hi / g) * g + g
    if not g.is_integer():        # 0.3 / 0.1 is 2.9999999999999996: bounds on the decimal grid
        f, t = np.floor(lo / g + 1e-9) * g, np.floor(hi / g + 1e-9) * g + g
        digits = max(0, -math.floor(math.log10(g))) + 6
        f, t = np.round(f, digits), np.round(t, digits)
        f = np.round(np.where(f > lo, f - g, f), digits)          # never inside a member after rounding
        t = np.round(np.where(t <= hi, t + g, t), digits)
    return np.maximum(f, lower), np.minimum(t, upper)


def _tree(qi: QuasiIdentifier) -> Hierarchy:
    """The hierarchy of a categorical or station QI (the configuration gives every one of them a hierarchy)."""
    if qi.hierarchy is None:
        raise ValueError(f"quasi-identifier {qi.name}: {qi.kind} without a hierarchy")
    return qi.hierarchy


def h3_resolution(cell: str) -> int:
    return int(_h3().get_resolution(cell))


@lru_cache(maxsize=1 << 16)
def inner_box(cell: str, margin: float = 0.98) -> tuple[tuple[float, float], tuple[float, float]]:
    """An axis-aligned (lat, lon) box inside ``cell``: centred on the cell centre, with the aspect of the cell's
    extent, grown by bisection while its corners and edge midpoints stay in the cell, then shrunk by ``margin``."""
    h3 = _h3()
    r = h3.get_resolution(cell)
    clat, clon = h3.cell_to_latlng(cell)
    boundary = np.array(h3.cell_to_boundary(cell))
    half = (boundary.max(axis=0) - boundary.min(axis=0)) / 2

    def inside(s: float) -> bool:
        a, o = s * half
        pts = [(clat + da * a, clon + do * o) for da in (-1, 0, 1) for do in (-1, 0, 1)]
        return all(h3.latlng_to_cell(p, q, r) == cell for p, q in pts)

    lo_s, hi_s = 0.0, 1.0
    for _ in range(14):     # 2^-14 of the extent: far below the margin, and a new cell's box costs half as much
        mid = (lo_s + hi_s) / 2
        lo_s, hi_s = (mid, hi_s) if inside(mid) else (lo_s, mid)
    a, o = lo_s * margin * half
    return (clat - a, clat + a), (clon - o, clon + o)


@lru_cache(maxsize=64)
def h3_domain_cells(lower: tuple, upper: tuple, rmax: int) -> int:
    """N of the H3 NCP: resolution-rmax cells whose centres lie in the domain box (by the domain's area over the
    average cell area when that is above 2 million cells), at least 2."""
    h3 = _h3()
    (la0, lo0), (la1, lo1) = lower, upper
    lat_km = (la1 - la0) * 111.32
    lon_km = (lo1 - lo0) * 111.32 * math.cos(math.radians((la0 + la1) / 2))
    estimate = lat_km * lon_km / h3.average_hexagon_area(rmax, "km^2")
    if estimate > 2e6:
        return max(2, int(round(estimate)))
    poly = h3.LatLngPoly([(la0, lo0), (la0, lo1), (la1, lo1), (la1, lo0)])
    return max(2, len(h3.h3shape_to_cells(poly, rmax)))


def h3_ncp(cell: str | None, rmax: int, n_cells: int) -> float:
    """NCP of a published H3 cell: (7^(rmax - r) - 1) / (N - 1), capped at 1; 1 for the whole domain."""
    if cell is None:
        return 1.0
    return min(1.0, (7.0 ** (rmax - h3_resolution(cell)) - 1.0) / (n_cells - 1.0))


def _num(x: float):
    # Exact value: rounding a bound inward would publish an interval that misses its own members.
    return int(x) if float(x).is_integer() else float(x)


def _leaf_codes(hierarchy, values) -> np.ndarray:
    """``hierarchy.codes`` of the values' text (None and unknown values: -1), as floats; one pass."""
    codes = hierarchy.codes
    try:
        get = hierarchy.leaf_code.get
    except AttributeError:                                   # pragma: no cover - another hierarchy class
        return codes(None if v is None else str(v) for v in values).astype(float)
    if set(map(type, values)) == {str}:     # the usual batch: a C-level loop
        return np.fromiter(map(get, values, repeat(-1)), dtype=float, count=len(values))
    return np.array([get(v, -1) if type(v) is str else (-1 if v is None else get(str(v), -1)) for v in values],
                    dtype=float)


def _coalesce(cols: list[list]) -> list:
    if len(cols) == 1:
        return cols[0]
    out = cols[0]
    for col in cols[1:]:
        out = [v if v is not None else w for v, w in zip(out, col)]
    return out


def _parse_number(v) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@lru_cache(maxsize=1 << 16)
def _parse_iso(v: str) -> float | None:
    try:
        ts = datetime.fromisoformat(v)
    except ValueError:
        return None
    return ts.timestamp() if ts.tzinfo else None


def parse_time(v) -> float | None:
    """Epoch seconds of an ISO-8601 time with UTC offset (or a number of epoch seconds); None if invalid.

    Cached: event times repeat a lot at the source's resolution (Oyster has minutes)."""
    if isinstance(v, str):
        return _parse_iso(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, datetime) or hasattr(v, "tzinfo"):     # datetime or pandas Timestamp
        return float(v.timestamp()) if getattr(v, "tzinfo", None) is not None else None
    return None
