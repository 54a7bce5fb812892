"""KPI relative error: the thesis's Utility Demonstrator (Singer 2023, seed 004, Sec. 4.3.2 and 4.4.4).

The KPI is the share of records with an event (the thesis: trips with touchscreen use), overall and per group
of a quasi-identifier (the thesis: per engine type). y is computed on the raw data, y' on the release, and the
relative error is |y - y'| / y. Suppressed records are absent from y'. When the group attribute is generalized,
a released record counts towards a group with the share of its released value that matches the group (the
uniformity assumption of the COUNT-query error, :mod:`stream_anon.metrics.queries`); this is the thesis's
"relaxed calculation" marked "!" in Table 4.11. A group with no released record has error 1 (as the thesis sets
for an engine type absent from synthetic data).

>>> import pandas as pd
>>> orig = pd.DataFrame({"g": [1, 1, 2, 2], "e": [1, 0, 1, 1]})
>>> rel = pd.DataFrame({"g": [(1, 2)] * 4, "e": [1, 0, 1, 1]})
>>> r = AnonymizedTable(orig, rel, ["g"], bounds={"g": (1, 2)})
>>> out = kpi_relative_error(r, orig["e"].to_numpy() == 1, "g", {"one": (0.5, 1.5), "two": (1.5, 2.5)})
>>> out["overall"], round(out["groups"]["one"]["error"], 3)   # group "one": y = 1/2, y' = 3/4
(0.0, 0.5)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from stream_anon.metrics.base import AnonymizedTable
from stream_anon.metrics.queries import _match_share, _true_matches


def kpi_relative_error(r: AnonymizedTable, event: np.ndarray, group_attr: str | None = None,
                       groups: dict | None = None) -> dict:
    """``event``: (n_records,) bool, the KPI's event per original record (read from a column published
    unchanged, such as a sensitive attribute). ``groups``: label -> condition on ``group_attr`` (a set of
    leaves or a (lo, hi) range). Returns {"overall", "groups": {label: {"true", "released", "error"}},
    "mean_group_error"}."""
    event = np.asarray(event, dtype=float)
    kept = r.kept
    y = float(event.mean()) if len(event) else 0.0
    y_rel = float(event[kept].mean()) if kept.any() else float("nan")
    out: dict[str, Any] = {"true": y, "released": y_rel, "overall": _rel_error(y, y_rel), "groups": {}}
    if group_attr is not None:
        values = r.released.loc[kept, group_attr]
        shares_cache: dict = {}
        for label, cond in (groups or {}).items():
            truth = _true_matches(r, group_attr, r.original[group_attr], cond)
            y_g = float(event[truth].mean()) if truth.any() else float("nan")
            w = np.array([_cached(shares_cache, r, group_attr, v, label, cond) for v in values])
            y_g_rel = float((w * event[kept]).sum() / w.sum()) if w.sum() > 0 else float("nan")
            out["groups"][label] = {"true": y_g, "released": y_g_rel, "error": _rel_error(y_g, y_g_rel)}
        errs = [g["error"] for g in out["groups"].values() if np.isfinite(g["error"])]
        out["mean_group_error"] = float(np.mean(errs)) if errs else None
    return out


def _cached(cache, r, attr, v, label, cond):
    key = (label, frozenset(v) if isinstance(v, (set, list)) else v)
    if key not in cache:
        cache[key] = _match_share(r, attr, v, cond)
    return cache[key]


def _rel_error(y: float, y_rel: float) -> float:
    if not np.isfinite(y) or y == 0:
        return float("nan")
    if not np.isfinite(y_rel):
        return 1.0
    return abs(y - y_rel) / y
