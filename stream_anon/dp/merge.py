"""One figure per key: merge the partitions' ``anon.aggregates`` rows (pure functions, no Kafka).

Every input partition holds different units (the worker partitions by unit), so its rows are independent
releases over disjoint data: the stream-wide figure of a cell is the **sum** of the partitions' values, and
its noise is the sum of the partitions' independent noises (variance = sum of variances; parallel composition,
McSherry, PINQ, SIGMOD 2009: merging costs no budget, it is post-processing). A consumer calls
:func:`merge_rows` on rows read from ``anon.aggregates`` (any order, duplicates allowed) and gets one row per
(stream, aggregate, output, window, group key).

Interval: when every partition's noise is integer (two-sided geometric, the default for counts and sums), the
distribution of the summed noise is computed exactly by convolving the partitions' noise distributions (each row
states its scale and standard deviation, hence the number of geometric draws it sums), and the interval is its
central ``level`` quantile range (``interval_method = "exact"``; for noise scales above :data:`GRID_SCALE`
computed on a coarser grid and widened by one step: ``"grid"``). Otherwise (Snapping noise) the normal
approximation ``value +- z * std`` (``"normal"``); for means and ratios the delta method (``"delta"``).

>>> rows = [{"stream": "s", "aggregate": "n", "output": "per_window", "window": 3, "release": "3",
...          "group_key": "a", "group": {"line": "a"}, "partition": p, "value": v, "noise_std": 1.0,
...          "noise_scale": 1.0, "mechanism": "per_window/snapping", "kind": "count"}
...         for p, v in ((0, 10), (1, 5))]
>>> m = merge_rows(rows)[0]
>>> m["value"], round(m["noise_std"], 4), m["partitions"], m["interval_method"]
(15.0, 1.4142, [0, 1], 'normal')
"""
from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

import numpy as np

KEY_FIELDS = ("stream", "aggregate", "output", "window", "group_key")


def _release_rank(release) -> int:
    s = str(release)
    return int(s.split("~")[1]) if "~" in s else 0


def latest_rows(rows) -> list[dict]:
    """One row per (partition, stream, aggregate, output, window, group key): duplicates (same ``row_id``, a
    re-produced release) collapse, and of a window's paid re-releases (``release = "<w>~<n>"``) the last one is
    kept (it is the one computed from the events the partition finally accepted)."""
    best: dict = {}
    for r in rows:
        if r.get("type", "aggregate") != "aggregate":
            continue
        k = (r.get("partition"),) + tuple(r.get(f) for f in KEY_FIELDS)
        if k not in best or _release_rank(r.get("release", 0)) > _release_rank(best[k].get("release", 0)):
            best[k] = r
    return list(best.values())


def _geo_p(scale: float) -> float:
    """Two-sided geometric noise of scale ``b`` (sensitivity/epsilon): P(k) proportional to p^|k|, p = e^(-1/b)."""
    return math.exp(-1.0 / scale)


def _geo_var(p: float) -> float:
    return 2 * p / (1 - p) ** 2


@lru_cache(maxsize=4096)
def _geo_pmf(p: float, draws: int, tail: float = 1e-12) -> tuple[int, np.ndarray]:
    """(offset, pmf) of the sum of ``draws`` two-sided geometric variables with parameter ``p``."""
    k = max(1, int(math.ceil(math.log(tail * (1 - p) / 2) / math.log(p)))) if p > 0 else 0
    support = np.arange(-k, k + 1)
    power, power_off = (1 - p) / (1 + p) * p ** np.abs(support), -k
    out, off = np.array([1.0]), 0
    # by squaring (log2(draws) convolutions): a running row sums one draw per window, i.e. hundreds of draws
    while draws:
        if draws & 1:
            out, shift = _trim(np.convolve(out, power))
            off += power_off + shift
        draws >>= 1
        if draws:
            power, shift = _trim(np.convolve(power, power))
            power_off = 2 * power_off + shift
    return off, out


def _trim(pmf: np.ndarray, tail: float = 1e-13):
    nz = np.flatnonzero(pmf > tail)
    lo, hi = nz[0], nz[-1] + 1
    return pmf[lo:hi], int(lo)


@lru_cache(maxsize=4096)
def _exact_interval(terms: tuple[tuple[float, int], ...], level: float) -> tuple[float, float]:
    """Central ``level`` interval of the summed integer noise, terms ``(p, draws)``: the smallest lo <= 0 <= hi
    with P(noise < lo) <= (1-level)/2 and P(noise > hi) <= (1-level)/2 (conservative at integer points)."""
    pmf, off = np.array([1.0]), 0
    for p, n in terms:
        o, d = _geo_pmf(p, n)
        pmf, off = np.convolve(pmf, d), off + o
        pmf, shift = _trim(pmf)
        off += shift
    cdf = np.cumsum(pmf)
    a = (1 - level) / 2
    lo = off + int(np.searchsorted(cdf, a, side="right"))            # P(X < lo) <= a
    hi = off + int(np.searchsorted(cdf, 1 - a, side="left"))         # P(X <= hi) >= 1 - a
    return float(lo), float(hi)


def _terms(r: dict) -> tuple[float, int] | None:
    """(scale, draws) of a row's integer noise, from its stated scale and std; None when not integer noise."""
    mech, scale, std = str(r.get("mechanism", "")), r.get("noise_scale"), r.get("noise_std")
    if not mech.endswith("geometric") or not isinstance(scale, (int, float)) or not isinstance(std, (int, float)):
        return None
    res = float(r.get("resolution", 1.0))
    draws = int(round((std / res) ** 2 / _geo_var(_geo_p(scale / res)))) if std > 0 else 0
    if draws < 1 or res != 1.0:
        return None
    return (float(scale), draws)


# Largest noise scale convolved point by point: the support of one draw grows like 28 x scale (tail 1e-12), so a
# sum of large scale (e.g. a clamped fare sum, scale in the thousands) would convolve millions of points.
GRID_SCALE = 50.0


def _integer_noise_interval(terms: list[tuple[float, int]], level: float) -> tuple[float, float, str]:
    """(lo, hi, method) of the summed integer noise of ``terms`` ``(scale, draws)``: ``"exact"`` when every scale
    is at most :data:`GRID_SCALE`; otherwise ``"grid"``: in units of ``h = max scale / GRID_SCALE`` (the two-sided
    geometric of scale ``b`` is within a step of ``h`` times the one of scale ``b / h``, both being the discrete
    Laplace), widened by one step ``h`` on each side."""
    h = max(1.0, max(s for s, _ in terms) / GRID_SCALE)
    lo, hi = _exact_interval(tuple(sorted((round(_geo_p(s / h), 12), n) for s, n in terms)), level)
    if h == 1.0:
        return lo, hi, "exact"
    return lo * h - h, hi * h + h, "grid"


def merge_rows(rows, level: float = 0.95) -> list[dict]:
    """Merge the partitions' rows into one row per (stream, aggregate, output, window, group key).

    Returns rows with ``value`` (sum over partitions; for means and ratios the ratio of the summed
    components), ``noise_std`` (``sqrt`` of the summed variances), ``interval`` ``[lo, hi]`` at ``level``,
    ``interval_level``, ``interval_method``, ``partitions`` (the partitions merged), ``complete`` and the key
    fields. Rows are first deduplicated (:func:`latest_rows`).

    ``complete``: every partition that published this (stream, aggregate, output) has published this window or
    a later one. A partition publishes every window from its first event on (empty windows too), so a partition
    missing from a complete row had no events yet (it adds 0); an incomplete row lacks the figure of a partition
    that has not closed the window yet, or whose budget stopped the aggregate, and understates the total.
    """
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    groups: dict = {}
    published_through: dict = {}            # (stream, aggregate, output) -> partition -> last window published
    for r in latest_rows(rows):
        groups.setdefault(tuple(r.get(f) for f in KEY_FIELDS), []).append(r)
        last = published_through.setdefault(tuple(r.get(f) for f in KEY_FIELDS[:3]), {})
        last[r.get("partition")] = max(last.get(r.get("partition"), r["window"]), r["window"])
    out = []
    for key, rs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        rs.sort(key=lambda r: (r.get("partition") is None, r.get("partition")))
        first = rs[0]
        m = {f: v for f, v in zip(KEY_FIELDS, key)}
        m.update({"type": "aggregate_merged", "group": first.get("group"), "kind": first.get("kind"),
                  "partitions": [r.get("partition") for r in rs], "interval_level": level,
                  "complete": all(w >= m["window"] for w in published_through[key[:3]].values())})
        for f in ("period", "span_start_window", "windows_in_release", "window_start", "window_end", "unit",
                  "epsilon_period"):
            if f in first:
                m[f] = first[f]
        if "components" in first:                        # mean / ratio: merge the components, then divide
            comps = list(first["components"])
            sums = {c: float(sum(r["components"][c] for r in rs)) for c in comps}
            variances = {c: float(sum(r["noise_std"][c] ** 2 for r in rs)) for c in comps}
            a, b = sums[comps[0]], sums[comps[1]]
            d = max(b, 1.0)
            v = a / d
            lo_b, hi_b = first.get("bounds") or ((0.0, 1.0) if first.get("kind") == "ratio" else (-math.inf, math.inf))
            v = min(max(v, lo_b), hi_b)
            half = z * math.sqrt(variances[comps[0]] + v * v * variances[comps[1]]) / d
            m.update({"value": v, "components": sums, "noise_std": {c: math.sqrt(x) for c, x in variances.items()},
                      "interval": [max(lo_b, v - half), min(hi_b, v + half)], "interval_method": "delta"})
        else:
            value = float(sum(r["value"] for r in rs))
            var = float(sum(r["noise_std"] ** 2 for r in rs))
            terms = [_terms(r) for r in rs]
            known = [t for t in terms if t is not None]
            if len(known) == len(terms):
                lo, hi, method = _integer_noise_interval(known, level)
                m.update({"interval": [value - hi, value - lo], "interval_method": method})
            else:
                half = z * math.sqrt(var)
                m.update({"interval": [value - half, value + half], "interval_method": "normal"})
            m.update({"value": value, "noise_std": math.sqrt(var)})
        out.append(m)
    return out


def marginal(merged: list[dict], over: str, level: float = 0.95) -> list[dict]:
    """Totals over one group-by dimension (e.g. ``over="zone"``: the all-zones total per window) of merged
    rows: consistent with the cells by construction (they are their sums; post-processing, no budget), noise
    variance the sum of the cells' (independent noise), normal interval."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    groups: dict = {}
    for r in merged:
        if "components" in r or not isinstance(r.get("group"), dict) or over not in r["group"]:
            continue
        g = {k: v for k, v in r["group"].items() if k != over}
        key = (r["stream"], r["aggregate"], r["output"], r["window"], tuple(sorted(g.items())))
        acc = groups.setdefault(key, {"value": 0.0, "var": 0.0, "cells": 0, "row": r, "group": g})
        acc["value"] += r["value"]
        acc["var"] += r["noise_std"] ** 2
        acc["cells"] += 1
    out = []
    for (stream, agg, output, window, _), acc in groups.items():
        half = z * math.sqrt(acc["var"])
        group = {**acc["group"], over: "*"}
        out.append({"type": "aggregate_marginal", "stream": stream, "aggregate": agg, "output": output,
                    "window": window, "group": group, "summed_over": over, "cells": acc["cells"],
                    "value": acc["value"], "noise_std": math.sqrt(acc["var"]),
                    "interval": [acc["value"] - half, acc["value"] + half], "interval_level": level,
                    "interval_method": "normal"})
    return out
