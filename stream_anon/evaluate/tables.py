"""Evaluation tables: a dataset ready for batch evaluation (:class:`EvalTable`): QI codes in the engine's
:class:`~stream_anon.engine.space.QISpace`, the individual of each row, and the columns the metrics, the KPI and the
AOI attack read. Adult (UCI, with ARX's hierarchies), the stream datasets with the QIs of ``configs/<name>.toml``,
and a user's own events through a stream config (:func:`table_from_events`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypedDict

import numpy as np
import pandas as pd

from stream_anon import contract
from stream_anon.config import QuasiIdentifier
from stream_anon.engine.space import QISpace
from stream_anon.hierarchy import Hierarchy

EVAL_DATASETS = ("adult", "oyster", "citibike", "obd2")
# The public reference (qiyuangong/Basic_Mondrian README: "12.19% (strict)" on Adult at k = 10) codes
# education as UCI's education_num; this is that order.
EDUCATION_NUM = ("Preschool", "1st-4th", "5th-6th", "7th-8th", "9th", "10th", "11th", "12th", "HS-grad",
                 "Some-college", "Assoc-voc", "Assoc-acdm", "Bachelors", "Masters", "Prof-school", "Doctorate")


@dataclass
class KPISpec:
    """Utility Demonstrator: share of records with ``event``, overall and per group of ``group_column``."""
    name: str
    event: np.ndarray
    group_column: str | None
    groups: dict


@dataclass
class PositionSpec:
    """A position carried by each record: the true coordinates and how the release reveals a cell.

    ``dims``: (lat dim, lon dim) of a geopoint QI (a box inside one cell reveals it), or ``station_dim`` with
    ``station_coords`` (a released station leaf with known coordinates reveals its cell)."""
    lat: np.ndarray
    lon: np.ndarray
    dims: tuple[int, int] | None = None
    station_dim: int | None = None
    station_coords: dict = field(default_factory=dict)


@dataclass
class EvalTable:
    """A dataset ready for batch evaluation: codes for the strategies, columns for the metrics."""
    name: str
    space: QISpace
    X: np.ndarray                   # (n, D) codes
    units: np.ndarray               # (n,) int individual ids
    original: pd.DataFrame          # one column per QI dimension + sensitive + individual
    columns: list[str]              # metric column of every QI dimension
    weights: dict[str, float]       # NCP weight per column (a geopoint's two axes share one QI's weight)
    hierarchies: dict[str, Hierarchy]
    bounds: dict[str, tuple[float, float]]
    sensitive: str | None
    kpi: KPISpec | None = None
    positions: list[PositionSpec] = field(default_factory=list)
    rejected: int = 0
    encoding: str = "hierarchy"
    times: np.ndarray | None = None  # event times (own data: the engine's windows for the offline baseline)

    @property
    def n(self) -> int:
        return len(self.X)


class _Quasi:
    """What ``QISpace`` reads from a configuration: the quasi-identifiers only."""
    def __init__(self, qis):
        self.quasi_identifiers = tuple(qis)


def adult_table(full: bool = False, limit: int | None = None, encoding: str = "hierarchy") -> EvalTable:
    """Adult with the eight QIs of the Mondrian reference; sensitive ``salary-class``; one row = one person.

    ``encoding="hierarchy"``: age numeric over the data's range, the other seven categorical with ARX's
    hierarchies (NCP of a categorical cell: (leaves(node) - 1) / (leaves(root) - 1)).
    ``encoding="codes"``: the public reference's protocol (qiyuangong/Mondrian, whose Basic_Mondrian README
    states 12.19% strict at k = 10): every QI numeric, categorical values coded 0.. in order of first
    appearance in the file (its "intuitive order"), education as education_num, NCP = unweighted mean over the
    eight QIs of (max - min) / (domain max - domain min) of each class's codes.
    """
    from stream_anon.datasets import adult

    if encoding not in ("hierarchy", "codes"):
        raise ValueError(f"adult encoding must be 'hierarchy' or 'codes', got {encoding!r}")
    table_path, hier_dir = adult.paths(full)
    df = adult.read_adult(table_path, limit=limit)
    hier = adult.load_hierarchies(hier_dir)
    qis, cols, original = [], [], pd.DataFrame(index=df.index)
    hierarchies, bounds = {}, {}
    for c in adult.QUASI_IDENTIFIERS:
        if c in adult.NUMERIC or encoding == "codes":
            if c in adult.NUMERIC:
                values = df[c].astype(float)
            elif c == "education":
                values = df[c].map({v: i for i, v in enumerate(EDUCATION_NUM)}).astype(float)
            else:
                values = pd.Series(pd.factorize(df[c])[0], index=df.index, dtype=float)  # first appearance
            lo, hi = float(values.min()), float(values.max())
            qis.append(QuasiIdentifier(c, (c,), "numeric", (lo,), (hi,)))
            original[c] = values
            bounds[c] = (lo, hi)
        else:
            qis.append(QuasiIdentifier(c, (c,), "categorical", hierarchy=hier[c]))
            original[c] = df[c]
            hierarchies[c] = hier[c]
        cols.append(c)
    space = QISpace(_Quasi(qis))
    X, reasons = space.encode({c: original[c].tolist() for c in cols})
    assert all(r is None for r in reasons), "adult: every value is in its hierarchy (checked by the loader test)"
    original[adult.SENSITIVE] = df[adult.SENSITIVE]
    original["_individual"] = np.arange(len(df))
    if encoding == "codes":
        codes = {v: float(i) for i, v in enumerate(pd.unique(df["sex"]))}
        groups: dict[str, tuple[float, float] | set[str]] = {g: (codes[g] - 0.5, codes[g] + 0.5)
                                                             for g in ("Male", "Female")}
    else:
        groups = {"Male": {"Male"}, "Female": {"Female"}}
    kpi = KPISpec("share with salary >50K", (df[adult.SENSITIVE] == ">50K").to_numpy(), "sex", groups)
    return EvalTable("adult", space, X, np.arange(len(df)), original, cols, {c: 1.0 for c in cols}, hierarchies,
                     bounds, adult.SENSITIVE, kpi=kpi, encoding=encoding)


class _StreamSpec(TypedDict):
    """A bundled stream's evaluation: its sensitive field, and its KPI (name, field, predicate, group column,
    groups: label -> (low, high) interval or set of values)."""
    sensitive: str
    kpi: tuple[str, str, Callable[[Any], bool], str, dict]


# stream datasets: sensitive column for the l / EMD / knowledge-gain metrics, and the KPI of the utility check
_STREAM_SPECS: dict[str, _StreamSpec] = {
    "citibike": {"sensitive": "payload.usertype",
                 "kpi": ("share of subscriber trips", "payload.usertype", lambda v: v == "Subscriber",
                         "birth_year", {"born 1931-1969": (1931, 1969.5), "born 1970-1984": (1969.5, 1984.5),
                                        "born 1985-1999": (1984.5, 1999)})},
    "oyster": {"sensitive": "product_category",
               "kpi": ("share of pay-as-you-go taps", "product_category", lambda v: v == "payg",
                       "event_type", {t: {t} for t in ("tap_in", "tap_out", "bus_boarding")})},
    "obd2": {"sensitive": "signals.engine_rpm",
             "kpi": ("share of readings above 2000 rpm", "signals.engine_rpm",
                     lambda v: v is not None and v == v and float(v) > 2000,
                     "speed", {"0-20 km/h": (0, 20), "20-60 km/h": (20, 60), "60+ km/h": (60, 200)})},
}


def _qi_table_columns(config, space, col: dict, X: np.ndarray, original: pd.DataFrame):
    """The quasi-identifier columns of an evaluation table (added to ``original``): categories as text, numbers
    and positions from the QI codes (missing: NaN); returns (column names, weights, hierarchies, bounds)."""
    cols, weights, hierarchies, bounds = [], {}, {}, {}
    d = 0
    for qi in config.quasi_identifiers:
        if qi.kind in ("categorical", "station"):
            original[qi.name] = [None if v is None else str(v) for v in _coalesce([col[f] for f in qi.fields])]
            hierarchies[qi.name] = qi.hierarchy
            cols.append(qi.name)
            weights[qi.name] = qi.weight
        else:
            names = [f"{qi.name}.lat", f"{qi.name}.lon"] if qi.kind == "geopoint" else [qi.name]
            for axis, c in enumerate(names):
                x = X[:, d + axis]
                original[c] = np.where(x < space.lower[d + axis], np.nan, x)
                bounds[c] = (float(space.lower[d + axis]), float(space.upper[d + axis]))
                cols.append(c)
                weights[c] = qi.weight / len(names)
        d += qi.dims
    return cols, weights, hierarchies, bounds


def stream_table(name: str, full: bool = False, limit: int | None = None, fit_time_bounds: bool = False
                 ) -> EvalTable:
    """A stream dataset with the QIs, bounds, hierarchies and privacy unit of ``configs/<name>.toml``.

    ``fit_time_bounds``: every timestamp QI's bounds become the events' first and last time (whole hours), so a
    full file longer than the configured period (Citi Bike: 15 months against the slice's 7 weeks) is
    evaluated whole instead of mostly rejected; NCP is then relative to that longer span.
    """
    from stream_anon.config import load_config, parse_config
    from stream_anon.datasets import load_events
    from stream_anon.engine.records import get_path
    from stream_anon.engine.space import parse_time

    config = load_config(contract.config_path(name))
    spec = _STREAM_SPECS[name]
    events = load_events(name, limit=limit, full=full)
    if fit_time_bounds:
        raw_qis = [dict(q) for q in config.raw["quasi_identifiers"]]
        for raw_qi, qi in zip(raw_qis, config.quasi_identifiers):
            if qi.kind == "timestamp":
                first = (next((v for v in (get_path(e, f) for f in qi.fields) if v is not None), None)
                         for e in events)
                times = [t for t in map(parse_time, first) if t is not None]
                if times:
                    raw_qi["lower"] = float(np.floor(min(times) / 3600) * 3600)
                    raw_qi["upper"] = float(np.ceil(max(times) / 3600) * 3600)
        assert config.source is not None        # load_config names the file it read
        config = parse_config({**config.raw, "quasi_identifiers": raw_qis}, base_dir=config.source.parent,
                              source=config.source, allow_outside_paths=config.allow_outside_paths)
    space = QISpace(config)
    fields = sorted({f for q in config.quasi_identifiers for f in q.fields} | {config.stream.privacy_unit,
                    spec["sensitive"], spec["kpi"][1], "latitude", "longitude", "station",
                    "payload.end_latitude", "payload.end_longitude"})
    columns = {f: [get_path(e, f) for e in events] for f in fields}
    X, reasons = space.encode({f: columns[f] for q in config.quasi_identifiers for f in q.fields})
    good = np.array([r is None for r in reasons])
    X = X[good]
    col = {f: [v for v, g in zip(values, good) if g] for f, values in columns.items()}
    n = len(X)
    units = pd.factorize(pd.Series(col[config.stream.privacy_unit], dtype=object))[0]
    original = pd.DataFrame(index=pd.RangeIndex(n))
    cols, weights, hierarchies, bounds = _qi_table_columns(config, space, col, X, original)
    original[spec["sensitive"]] = pd.Series(col[spec["sensitive"]], dtype=object)
    original["_individual"] = units
    kpi_name, kpi_field, predicate, group_col, groups = spec["kpi"]
    kpi = KPISpec(kpi_name, np.array([bool(predicate(v)) for v in col[kpi_field]]), group_col, groups)
    table = EvalTable(name, space, X, units, original, cols, weights, hierarchies, bounds, spec["sensitive"],
                      kpi=kpi, rejected=int((~good).sum()))
    table.positions = _positions(name, config, space, col)
    return table


def table_from_events(name: str, config, events: list[dict]) -> EvalTable:
    """An :class:`EvalTable` of mapped events with the QIs, bounds and privacy unit of ``config`` (sensitive: the
    config's first sensitive field; positions: every geopoint QI, for the AOI attack; no KPI)."""
    from stream_anon.engine.records import get_path

    space = QISpace(config)
    qi_fields = [f for q in config.quasi_identifiers for f in q.fields]
    sensitive = config.sensitive[0] if config.sensitive else None
    fields = sorted(set(qi_fields) | {config.stream.privacy_unit} | ({sensitive} if sensitive else set()))
    columns = {f: [get_path(e, f) for e in events] for f in fields}
    X, reasons = space.encode({f: columns[f] for f in qi_fields})
    good = np.array([r is None for r in reasons], dtype=bool)
    X = X[good]
    col = {f: [v for v, g in zip(values, good) if g] for f, values in columns.items()}
    n = len(X)
    units = pd.factorize(pd.Series(col[config.stream.privacy_unit], dtype=object))[0]
    original = pd.DataFrame(index=pd.RangeIndex(n))
    cols, weights, hierarchies, bounds = _qi_table_columns(config, space, col, X, original)
    positions, d = [], 0
    for qi in config.quasi_identifiers:
        if qi.kind == "geopoint":
            positions.append(PositionSpec(_floats(col[qi.fields[0]]), _floats(col[qi.fields[1]]), dims=(d, d + 1)))
        d += qi.dims
    if sensitive:
        original[sensitive] = pd.Series(col[sensitive], dtype=object)
    original["_individual"] = units
    table = EvalTable(name, space, X, units, original, cols, weights, hierarchies, bounds, sensitive,
                      rejected=int((~good).sum()))
    table.positions = positions
    times = [get_path(e, config.stream.event_time) for e, g in zip(events, good) if g]
    from stream_anon.engine.space import parse_time
    table.times = np.array([t if t is not None else np.nan for t in map(parse_time, times)], dtype=float)
    return table


def _coalesce(cols):
    out = list(cols[0])
    for c in cols[1:]:
        out = [a if a is not None else b for a, b in zip(out, c)]
    return out


def _dim_of(config, name: str) -> int:
    d = 0
    for qi in config.quasi_identifiers:
        if qi.name == name:
            return d
        d += qi.dims
    raise KeyError(name)


def _floats(values) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values])


def _positions(name, config, space, col) -> list[PositionSpec]:
    if name == "citibike":     # start and end station coordinates of every trip (both are geopoint QIs)
        s, e = _dim_of(config, "start"), _dim_of(config, "end")
        return [PositionSpec(_floats(col["latitude"]), _floats(col["longitude"]), dims=(s, s + 1)),
                PositionSpec(_floats(col["payload.end_latitude"]), _floats(col["payload.end_longitude"]),
                             dims=(e, e + 1))]
    if name == "obd2":         # the GPS fix of every reading
        p = _dim_of(config, "position")
        return [PositionSpec(_floats(col["latitude"]), _floats(col["longitude"]), dims=(p, p + 1))]
    if name == "oyster":       # rail taps: the station's coordinates (bus boardings have no position)
        from stream_anon.datasets.oyster import STATIONS_PATH
        st = pd.read_csv(STATIONS_PATH)
        coords = {r.Station: (r.Latitude, r.Longitude) for r in st.itertuples()}
        stations = col["station"]
        lat = np.array([coords.get(s, (np.nan, np.nan))[0] if s else np.nan for s in stations])
        lon = np.array([coords.get(s, (np.nan, np.nan))[1] if s else np.nan for s in stations])
        return [PositionSpec(lat, lon, station_dim=_dim_of(config, "location"), station_coords=coords)]
    return []


def load_table(name: str, full: bool = False, limit: int | None = None, encoding: str = "hierarchy",
               fit_time_bounds: bool = False) -> EvalTable:
    if name == "adult":
        return adult_table(full=full, limit=limit, encoding=encoding)
    if name in _STREAM_SPECS:
        return stream_table(name, full=full, limit=limit, fit_time_bounds=fit_time_bounds)
    raise KeyError(f"unknown dataset {name!r} (expected one of {EVAL_DATASETS})")
