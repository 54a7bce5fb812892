"""Error and budget figures of published DP aggregates, measured against the true values (``stream-anon demo
--dp``). Pure functions over what was read back from ``anon.aggregates`` / ``anon.metrics`` and the raw input;
nothing here is published (the true values never leave the process).

Stream-wide running counts: every input partition holds different individuals and publishes its own rows, so the
stream-wide running count of a cell at window ``w`` is the sum over partitions of each partition's latest running
value at or before ``w`` (0 before its first window), and its noise variance is the sum of theirs (independent
noise). The **naive** running count is the prefix sum of the same aggregate's per-window rows (what a consumer
gets by adding up per-window releases; Chan, Shi & Song 2011, section 1: error growing like sqrt(T)).
"""
from __future__ import annotations

import math

import numpy as np

from stream_anon.dp.aggregator import DPAggregator
from stream_anon.dp.ledger import BudgetLedger
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
    if any(v is None for v in last.values()) or not windows:
        return {"windows": 0}
    end = min(last.values())
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
