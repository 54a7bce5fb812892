"""Error and budget figures of published DP aggregates, measured against the true values (``stream-anon demo --dp``,
bench/bench_dp_budget.py), and the inputs of the membership game (:func:`membership_setting`; the attack itself runs
in :func:`stream_anon.evaluate.stream_figures.membership_auc`: no production module imports an attack). Pure
functions over what was read back from ``anon.aggregates`` / ``anon.metrics`` and the raw input; nothing here is
published (the true values never leave the process).

Stream-wide running counts: every input partition holds different individuals and publishes its own rows, so the
stream-wide running count of a cell at window ``w`` is the sum over partitions of each partition's latest running
value at or before ``w`` (0 before its first window), and its noise variance is the sum of theirs (independent
noise). The **naive** running count is the prefix sum of the same aggregate's per-window rows (what a consumer
gets by adding up per-window releases; Chan, Shi & Song 2011, section 1: error growing like sqrt(T)).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from stream_anon.dp.aggregator import DPAggregator
from stream_anon.dp.columns import WindowColumns
from stream_anon.dp.ledger import BudgetLedger
from stream_anon.dp.release import ReleasedCells
from stream_anon.dp.specs import DPConfig


def true_window_values(dp: DPConfig, name: str, windows: list[tuple[int, list]]) -> dict[int, dict]:
    """Window -> component -> bounded noise-free cell values (contribution bounding and clamping as published)."""
    probe = DPAggregator(dp, BudgetLedger(None, dp.epsilon_budget), seed=b"truth-only-no-noise-drawn")
    return {w: probe.true_values(name, evs) for w, evs in windows}


def running_count_errors(rows: list[dict], truth: dict[tuple[int, int], np.ndarray], spec) -> dict:
    """RMSE of the stream-wide running counts of one count aggregate against the truth.

    ``rows``: deduplicated ``anon.aggregates`` rows of this aggregate (all partitions); ``truth``: ``(partition,
    window) -> true count per cell`` in the order of ``spec.domain``. Windows after one partition's last release
    (budget exhausted) are left out: its running count would stand still while the truth grows.
    """
    cells = {"|".join(map(str, k)): i for i, k in enumerate(spec.domain)}
    period_of: dict = {}
    if any("period" in r for r in rows):
        # period mode: a row covers the windows span_start_window..window, and running totals restart every
        # period; the truth is summed over each release's span
        spans = sorted({(r["window"], r.get("span_start_window", r["window"]), r["period"]) for r in rows})
        ends = [w for w, _, _ in spans]
        period_of = {w: per for w, _, per in spans}
        start_of = {w: st for w, st, _ in spans}
        merged: dict = {}
        for (p, w), x in truth.items():
            k = int(np.searchsorted(ends, w))
            if k < len(ends) and start_of[ends[k]] <= w:
                merged[(p, ends[k])] = merged.get((p, ends[k]), 0) + np.asarray(x, dtype=float)
        truth = merged
    parts = sorted({p for p, _ in truth} | {r["partition"] for r in rows})
    last = {p: max((r["window"] for r in rows if r["partition"] == p and r["output"] == "running"), default=None)
            for p in parts}
    windows = sorted({w for _, w in truth} | {r["window"] for r in rows})
    released = [v for v in last.values() if v is not None]
    if len(released) < len(last) or not windows:        # a partition with no running release yet
        return {"windows": 0}
    end = min(released)
    windows = [w for w in windows if w <= end]
    wi = {w: i for i, w in enumerate(windows)}
    seg = np.array([hash(period_of.get(w)) for w in windows])
    same = np.concatenate([[False], seg[1:] == seg[:-1]]) if len(seg) else np.zeros(0, bool)

    def cumsum(a):                            # prefix sums restarting at every period boundary
        out = a.copy()
        for i in range(1, len(out)):
            if same[i]:
                out[i] += out[i - 1]
        return out
    shape = (len(windows), len(cells))
    run, run_var, naive, naive_var, true_run = (np.zeros(shape) for _ in range(5))
    has_per_window = any(r["output"] == "per_window" for r in rows)
    mechanisms = set()
    for p in parts:
        r_val, r_var = np.full(shape, np.nan), np.full(shape, np.nan)
        pw_val, pw_var, tr = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        for r in rows:
            if r["partition"] != p or r["window"] not in wi:
                continue
            i, j = wi[r["window"]], cells[r["group_key"]]
            if r["output"] == "running":
                r_val[i, j], r_var[i, j] = r["value"], r["noise_std"] ** 2
                mechanisms.add(r["mechanism"])
            else:
                pw_val[i, j], pw_var[i, j] = r["value"], r["noise_std"] ** 2
        for (pp, w), x in truth.items():
            if pp == p and w in wi:
                tr[wi[w]] = x
        for a in (r_val, r_var):          # carry each partition's latest running release forward; 0 before it
            for i in range(len(windows)):
                prev = a[i - 1] if i and same[i] else np.zeros(len(cells))
                a[i] = np.where(np.isnan(a[i]), prev, a[i])
        run += r_val
        run_var += r_var
        naive += cumsum(pw_val)
        naive_var += cumsum(pw_var)
        true_run += cumsum(tr)
    out = {"aggregate": spec.name, "mechanism": sorted(mechanisms), "windows": len(windows), "cells": len(cells),
           "partitions": len(parts),
           "continual_count_rmse": float(np.sqrt(np.mean((run - true_run) ** 2))),
           "continual_count_rmse_theory": float(np.sqrt(np.mean(run_var)))}
    if has_per_window:
        out["naive_count_rmse"] = float(np.sqrt(np.mean((naive - true_run) ** 2)))
        out["naive_count_rmse_theory"] = float(np.sqrt(np.mean(naive_var)))
    return out


# -- figures against the unbounded truth (demo report, bench/bench_dp_budget.py) ---------------------------------
def true_cells(spec, events_by_w: dict[int, list], windows) -> dict:
    """Unbounded true values per cell over ``windows`` (no contribution bounding: what the analyst wants to know):
    count (count/histogram), (sum, count) or (numerator, denominator), by group key."""
    evs = [e for w in windows for e in events_by_w.get(w, [])]
    evs = [e for e in evs if all(e.get(f) in allowed for f, allowed in spec.where)]
    keys = list(zip(*(g.keys_of(evs) for g in spec.group_by))) if spec.group_by else [()] * len(evs)
    out: dict = {}
    for e, k in zip(evs, keys):
        if None in k:
            continue
        v = e.get(spec.value_field) if spec.value_field else None
        if spec.value_field and (v is None or (spec.kind != "ratio" and not isinstance(v, (int, float)))):
            continue                                    # missing values are not counted (as in the aggregator)
        if spec.kind == "histogram":
            assert v is not None                        # a histogram has a value field: checked above
            b = int(np.clip(np.searchsorted(spec.bins, float(v), side="right") - 1, 0, len(spec.bins) - 2))
            k = k + (spec.bin_labels[b],)
        a = out.setdefault("|".join(map(str, k)), [0.0, 0.0])
        if spec.kind in ("count", "histogram"):
            a[0] += 1
        elif spec.kind in ("sum", "mean"):
            assert v is not None                        # as for a histogram
            a[0] += float(np.clip(v, spec.lower, spec.upper))
            a[1] += 1
        else:
            a[0] += v in spec.numerator_values
            a[1] += 1
    return out


def _release_span(dp: DPConfig, m: dict, first_window: int) -> tuple[int, int]:
    """First and last window a merged row covers (a running row: from the start of its period, or without periods
    from ``first_window``, the aggregate's first release)."""
    start = m.get("span_start_window", m["window"])
    if m["output"] == "running":
        start = dp.clock.period_of(m["window"])[1] if dp.clock is not None else first_window
    return start, m["window"]


def aggregate_rmse(dp: DPConfig, merged: list[dict], events_by_w: dict[int, list]) -> dict:
    """Per aggregate: RMSE of the merged per-window (per-release) values against the unbounded truth (a running-only
    aggregate: its running values). Counts in events, sums and means in the value field's unit, ratios as
    shares."""
    out = {}
    for spec in dp.aggregates:
        rs = [m for m in merged if m["aggregate"] == spec.name and m["output"] == "per_window"]
        if not rs and spec.output == "running":
            rs = [m for m in merged if m["aggregate"] == spec.name]
        if not rs:
            continue
        err, cache = [], {}
        first = min(m.get("span_start_window", m["window"]) for m in rs)
        for m in rs:
            span = _release_span(dp, m, first)
            if span not in cache:
                cache[span] = true_cells(spec, events_by_w, range(span[0], span[1] + 1))
            t = cache[span].get(m["group_key"], [0.0, 0.0])
            if spec.kind in ("count", "histogram", "sum"):
                err.append(m["value"] - t[0])
            elif t[1] > 0:
                err.append(m["value"] - t[0] / t[1])
        out[spec.name] = {"rmse": float(np.sqrt(np.mean(np.square(err)))) if err else None, "cells": len(err),
                          "output": rs[0]["output"], "unit": spec.value_field if spec.kind in ("sum", "mean") else
                          "share" if spec.kind == "ratio" else "events",
                          "release_windows": rs[0].get("windows_in_release", 1)}
    return out


def relative_errors(estimate: dict, truth: dict, threshold: int) -> dict:
    """``estimate`` / ``truth``: cell -> value; |estimate - truth| / truth over the cells with truth >=
    ``threshold`` (cells the release missed count as 100% off)."""
    rel = sorted(((abs(estimate.get(k, 0.0) - t) / t, k, t) for k, t in truth.items() if t >= threshold),
                 key=lambda x: x[0], reverse=True)
    return {"min_true_count": threshold, "cells": len(rel),
            "within_10pct": sum(r <= 0.10 for r, _, _ in rel),
            "max_relative_error": float(rel[0][0]) if rel else None,
            "median_relative_error": float(np.median([r for r, _, _ in rel])) if rel else None,
            "mean_relative_error": float(np.mean([r for r, _, _ in rel])) if rel else None,
            "worst": [{"cell": list(map(str, k)), "true": int(t), "relative_error": round(float(r), 4)}
                      for r, k, t in rel[:3]]}


def release_relative_errors(dp: DPConfig, merged: list[dict], events_by_w: dict[int, list], aggregate: str,
                            thresholds=(500, 100)) -> dict | None:
    """Relative errors of the merged per-window releases of count ``aggregate`` (e.g. ``tap_ins_zone_hour``: the
    hourly tap-in count per zone) against the unbounded truth, over the cells with at least each threshold of
    true events; None when the stream has no such aggregate."""
    spec = next((s for s in dp.aggregates if s.name == aggregate and s.kind == "count"), None)
    rs = [m for m in merged if m["aggregate"] == aggregate and m["output"] == "per_window"]
    if spec is None or not rs:
        return None
    estimate, truth, cache = {}, {}, {}
    for m in rs:
        span = _release_span(dp, m, m["window"])          # per-window rows: their own span
        if span not in cache:
            cache[span] = true_cells(spec, events_by_w, range(span[0], span[1] + 1))
        key = (m["window_start"] if "window_start" in m else span[0], m["group_key"])
        estimate[key] = m["value"]
        truth[key] = cache[span].get(m["group_key"], [0.0])[0]
    err = [estimate[k] - truth[k] for k in truth]
    return {"aggregate": aggregate, "cells": len(truth), "rmse": float(np.sqrt(np.mean(np.square(err)))),
            "by_threshold": [relative_errors(estimate, truth, t) for t in thresholds]}


def membership_setting(dp: DPConfig, events_by_w: dict[int, list], max_cards: int,
                       rng: np.random.Generator) -> tuple | None:
    """The membership game's inputs on the count aggregates of ``dp`` over the first period of the events:
    ``(names, period, units, contributions, release)``. ``contributions``: units x released cells, each unit's
    bounded contribution (W windows per aggregate, C events per window, as the aggregator bounds them: what the
    adversary who knows the unit's events computes); ``release(members)``: ``(values, noise variances)`` of the
    group's releases through :class:`DPAggregator` at the configured budget, in the same cell layout (the group's
    windows are released up to the release that covers the last window holding events; the later ones' cells stay
    0: no unit contributes to them, so no likelihood-ratio score depends on them, and no release depends on a
    later window). None without period mode or without a count aggregate."""
    names = [s.name for s in dp.aggregates if s.kind == "count"]
    if dp.clock is None or not names or not events_by_w:
        return None
    dpc = replace(dp, aggregates=tuple(s for s in dp.aggregates if s.name in names))
    assert dpc.clock is not None                 # dp's period
    period, lo, n = dpc.clock.period_of(min(events_by_w))
    hi = lo + n
    unit = dp.privacy_unit
    by_unit: dict = {}
    for w in range(lo, hi):
        for e in events_by_w.get(w, []):
            if e.get(unit) is not None:
                by_unit.setdefault(e[unit], []).append((w, e))
    units = sorted(by_unit, key=str)
    if len(units) > max_cards:
        units = [units[i] for i in sorted(rng.choice(len(units), max_cards, replace=False))]
    layout, off = {}, 0                                    # aggregate -> (first column, key index, release span)
    for s in dpc.aggregates:
        layout[s.name] = (off, {k: i for i, k in enumerate(s.domain)}, s.release_every)
        off += -(-n // s.release_every) * len(s.domain)
    vec = np.zeros((len(units), off))
    for s in dpc.aggregates:
        base, keys, k = layout[s.name]
        for i, u in enumerate(units):
            wes = [(w, e) for w, e in by_unit[u] if all(e.get(f) in allowed for f, allowed in s.where)]
            evs = [e for _, e in wes]
            windows: list[int] = []                   # the unit's windows counted (at most W)
            per: dict[int, int] = {}                  # window -> the unit's events counted (at most C)
            for (w, _), key in zip(wes, zip(*(g.keys_of(evs) for g in s.group_by))):
                if None in key:
                    continue
                if w not in windows:
                    if len(windows) == s.max_windows:
                        continue
                    windows.append(w)
                if per.get(w, 0) == s.max_contributions:
                    continue
                per[w] = per.get(w, 0) + 1
                vec[i, base + (w - lo) // k * len(keys) + keys[key]] += 1

    last = max(events_by_w)          # releases every k windows from the period's start, and at its last window
    end = min(hi, max(lo + ((last - lo) // s.release_every + 1) * s.release_every for s in dpc.aggregates))
    cells: dict[str, np.ndarray] = {}              # aggregate -> each released cell's key index, in release order

    def release(members) -> tuple[np.ndarray, np.ndarray]:
        agg = DPAggregator(dpc, BudgetLedger(None, dpc.epsilon_budget), seed=f"atk-{members[0]}-{members[-1]}")
        by_w: dict[int, list] = {}
        for m in members:
            for w, e in by_unit[units[m]]:
                by_w.setdefault(w, []).append(e)
        y, t2 = np.zeros(off), np.zeros(off)
        for w in range(lo, end):
            # the release blocks of process_window's rows (its path without a dict per row)
            for block in agg.release_columns(w, WindowColumns.from_flats(by_w.get(w, []), agg.fields)):
                if not isinstance(block, ReleasedCells) or block.common["output"] != "per_window":
                    continue
                c = block.common
                base, keys, k = layout[c["aggregate"]]
                if c["aggregate"] not in cells:
                    cells[c["aggregate"]] = np.array([keys[tuple(group.values())]
                                                      for group, _ in block.labels.pairs])
                col = base + (c["span_start_window"] - lo) // k * len(keys) + cells[c["aggregate"]]
                y[col], t2[col] = block.numbers[0::block.layout.per_cell], c["noise_std"] ** 2
        return y, t2
    return names, period, units, vec, release
