"""``stream-anon evaluate``: every registered strategy, side by side, on one dataset (batch mode).

For each strategy of ``stream_anon.strategies.STRATEGIES`` and each k, the whole table is one buffer: the
strategy forms classes (k counted in distinct individuals) with the engine's QI space, each class is published
as the snapped generalization of its box (``QISpace.snap``), and rows in no class are suppressed. Then:

- privacy and utility metrics of :mod:`stream_anon.metrics` (NCP, the thesis's eleven, Prec, distortion ratio,
  COUNT-query relative error) on a :class:`~stream_anon.metrics.Release`;
- the thesis's Utility Demonstrator (KPI relative error, :mod:`stream_anon.metrics.kpi`);
- the thesis's Privacy Demonstrator (AOI homogeneity attack, :mod:`stream_anon.attacks.aoi`) on data with
  positions (Citi Bike stations, Oyster stations, OBD-II GPS).

Two naive baselines run beside the strategies: ``raw`` (the input with identifiers dropped: classes are exact QI
tuples) and ``mondrian-records`` (Mondrian with k counted in records, CASTLE's defect), so the attack is seen to
succeed against a naive release and is measured against ours.

Datasets: ``adult`` (UCI Adult with ARX hierarchies; ``encoding="codes"`` reproduces the public Mondrian
reference's protocol, see :func:`adult_table`) and the stream datasets with the QIs of ``configs/<name>.toml``.
Outputs (``write_outputs``): ``results.json`` (one row per dataset, strategy and k), ``results.md``, PNG plots.
"""
from __future__ import annotations

import inspect
import logging
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from stream_anon import contract
from stream_anon.config import QuasiIdentifier
from stream_anon.engine.space import QISpace
from stream_anon.hierarchy import Hierarchy

log = logging.getLogger("stream_anon.evaluate")

EVAL_DATASETS = ("adult", "oyster", "citibike", "obd2")
BASELINES = ("raw", "mondrian-records")
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


# -- datasets -----------------------------------------------------------------------------------------------
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
        groups = {g: (codes[g] - 0.5, codes[g] + 0.5) for g in ("Male", "Female")}
    else:
        groups = {"Male": {"Male"}, "Female": {"Female"}}
    kpi = KPISpec("share with salary >50K", (df[adult.SENSITIVE] == ">50K").to_numpy(), "sex", groups)
    return EvalTable("adult", space, X, np.arange(len(df)), original, cols, {c: 1.0 for c in cols}, hierarchies,
                     bounds, adult.SENSITIVE, kpi=kpi, encoding=encoding)


# stream datasets: sensitive column for the l / EMD / knowledge-gain metrics, and the KPI of the utility check
_STREAM_SPECS = {
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
        config = parse_config({**config.raw, "quasi_identifiers": raw_qis}, base_dir=config.source.parent,
                              source=config.source)
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


# -- anonymization ------------------------------------------------------------------------------------------
@dataclass
class Anonymized:
    record_class: np.ndarray        # (n,) class index, -1 = suppressed
    lo: np.ndarray                  # (m, D) snapped boxes
    hi: np.ndarray
    labels: list                    # per class: {categorical QI name: label}
    runtime_s: float


def make(name: str, table: EvalTable | None = None, l: int | None = None):
    """A registered strategy with default parameters, plus what the dataset must supply:

    - ``l`` to strategies that take it (default 2 for those that need one);
    - ``field`` = the table's sensitive column to strategies with ``uses_sensitive`` (grouping, severity);
    - severity: these data have no severity categories (seed 003's Table 1 is about crimes), so every value
      gets severity l [our choice]: k_min stays k and the AS_e <= l_e rule becomes distinct l-diversity."""
    from stream_anon.strategies import STRATEGIES

    if name not in STRATEGIES:
        raise KeyError(f"unknown strategy {name!r} (registered: {sorted(STRATEGIES)})")
    cls = STRATEGIES[name]
    accepted = inspect.signature(cls).parameters
    params = {}
    if l is not None and "l" in accepted:
        params["l"] = l
    if getattr(cls, "uses_sensitive", False) and table is not None:
        params["field"] = table.sensitive
        if "severity" in accepted:
            values = table.original[table.sensitive].dropna().astype(str).unique()
            params["severity"] = {v: float(l or 2) for v in values}
    return cls(**params)


def anonymize(table: EvalTable, strategy, k: int, seed: int = 0, units: np.ndarray | None = None
              ) -> Anonymized:
    """Classes from ``strategy.form_classes`` over the whole table; runtime includes snapping."""
    units = table.units if units is None else units
    kwargs = {}
    if getattr(strategy, "uses_sensitive", False):
        kwargs["sensitive"] = {strategy.field: table.original[strategy.field].tolist()}
    t0 = time.perf_counter()
    classes = strategy.form_classes(table.X, units, k, table.space, np.random.default_rng(seed), **kwargs)
    record_class = np.full(table.n, -1, dtype=np.int64)
    for j, idx in enumerate(classes):
        if (record_class[idx] >= 0).any():
            raise ValueError(f"strategy {getattr(strategy, 'name', strategy)!r} put a record in two classes")
        record_class[idx] = j
    lo = np.array([table.X[idx].min(axis=0) for idx in classes]).reshape(len(classes), table.space.dims)
    hi = np.array([table.X[idx].max(axis=0) for idx in classes]).reshape(len(classes), table.space.dims)
    lo, hi, labels = table.space.snap(lo, hi)
    return Anonymized(record_class, lo, hi, labels, time.perf_counter() - t0)


def raw_release(table: EvalTable) -> Anonymized:
    """The naive release: identifiers dropped, QIs exact; a class is one distinct QI tuple."""
    t0 = time.perf_counter()
    _, inverse = np.unique(table.X, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    m = int(inverse.max()) + 1 if len(inverse) else 0
    lo = np.empty((m, table.space.dims))
    lo[inverse] = table.X
    lo, hi, labels = table.space.snap(lo, lo.copy())
    return Anonymized(inverse.astype(np.int64), lo, hi, labels, time.perf_counter() - t0)


def release_frame(table: EvalTable, anon: Anonymized) -> pd.DataFrame:
    """The released QI values per record (label or (lo, hi)), None for suppressed records."""
    out = pd.DataFrame(index=table.original.index)
    kept = anon.record_class >= 0
    cls = anon.record_class[kept]
    d = 0
    for qi in table.space.qis:
        if qi.kind in ("categorical", "station"):
            per_class = np.array([lab[qi.name] for lab in anon.labels], dtype=object)
            names = [qi.name]
        else:
            names = [f"{qi.name}.lat", f"{qi.name}.lon"] if qi.kind == "geopoint" else [qi.name]
        for axis, c in enumerate(names):
            values = np.full(table.n, None, dtype=object)
            if qi.kind in ("categorical", "station"):
                values[kept] = per_class[cls]
            else:
                pairs = np.empty(len(anon.lo), dtype=object)
                pairs[:] = list(zip(anon.lo[:, d + axis].tolist(), anon.hi[:, d + axis].tolist()))
                values[kept] = pairs[cls]
            out[c] = values
        d += qi.dims
    return out


def make_release(table: EvalTable, anon: Anonymized):
    from stream_anon.metrics import Release

    released = release_frame(table, anon)
    released["_class"] = anon.record_class
    return Release(table.original, released, table.columns, sensitive=table.sensitive, individual="_individual",
                   class_col="_class", suppressed=anon.record_class < 0, hierarchies=table.hierarchies,
                   bounds=table.bounds)


# -- measurements -------------------------------------------------------------------------------------------
def aoi_result(table: EvalTable, anon: Anonymized):
    """Run the AOI attack on a release of ``table`` (None when the dataset has no positions)."""
    from stream_anon.attacks.aoi import aoi_attack, box_cells, cell_ids

    if not table.positions:
        return None
    rec, unit, true_cells, shown = [], [], [], []
    kept = anon.record_class >= 0
    cls = np.where(kept, anon.record_class, 0)
    for p in table.positions:
        truth = cell_ids(p.lat, p.lon)
        revealed = np.full(table.n, None, dtype=object)
        if len(anon.lo):
            if p.dims is not None:
                a, b = p.dims
                boxes = box_cells(anon.lo[:, a], anon.hi[:, a], anon.lo[:, b], anon.hi[:, b])
                revealed = np.where(kept, boxes[cls], None)
            else:
                name = table.space.qis[table.space.owner[p.station_dim]].name
                per_class = []
                for lab in anon.labels:
                    c = p.station_coords.get(lab[name])
                    per_class.append(None if c is None else cell_ids([c[0]], [c[1]])[0])
                revealed = np.where(kept, np.array(per_class, dtype=object)[cls], None)
        has = np.array([t is not None for t in truth])
        rec.append(np.flatnonzero(has))
        unit.append(table.units[has])
        true_cells.append(truth[has])
        shown.append(revealed[has])
    rec, unit = np.concatenate(rec), np.concatenate(unit)
    return aoi_attack(table.units, np.where(kept, anon.record_class, -1), unit, np.concatenate(true_cells), rec,
                      np.concatenate(shown))


def measure(table: EvalTable, anon: Anonymized, queries: list, raw=None) -> dict:
    """Every metric of one release, by name."""
    from stream_anon.metrics import count_query_error, distortion_ratio, ncp, prec, thesis_metrics
    from stream_anon.metrics.kpi import kpi_relative_error

    r = make_release(table, anon)
    row = {"n_records": table.n, "n_individuals": int(len(np.unique(table.units))),
           "classes": int(len(anon.lo)),
           "ncp": ncp(r, table.weights), "ncp_released": ncp(r, table.weights, include_suppressed=False)}
    row.update(thesis_metrics(r, raw=raw))
    row["prec"] = prec(r)
    row["distortion_ratio"] = distortion_ratio(r)
    row["count_query_error"] = count_query_error(r, queries)
    if table.kpi is not None:
        kpi = kpi_relative_error(r, table.kpi.event, table.kpi.group_column, table.kpi.groups)
        row["kpi"] = table.kpi.name
        row["kpi_true"] = kpi["true"]
        row["kpi_released"] = kpi["released"]
        row["kpi_error"] = kpi["overall"]
        row["kpi_group_error"] = kpi.get("mean_group_error")
        row["kpi_groups"] = kpi["groups"]
    aoi = aoi_result(table, anon)
    if aoi is not None:
        row.update(aoi.to_dict())
    return row


def evaluate(table: EvalTable, strategies: list[str], ks: list[int], l: int | None = None, seed: int = 0,
             baselines=BASELINES, n_queries: int = 100, progress: Callable[[str], None] | None = None
             ) -> list[dict]:
    """Rows for every (strategy, k), plus the naive baselines; deterministic for ``seed``."""
    from stream_anon.metrics import Release, random_count_queries
    from stream_anon.strategies.mondrian import Mondrian

    raw_anon = raw_release(table)
    raw = Release.identity(table.original, table.columns, sensitive=table.sensitive, individual="_individual",
                           hierarchies=table.hierarchies, bounds=table.bounds)
    queries = random_count_queries(raw, n_queries, dims=min(2, len(table.columns)), selectivity=0.1,
                                   rng=np.random.default_rng(seed))
    base = {"dataset": table.name, "encoding": table.encoding, "mode": "batch"}
    rows = []

    def add(strategy, k, anon, **extra):
        row = {**base, "strategy": strategy, "k": k, **extra, "runtime_s": anon.runtime_s}
        row.update(measure(table, anon, queries, raw))
        if l is not None:
            row["l"] = l
            row["l_satisfied"] = row["min_l"] is not None and row["min_l"] >= l
        rows.append(row)
        if progress:
            progress(_summary(row))

    if "raw" in baselines:
        add("raw", None, raw_anon, baseline=True)
    for k in ks:
        if "mondrian-records" in baselines:
            add("mondrian-records", k, anonymize(table, Mondrian(), k, seed, units=np.arange(table.n)),
                baseline=True)
        for name in strategies:
            try:
                anon = anonymize(table, make(name, table, l), k, seed)
            except ValueError as exc:       # a strategy that cannot run on these data: say so in the row
                row = {**base, "strategy": name, "k": k, "baseline": False, "error": str(exc)}
                rows.append(row)
                if progress:
                    progress(f"{table.name} {name} k={k}: error: {exc}")
                continue
            add(name, k, anon, baseline=False)
    return rows


def _summary(row: dict) -> str:
    s = (f"{row['dataset']} {row['strategy']} k={row['k']}: ncp={row['ncp']:.4f} "
         f"supp={row['suppression_ratio']:.4f} min_k={row['min_k']} t={row['runtime_s']:.2f}s")
    if "aoi_mean_recall" in row:
        s += (f" aoi {row['aoi_compromised']}/{row['aoi_individuals']} max={row['aoi_max_recall']:.3f} "
              f"mean={row['aoi_mean_recall']:.3f}")
    return s


# -- outputs ------------------------------------------------------------------------------------------------
TABLE_COLUMNS = (("dataset", "dataset", "{}"), ("strategy", "strategy", "{}"), ("k", "k", "{}"),
                 ("ncp", "NCP", "{:.4f}"), ("ncp_released", "NCP (released)", "{:.4f}"),
                 ("suppression_ratio", "suppression", "{:.4f}"), ("min_k", "min k", "{}"),
                 ("classes", "classes", "{}"), ("runtime_s", "runtime s", "{:.2f}"),
                 ("count_query_error", "COUNT err", "{:.3f}"), ("kpi_error", "KPI err", "{:.4f}"),
                 ("aoi_compromised", "AOI compromised", "{}"), ("aoi_max_recall", "AOI max recall", "{:.3f}"),
                 ("aoi_mean_recall", "AOI mean recall", "{:.3f}"), ("error", "error", "{}"))


def markdown_table(rows: list[dict]) -> str:
    cols = [c for c in TABLE_COLUMNS if any(c[0] in r for r in rows)]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            if key == "aoi_compromised" and v is not None:
                cells.append(f"{v}/{r['aoi_individuals']}")
            elif v is None or (isinstance(v, float) and not np.isfinite(v)):
                cells.append("-")
            else:
                cells.append(fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path) -> list[Path]:
    """PNG plots against k per strategy; baselines without k (raw) as dashed horizontal lines. Without matplotlib
    (the ``eval`` extra) no plot is drawn: the tables are the results."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'stream-anon[eval]'): no plots, results.json and "
                    "results.md only")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [("ncp_vs_k.png", [("ncp", "NCP (suppressed = 1)")], "information loss"),
               ("suppression_vs_k.png", [("suppression_ratio", "suppression ratio")], "suppression"),
               ("count_query_error_vs_k.png", [("count_query_error", "mean relative error")], "COUNT-query error"),
               ("aoi_recall_vs_k.png", [("aoi_mean_recall", "mean recall"), ("aoi_max_recall", "max recall")],
                "AOI homogeneity attack (Privacy Demonstrator)")]
    written = []
    datasets = sorted({r["dataset"] for r in rows})
    for fname, metrics, title in figures:
        if not any(metrics[0][0] in r for r in rows):
            continue
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
        for ax, (key, label) in zip(axes[0], metrics):
            for strategy in dict.fromkeys(r["strategy"] for r in rows):
                pts = sorted((r["k"], r[key]) for r in rows
                             if r["strategy"] == strategy and r["k"] is not None and r.get(key) is not None)
                flat = [r[key] for r in rows if r["strategy"] == strategy and r["k"] is None and key in r]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=strategy,
                            linestyle="--" if strategy in BASELINES else "-")
                for v in flat:
                    ax.axhline(v, color="grey", linestyle=":", label=f"{strategy}")
            ax.set_xlabel("k (distinct individuals per class)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{title}: {', '.join(datasets)}")
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def write_outputs(rows: list[dict], out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=_json_default) + "\n")
    (out / "results.md").write_text(markdown_table(rows))
    return [out / "results.json", out / "results.md", *plot(rows, out)]


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    raise TypeError(f"not JSON serializable: {type(v).__name__}")


def run(dataset: str, strategies: list[str], ks: list[int], out: str | Path, l: int | None = None,
        full: bool = False, limit: int | None = None, encoding: str = "hierarchy", seed: int = 0,
        baselines=BASELINES, progress=print, fit_time_bounds: bool = False) -> list[dict]:
    """Load, evaluate, write: the body of ``stream-anon evaluate``."""
    if any(k < 1 for k in ks):
        raise ValueError(f"evaluate: every k must be >= 1, got {ks}")
    if l is not None and l < 1:
        raise ValueError(f"evaluate: l must be >= 1, got {l}")
    table = load_table(dataset, full=full, limit=limit, encoding=encoding, fit_time_bounds=fit_time_bounds)
    rows = evaluate(table, strategies, ks, l=l, seed=seed, baselines=baselines, progress=progress)
    write_outputs(rows, out)
    return rows


# -- your own data: a stream config with an [input] mapping and a file (issue 13) ---------------------------
def read_own_events(config, path) -> tuple[list[dict], list]:
    """Events of a CSV/JSONL file read through the config's ``[input]`` mapping (a JSONL file of the built-in
    event shape when it has none), and ``[(message, index, reason)]`` of what the mapping rejected."""
    from stream_anon.inputs import decode_file
    from stream_anon.kafka.replay import read_jsonl

    if config.input.legacy:
        return read_jsonl(path), []
    return decode_file(path, config.input)


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


def _record_ncp(table: EvalTable, anon: Anonymized) -> np.ndarray:
    """Per-record NCP with the engine's definition (``QISpace.ncp`` of the snapped class box); suppressed = 1."""
    out = np.ones(table.n)
    kept = anon.record_class >= 0
    if kept.any():
        out[kept] = table.space.ncp(anon.lo, anon.hi)[anon.record_class[kept]]
    return out


def _subset(table: EvalTable, idx: np.ndarray) -> EvalTable:
    return EvalTable(table.name, table.space, table.X[idx], table.units[idx],
                     table.original.iloc[idx].reset_index(drop=True), table.columns, table.weights,
                     table.hierarchies, table.bounds, table.sensitive)


def streaming_ncp(config, events: list[dict], secret: bytes = b"evaluate") -> dict:
    """Run the streaming engine over ``events`` in file order (one partition), flush, and measure: NCP over every
    event the engine accepted (published records at their class's NCP, suppressed = 1), NCP of the published
    records, suppression ratio, releases."""
    from stream_anon.engine import Engine

    engine = Engine(config, partition=0, secret=secret)
    t0 = time.perf_counter()
    res = engine.process(events)
    res.extend(engine.flush())
    runtime = time.perf_counter() - t0
    ncp_sum, published, suppressed = 0.0, 0, 0
    for rel in res.releases:
        real = rel.record_ncp if rel.record_counterfeit is None else rel.record_ncp[~rel.record_counterfeit]
        ncp_sum += float(real.sum())
        published += len(real)
        suppressed += sum(len(v) for v in rel.suppressed_tokens.values())
    n = published + suppressed
    return {"events": len(events), "rejected": len(res.rejected), "releases": len(res.releases),
            "published": published, "suppressed": suppressed,
            "ncp": (ncp_sum + suppressed) / n if n else None,
            "ncp_released": ncp_sum / published if published else None,
            "suppression_ratio": suppressed / n if n else None, "runtime_s": runtime}


def offline_mondrian(table: EvalTable, k: int, window_s: float | None = None, seed: int = 0) -> dict:
    """Offline Mondrian (k in distinct individuals) on the whole table, or per window of the streaming engine
    (``event_windows``: the window of each record's event time, the engine's definition) when ``window_s`` is
    given."""
    from stream_anon.engine import event_windows
    from stream_anon.strategies.mondrian import Mondrian

    t0 = time.perf_counter()
    ncp = np.ones(table.n)
    if window_s is None:
        groups = [np.arange(table.n)]
    else:
        known = np.isfinite(table.times)
        w = event_windows(np.where(known, table.times, 0.0), window_s)
        w[~known] = np.iinfo(np.int64).min          # records without a time: one group of their own
        groups = [np.flatnonzero(w == x) for x in np.unique(w)]
    for idx in groups:
        sub = _subset(table, idx)
        ncp[idx] = _record_ncp(sub, anonymize(sub, Mondrian(), k, seed))
    return {"ncp": float(ncp.mean()) if table.n else None, "windows": len(groups),
            "suppression_ratio": float((ncp == 1).mean()) if table.n else None,
            "runtime_s": time.perf_counter() - t0}


def run_own(config_path, file, strategies: list[str], ks: list[int], out, seed: int = 0,
            baselines=BASELINES, progress=print) -> dict:
    """``stream-anon evaluate --config C --file F``: the file through the config's mapping; per k, the streaming
    engine with each strategy against offline Mondrian on the same windows and on the whole table (NCP with the
    engine's definition, suppressed records at 1); plus the batch rows of :func:`evaluate` on the whole table."""
    from stream_anon.config import ConfigError, load_config

    config = load_config(config_path)
    events, rejected = read_own_events(config, file)
    table = table_from_events(config.stream.name, config, events)
    progress(f"{file}: {len(events)} events mapped, {len(rejected)} rejected by the mapping, "
             f"{table.rejected} by the quasi-identifiers; {table.n} in the table")
    comparison = []
    for k in ks:
        off_w = offline_mondrian(table, k, config.anonymization.window_s, seed)
        off_t = offline_mondrian(table, k, None, seed)
        for name in strategies:
            row = {"strategy": name, "k": k, "n": table.n, "windows": off_w["windows"],
                   "offline_mondrian_windows_ncp": off_w["ncp"], "offline_mondrian_table_ncp": off_t["ncp"],
                   "offline_mondrian_windows_suppression": off_w["suppression_ratio"]}
            try:
                cfg = config.replace_anonymization(strategy=name, k=k)
                s = streaming_ncp(cfg, events)
                row.update({f"streaming_{key}": v for key, v in s.items()})
            except (ConfigError, ValueError) as exc:
                row["error"] = str(exc)
            comparison.append(row)
            progress(_own_summary(row))
    rows = evaluate(table, strategies, ks, seed=seed, baselines=baselines, progress=progress)
    written = write_outputs(rows, out)
    out = Path(out)
    (out / "comparison.json").write_text(json.dumps(comparison, indent=1, default=_json_default) + "\n")
    (out / "comparison.md").write_text(comparison_table(comparison))
    return {"comparison": comparison, "rows": rows, "mapping_rejected": len(rejected),
            "written": written + [out / "comparison.json", out / "comparison.md"]}


def _fmt(v, f="{:.4f}"):
    return "-" if v is None else f.format(v)


def _own_summary(row: dict) -> str:
    if "error" in row:
        return f"{row['strategy']} k={row['k']}: error: {row['error']}"
    return (f"{row['strategy']} k={row['k']}: streaming ncp={_fmt(row['streaming_ncp'])} "
            f"(supp {_fmt(row['streaming_suppression_ratio'])}, {row['streaming_releases']} releases) | offline "
            f"Mondrian same windows ncp={_fmt(row['offline_mondrian_windows_ncp'])} "
            f"({row['windows']} windows), whole table ncp={_fmt(row['offline_mondrian_table_ncp'])}")


def comparison_table(rows: list[dict]) -> str:
    lines = ["| strategy | k | records | streaming NCP | streaming suppression | releases | offline Mondrian, "
             "same windows | offline Mondrian, whole table | error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['k']} | {r['n']} | {_fmt(r.get('streaming_ncp'))} | "
                     f"{_fmt(r.get('streaming_suppression_ratio'))} | {r.get('streaming_releases', '-')} | "
                     f"{_fmt(r['offline_mondrian_windows_ncp'])} | {_fmt(r['offline_mondrian_table_ncp'])} | "
                     f"{r.get('error', '')} |")
    return "\n".join(lines) + "\n"


# -- input formats: events/s of decoding and of the worker's in-process path --------------------------------
def format_throughput(batch: int = 1000, repeat: int = 3) -> list[dict]:
    """Events/s per input format on the bundled data, in process (no broker): ``decode`` = the message decoder
    alone (``check_payload`` for the built-in JSON shape); ``worker`` = ``WorkerCore.handle`` in batches of
    ``batch`` messages on one partition (decode, reader, engine, serialization of every output message), best of
    ``repeat`` runs (each). The decoder's caches (parsed times) are warm after the first run. Inputs: Citi Bike
    trips as built-in JSON events and as CSV records (20,000), the raw Oyster and OBD-II CSV files (33,536 taps,
    8,261 readings), the OBD-II readings as Tesla payloads in protobuf and protojson (8,261), Citi Bike as
    GTFS-realtime feeds (20,000 vehicles in 15-minute snapshots)."""
    import orjson

    from stream_anon.config import load_config
    from stream_anon.datasets import load_events
    from stream_anon.inputs import Decoder, file_messages
    from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads
    from stream_anon.kafka.core import WorkerCore
    from stream_anon.kafka.input_checks import check_payload

    checkout = Path(__file__).resolve().parents[1] / "configs"     # a source checkout, else the installed configs
    cfg_dir = checkout if (checkout / "inputs" / "obd2-tesla.toml").is_file() else contract.configs_dir()
    cases = [("json (built-in shape)", "citibike", [orjson.dumps(e) for e in load_events("citibike")]),
             ("csv", "citibike-csv", "citibike_slice.csv.gz"),
             ("csv", "oyster-csv", "oyster_slice.csv.gz"),
             ("csv", "obd2-csv", "obd2_19drivers.csv.gz"),
             ("tesla-fleet-telemetry protobuf", "obd2-tesla", tesla_payloads("protobuf")),
             ("tesla-fleet-telemetry json", "obd2-tesla", tesla_payloads("json")),
             ("gtfs-realtime", "citibike-gtfs", gtfs_feeds())]
    rows = []
    for label, name, messages in cases:
        cfg = load_config(cfg_dir / f"{name}.toml" if name == "citibike" else cfg_dir / "inputs" / f"{name}.toml")
        if isinstance(messages, str):       # a bundled raw file, one message per record
            messages = list(file_messages(contract.data_path(messages), cfg.input))
        t_dec = None
        for _ in range(repeat):
            if cfg.input.legacy:
                t0 = time.perf_counter()
                n_events = sum(1 for m in messages if check_payload(m, cfg) is not None)
            else:
                dec = Decoder(cfg.input, cfg.limits.max_event_bytes)
                t0 = time.perf_counter()
                n_events = sum(max(1, len(dec.decode(m, "t", 0, i).events)) for i, m in enumerate(messages))
            dt = time.perf_counter() - t0
            t_dec = dt if t_dec is None else min(t_dec, dt)
        best = None
        for _ in range(repeat):
            core = WorkerCore(cfg, "bench", b"bench-secret-0123456789abcdef")
            msgs = [(0, offset, m) for offset, m in enumerate(messages)]
            t0 = time.perf_counter()
            for start in range(0, len(msgs), batch):
                core.handle(msgs[start:start + batch])
            core.flush_all()
            dt = time.perf_counter() - t0
            events_in = core.stats["events_in"]
            best = dt if best is None else min(best, dt)
        rows.append({"format": label, "config": name, "messages": len(messages), "events": events_in,
                     "bytes_per_message": round(sum(map(len, messages)) / len(messages), 1),
                     "decode_events_per_s": round(n_events / t_dec), "worker_events_per_s": round(events_in / best)})
    return rows
