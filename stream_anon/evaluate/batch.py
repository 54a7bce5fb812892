"""Batch anonymization and measurement: each strategy forms classes over a whole :class:`~.tables.EvalTable`, each
class is published as the snapped generalization of its box (``QISpace.snap``), rows in no class are suppressed;
then every metric of :mod:`stream_anon.metrics`, the KPI error and the AOI attack (:func:`measure`), and the
criteria the strategy's search promises, checked on its classes (:func:`search_criteria`).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, cast

import numpy as np
import pandas as pd

from stream_anon.evaluate.tables import EvalTable

BASELINES = ("raw", "mondrian-records")


@dataclass
class Anonymized:
    record_class: np.ndarray        # (n,) class index, -1 = suppressed
    lo: np.ndarray                  # (m, D) snapped boxes
    hi: np.ndarray
    labels: list                    # per class: {categorical QI name: label}
    runtime_s: float
    windows: int = 1                # groups anonymized apart (offline Mondrian per window: the windows)


def make(name: str, table: EvalTable | None = None, l: int | None = None):
    """A registered strategy with default parameters, plus what the dataset must supply:

    - ``l`` to strategies that take it (default 2 for those that need one);
    - ``field`` = the table's sensitive column to strategies with ``uses_sensitive`` (grouping, severity);
    - severity: these data have no severity categories (seed 003's Table 1 is about crimes), so every value
      gets severity l [our choice]: k_min stays k and the AS_e <= l_e rule becomes distinct l-diversity.

    A strategy's constructor takes ``**params``: its ``Params`` dataclass says which parameters it has.
    """
    from stream_anon.strategies import STRATEGIES, Strategy

    if name not in STRATEGIES:
        raise KeyError(f"unknown strategy {name!r} (registered: {sorted(STRATEGIES)})")
    cls = cast("type[Strategy]", STRATEGIES[name])        # the registry holds strategy classes
    accepted = {f.name for f in dataclasses.fields(cls.Params)}
    params: dict[str, Any] = {}
    if l is not None and "l" in accepted:
        params["l"] = l
    if getattr(cls, "uses_sensitive", False) and table is not None:
        params["field"] = table.sensitive
        if "severity" in accepted:
            values = table.original[table.sensitive].dropna().astype(str).unique()
            params["severity"] = {v: float(l or 2) for v in values}
    return cls(**params)


def search_criteria(strategy, table: EvalTable, k: int) -> tuple:
    """What ``strategy``'s search promises on ``table`` at ``k``, as criteria (:mod:`stream_anon.criteria`): k in
    distinct individuals, plus the rule of a strategy that searches for one (``criteria(k, sensitive)``: grouping's
    frequency l-diversity, severity's rule)."""
    from stream_anon.criteria import KIndividuals

    own = getattr(strategy, "criteria", None)
    sensitive = {strategy.field: table.original[strategy.field].tolist()} if own is not None else {}
    return (KIndividuals(k), *(own(k, sensitive) if own is not None else ()))


def check_criteria(table: EvalTable, anon: "Anonymized", criteria: tuple) -> dict:
    """Whether every published class holds every criterion, and the reasons of those the whole table fails (then
    no class can hold them: what a strategy that publishes nothing could not meet)."""
    from stream_anon.criteria import Classes, Column

    fields = {f for c in criteria for f in c.fields}
    columns = {f: Column.encode(table.original[f].tolist()) for f in fields}
    groups = [np.flatnonzero(anon.record_class == j) for j in range(len(anon.lo))]
    published = Classes.of(groups, table.units, columns)
    whole = Classes.of([np.arange(table.n)], table.units, columns)
    return {"criteria": [repr(c) for c in criteria],
            "criteria_held": bool(all(c.holds(published).all() for c in criteria)),
            "unmet_by_table": [c.reason for c in criteria if table.n and not c.holds(whole)[0]]}


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
    from stream_anon.metrics import AnonymizedTable

    released = release_frame(table, anon)
    released["_class"] = anon.record_class
    return AnonymizedTable(table.original, released, table.columns, sensitive=table.sensitive, individual="_individual",
                   class_col="_class", suppressed=anon.record_class < 0, hierarchies=table.hierarchies,
                   bounds=table.bounds)


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
                revealed = np.where(kept, boxes[cls], None)  # type: ignore[call-overload]  # stubs reject None
            else:
                name = table.space.qis[table.space.owner[p.station_dim]].name
                per_class = []
                for lab in anon.labels:
                    c = p.station_coords.get(lab[name])
                    per_class.append(None if c is None else cell_ids([c[0]], [c[1]])[0])
                per_class_a = np.array(per_class, dtype=object)
                revealed = np.where(kept, per_class_a[cls], None)  # type: ignore[call-overload]  # stubs reject None
        has = np.array([t is not None for t in truth])
        rec.append(np.flatnonzero(has))
        unit.append(table.units[has])
        true_cells.append(truth[has])
        shown.append(revealed[has])
    rec_a, unit_a = np.concatenate(rec), np.concatenate(unit)
    return aoi_attack(table.units, np.where(kept, anon.record_class, -1), unit_a, np.concatenate(true_cells), rec_a,
                      np.concatenate(shown))


def measure(table: EvalTable, anon: Anonymized, queries: list, raw=None) -> dict:
    """Every metric of one release, by name."""
    from stream_anon.metrics import count_query_error, distortion_ratio, ncp, prec, thesis_metrics
    from stream_anon.metrics.kpi import kpi_relative_error

    r = make_release(table, anon)
    row: dict[str, Any] = {"n_records": table.n, "n_individuals": int(len(np.unique(table.units))),
                           "classes": int(len(anon.lo)),
                           "ncp": ncp(r, table.weights),
                           "ncp_released": ncp(r, table.weights, include_suppressed=False)}
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
    from stream_anon.metrics import AnonymizedTable, random_count_queries
    from stream_anon.strategies.mondrian import Mondrian

    raw_anon = raw_release(table)
    raw = AnonymizedTable.identity(table.original, table.columns, sensitive=table.sensitive, individual="_individual",
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
                strategy = make(name, table, l)
                anon = anonymize(table, strategy, k, seed)
            except ValueError as exc:       # a strategy that cannot run on these data: say so in the row
                row = {**base, "strategy": name, "k": k, "baseline": False, "error": str(exc)}
                rows.append(row)
                if progress:
                    progress(f"{table.name} {name} k={k}: error: {exc}")
                continue
            criteria = search_criteria(strategy, table, k)
            # a strategy with its own rule states it and whether its classes hold it (others: min_k says it)
            add(name, k, anon, baseline=False, **(check_criteria(table, anon, criteria) if len(criteria) > 1 else {}))
    return rows


def _summary(row: dict) -> str:
    s = (f"{row['dataset']} {row['strategy']} k={row['k']}: ncp={row['ncp']:.4f} "
         f"supp={row['suppression_ratio']:.4f} min_k={row['min_k']} t={row['runtime_s']:.2f}s")
    if "aoi_mean_recall" in row:
        s += (f" aoi {row['aoi_compromised']}/{row['aoi_individuals']} max={row['aoi_max_recall']:.3f} "
              f"mean={row['aoi_mean_recall']:.3f}")
    return s
