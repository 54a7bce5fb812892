"""The quasi-identifier space: events -> interval codes, class boxes -> published generalizations and NCP.

Every quasi-identifier becomes one or two numeric dimensions:
- numeric and timestamp: the value (epoch seconds for timestamps) inside fixed configured bounds [L, U];
- categorical and station: the depth-first leaf code of the value in its hierarchy (see ``hierarchy.py``);
- geopoint: latitude and longitude, each a numeric dimension.
A missing value is encoded one domain width below L, so partitioning strategies separate missing from present
values first; a class holding a missing value publishes the whole domain for that attribute (it covers
"unknown" honestly).

Normalized certainty penalty (NCP) per dimension is (hi - lo) / (U - L) of the published (snapped) interval
(Xu et al., "Utility-based anonymization using local recoding", KDD 2006; categorical form
(leaves(node) - 1) / (leaves(root) - 1) as in CASTLE, Cao et al., ICDE 2008). A record's NCP is the
weighted mean over attributes (a geopoint counts once, its two axes averaged).
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from functools import lru_cache

import numpy as np

from stream_anon.config import QuasiIdentifier, StreamConfig


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


class QISpace:
    """Encodes flat events into an (n, D) float matrix and turns class boxes into published values."""

    def __init__(self, config: StreamConfig):
        self.qis: tuple[QuasiIdentifier, ...] = config.quasi_identifiers
        lower, upper, weight, owner = [], [], [], []
        for qi_index, qi in enumerate(self.qis):
            if qi.kind in ("categorical", "station"):
                lower.append(0.0)
                upper.append(float(qi.hierarchy.n_leaves - 1))
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
                            reasons[i] = f"{qi.name}: value {values[i]!r} is not in hierarchy {qi.hierarchy.name!r}"
                    X[:, d] = codes
                else:
                    X[:, d] = self._numeric(values, d, qi, reasons, qi.fields[0])
            d += qi.dims
        return X, reasons

    def _numeric(self, values, d, qi, reasons, field) -> np.ndarray:
        out = np.empty(len(values))
        lo, hi = self.lower[d], self.upper[d]
        parse = parse_time if qi.kind == "timestamp" else _parse_number
        fast = _parse_iso if qi.kind == "timestamp" else None
        for i, v in enumerate(values):
            if v is None:
                out[i] = self.missing_code[d]
                continue
            x = fast(v) if fast is not None and type(v) is str else parse(v)
            if x is None:
                if reasons[i] is None:
                    reasons[i] = f"{qi.name}: {field} value {v!r} is not a valid {qi.kind}"
                out[i] = self.missing_code[d]
            elif not lo <= x <= hi:
                if reasons[i] is None:
                    shown = iso(x) if qi.kind == "timestamp" else x
                    bounds = (iso(lo), iso(hi)) if qi.kind == "timestamp" else (lo, hi)
                    reasons[i] = f"{qi.name}: {field} value {shown} outside configured domain [{bounds[0]}, {bounds[1]}]"
                out[i] = self.missing_code[d]
            else:
                out[i] = x
        return out

    # -- generalization ---------------------------------------------------------------------------------------
    def snap(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
        """Snap raw class boxes (m, D) to publishable intervals; also returns category labels per box."""
        lo = lo.copy()
        hi = hi.copy()
        missing = lo < self.lower
        lo[missing] = self.lower[np.nonzero(missing)[1]]
        hi[missing] = self.upper[np.nonzero(missing)[1]]
        labels = [dict() for _ in range(len(lo))]
        d = 0
        for qi in self.qis:
            if qi.kind in ("categorical", "station"):
                for j in range(len(lo)):
                    nlo, nhi, label = qi.hierarchy.generalize(lo[j, d], hi[j, d])
                    lo[j, d], hi[j, d] = nlo, nhi
                    labels[j][qi.name] = label
            elif qi.kind == "geopoint" and qi.grid:
                for axis in (d, d + 1):
                    lo[:, axis] = np.maximum(self.lower[axis], np.floor(lo[:, axis] / qi.grid) * qi.grid)
                    hi[:, axis] = np.minimum(self.upper[axis], np.ceil(hi[:, axis] / qi.grid) * qi.grid)
            d += qi.dims
        return lo, hi, labels

    def ncp(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Weighted NCP of snapped boxes (m, D) -> (m,)."""
        return ((hi - lo) / self.width) @ self.weight

    def describe(self, lo: np.ndarray, hi: np.ndarray, labels: dict) -> dict:
        """The published form of one snapped box (docs/contracts.md section 5)."""
        out = {}
        d = 0
        for qi in self.qis:
            if qi.kind in ("categorical", "station"):
                out[qi.name] = {"label": labels[qi.name]}
            elif qi.kind == "geopoint":
                out[qi.name] = {"lat": [_num(lo[d]), _num(hi[d])], "lon": [_num(lo[d + 1]), _num(hi[d + 1])]}
            elif qi.kind == "timestamp":
                out[qi.name] = {"from": iso(lo[d]), "to": iso(hi[d])}
            else:
                out[qi.name] = {"from": _num(lo[d]), "to": _num(hi[d])}
            d += qi.dims
        return out

    def coverage_box(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Boxes for reuse tests: a dimension published as the whole domain also covers missing values."""
        full = (lo <= self.lower) & (hi >= self.upper)
        return np.where(full, -np.inf, lo), np.where(full, np.inf, hi)


def _num(x: float):
    # Exact value: rounding a bound inward would publish an interval that misses its own members.
    return int(x) if float(x).is_integer() else float(x)


def _leaf_codes(hierarchy, values) -> np.ndarray:
    """``hierarchy.codes`` of the values' text (None and unknown values: -1), as floats; one pass."""
    codes = hierarchy.codes
    try:
        get = hierarchy._code.get
    except AttributeError:                                   # pragma: no cover - another hierarchy class
        return codes(None if v is None else str(v) for v in values).astype(float)
    return np.array([get(v, -1) if type(v) is str else (-1 if v is None else get(str(v), -1)) for v in values],
                    dtype=float)


def _coalesce(cols: list[list]) -> list:
    if len(cols) == 1:
        return cols[0]
    out = list(cols[0])
    for col in cols[1:]:
        for i, v in enumerate(out):
            if v is None:
                out[i] = col[i]
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
