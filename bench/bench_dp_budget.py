"""Issue 14 budget figures on the real oyster-cards stream, in process (no Kafka): writes
bench/results/dp_budget.json.

Stream: stream_anon.datasets.oyster_cards over the full Monday Oyster file (../shared/data/oyster), ``--cards``
cards, ``--days`` days, split into ``--partitions`` partitions by a hash of the card (as the worker does), each
with its own DPAggregator, ledger and noise seed; rows merged per key with stream_anon.dp.merge.merge_rows.

- **new**: configs/oyster-cards.toml (unit = card, period = day in Europe/London, epsilon 1 per card per day).
- **legacy**: the aggregates of configs/oyster.toml before issue 14 (epsilon 0.1 per aggregate and 15-minute
  window, budget 50: 5 x 0.1 x 96 = 48 per individual per day), with the card as privacy unit.

Figures: relative error of the hourly tap-in count per zone for every zone-hour with >= 500 taps (new: the
hourly release; legacy: the sum of the four 15-minute tap_in cells of taps_per_zone) against the TRUE count
(no contribution bounding); each aggregate's RMSE over its released cells against the true values; the epsilon
each ledger charged per card and day; membership-inference AUC (stream_anon.attacks.membership) without noise
and at the default budget, on ``--attack-cards`` cards of day 0.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_dp_budget.py [--cards 50000] [--days 1] [--partitions 4]
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import tomllib
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stream_anon.datasets import DATASETS, oyster_cards  # noqa: E402
from stream_anon.dp import BudgetLedger, DPAggregator, parse_dp_config  # noqa: E402
from stream_anon.dp.merge import merge_rows  # noqa: E402
from stream_anon.dp.report import aggregate_rmse, relative_errors, true_cells  # noqa: E402
from stream_anon.evaluate.stream_figures import membership_auc  # noqa: E402
from stream_anon.dp.specs import load_dp_config  # noqa: E402
from stream_anon.events import parse_event_time  # noqa: E402

WINDOW_S = 900
LEGACY_TOML = '''
[dp]
epsilon_budget = 50.0
[[aggregates]]
name = "taps_per_zone"
kind = "count"
epsilon = 0.1
max_contributions = 2
output = "both"
horizon_windows = 96
[[aggregates.group_by]]
name = "zone"
field = ["station", "bus_route"]
hierarchy = "hierarchies/oyster_location.json"
level = "zone"
[[aggregates.group_by]]
name = "event_type"
field = "event_type"
values = ["tap_in", "tap_out", "bus_boarding"]
[[aggregates]]
name = "tap_ins_per_hour"
kind = "count"
epsilon = 0.1
max_contributions = 1
output = "running"
horizon_windows = 96
where = { event_type = ["tap_in"] }
[[aggregates.group_by]]
name = "hour"
kind = "hour"
field = "event_time"
[[aggregates]]
name = "mean_fare_by_category"
kind = "mean"
value = "full_fare_pence"
lower = 0
upper = 1000
epsilon = 0.1
max_contributions = 2
output = "per_window"
[[aggregates.group_by]]
name = "product_category"
field = "product_category"
values = ["payg", "travelcard", "bus_tram_pass", "freedom_pass_elderly", "freedom_pass_disabled", "child", "staff", "other"]
[[aggregates]]
name = "fare_histogram"
kind = "histogram"
value = "full_fare_pence"
bins = [0, 1, 100, 200, 400, 800, 2000]
epsilon = 0.1
max_contributions = 2
output = "per_window"
[[aggregates]]
name = "share_capped"
kind = "ratio"
value = "daily_capping"
numerator_values = [true]
epsilon = 0.1
max_contributions = 2
output = "per_window"
[[aggregates.group_by]]
name = "network"
field = ["station", "bus_route"]
hierarchy = "hierarchies/oyster_location.json"
level = "network"
'''


def legacy_config():
    raw = tomllib.loads(LEGACY_TOML)
    raw["stream"] = {"name": "oyster-cards", "privacy_unit": "card_id", "event_time": "event_time"}
    return parse_dp_config(raw, REPO / "configs")


def run(dp, events, partitions: int, w_lo: int, w_hi: int, tag: str):
    """Rows of every partition (with partition and row_id, as the worker publishes them), ledgers, seconds."""
    parts: dict[int, dict[int, list]] = {p: {} for p in range(partitions)}
    for e in events:
        p = zlib.crc32(e["card_id"].encode()) % partitions
        parts[p].setdefault(e["_w"], []).append(e)
    rows, ledgers = [], {}
    t0 = time.perf_counter()
    for p, by_w in parts.items():
        ledger = BudgetLedger(None, dp.epsilon_budget)
        agg = DPAggregator(dp, ledger, seed=f"bench-{tag}-{p}".encode(), stream="oyster-cards")
        for w in range(w_lo, w_hi):
            for r in agg.process_window(w, by_w.get(w, []), flat=True):
                if r["type"] == "aggregate":
                    rows.append({**r, "partition": p,
                                 "row_id": f"p{p}/{r['aggregate']}/{r['output']}/w{r['release']}/{r['group_key']}"})
        ledgers[p] = (ledger, agg)
    return rows, ledgers, time.perf_counter() - t0


def legacy_days(ledger, days) -> dict:
    """Epsilon a legacy ledger charged per calendar day (its windows' reservations, worst-case individual)."""
    out = {}
    for i, (label, first) in enumerate(days):
        end = days[i + 1][1] - 1 if i + 1 < len(days) else 10 ** 12
        through = ledger.spent_through([end, first - 1])
        out[label] = through[end] - (through[first - 1] if first else 0.0)
    return out


def hour_totals(tag, merged, truth_by_hour, w_lo, day_end_windows) -> dict:
    """Tap-ins per hour of the day, all zones: new = sum over zones of the hourly release (stream_anon.dp.merge
    .marginal); legacy = the tap_ins_per_hour running count of each hour cell at the end of its day."""
    from stream_anon.dp.merge import marginal
    est = {}
    if tag == "new":
        rs = [m for m in merged if m["aggregate"] == "tap_ins_zone_hour" and m["output"] == "per_window"]
        span = {m["window"]: m["span_start_window"] for m in rs}
        for t in marginal(rs, over="zone"):
            est[span[t["window"]]] = t["value"]
    else:
        for m in merged:
            if m["aggregate"] == "tap_ins_per_hour" and m["window"] in day_end_windows:
                first = day_end_windows[m["window"]]
                h0 = first + 4 * int(m["group"]["hour"])             # UTC hours = London hours in November
                est[h0] = m["value"]
    err = [est[h] - t for h, t in truth_by_hour.items() if h in est]
    return {"rmse": float(np.sqrt(np.mean(np.square(err)))) if err else None, "hours": len(err)}


def coarse_rmse(spec, merged_legacy, spans, events_by_w) -> dict:
    """RMSE of the legacy per-window rows of ``spec`` summed over the new config's release spans (the best a
    legacy consumer gets at the new granularity: sums of counts; means and ratios from summed components)."""
    idx = {(m["window"], m["group_key"]): m for m in merged_legacy
           if m["aggregate"] == spec.name and m["output"] == "per_window"}
    keys = ["|".join(map(str, k)) for k in spec.domain]
    err, skipped = [], 0
    for start, end in spans:
        truth = true_cells(spec, events_by_w, range(start, end + 1))
        for key in keys:
            rs = [idx.get((w, key)) for w in range(start, end + 1)]
            if any(r is None for r in rs):
                skipped += 1                            # a window the legacy budget no longer covered
                continue
            t = truth.get(key, [0.0, 0.0])
            if "components" in rs[0]:
                c0, c1 = list(rs[0]["components"])
                a, b = sum(r["components"][c0] for r in rs), sum(r["components"][c1] for r in rs)
                lo, hi = rs[0].get("bounds") or (-math.inf, math.inf)
                if t[1] > 0:
                    err.append(min(max(a / max(b, 1.0), lo), hi) - t[0] / t[1])
            else:
                err.append(sum(r["value"] for r in rs) - t[0])
    return {"rmse": float(np.sqrt(np.mean(np.square(err)))) if err else None, "cells": len(err),
            "cells_skipped_budget_exhausted": skipped}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cards", type=int, default=50000)
    ap.add_argument("--days", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--attack-cards", type=int, default=3000)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "dp_budget.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    params = oyster_cards.OysterCardsParams(cards=args.cards, days=args.days)
    events = oyster_cards.read_events(DATASETS["oyster-cards"].full_path, params)
    for e in events:
        e["_w"] = int(parse_event_time(e["event_time"]) // WINDOW_S)
    gen_s = time.perf_counter() - t0
    new = load_dp_config(REPO / "configs" / "oyster-cards.toml")
    old = legacy_config()
    first_w = new.clock.period_of(events[0]["_w"])[1]
    last = new.clock.period_of(events[-1]["_w"])
    w_lo, w_hi = first_w, last[1] + last[2]
    by_w: dict[int, list] = {}
    for e in events:
        by_w.setdefault(e["_w"], []).append(e)
    result = {"command": "PYTHONPATH=$PWD .venv/bin/python bench/bench_dp_budget.py " + " ".join(sys.argv[1:]),
              "machine": platform.machine(), "python": platform.python_version(),
              "stream": {"dataset": "oyster-cards (full Monday file)", "cards": args.cards, "days": args.days,
                         "events": len(events), "partitions": args.partitions, "windows": w_hi - w_lo,
                         "generate_s": round(gen_s, 1)}}
    merged_by: dict = {}
    dp_days = sorted({new.clock.period_of(w)[:2] for w in range(w_lo, w_hi)}, key=lambda x: x[1])
    for tag, dp in (("new", new), ("legacy", old)):
        rows, ledgers, secs = run(dp, events, args.partitions, w_lo, w_hi, tag)
        merged = merge_rows(rows)
        eps = {p: (lg.spent_by_period() if lg.period_mode else legacy_days(lg, dp_days))
               for p, (lg, _) in ledgers.items()}
        cuts = {}
        for _, agg in ledgers.values():
            for key in ("contributions_cut", "windows_cut"):
                for a, n in agg.metrics.get(key, {}).items():
                    cuts.setdefault(key, {}).setdefault(a, 0)
                    cuts[key][a] += n
        res = {"epsilon_per_card": eps, "epsilon_max_per_card_per_day": max(max(v.values()) for v in eps.values()),
               "epsilon_budget": dp.epsilon_budget, "rows": len(rows), "merged_rows": len(merged),
               "process_s": round(secs, 1), "events_cut": cuts,
               "budget_exhausted_events": sum(a.metrics["budget_exhausted_events"] for _, a in ledgers.values()),
               "aggregates": aggregate_rmse(dp, merged, by_w)}
        # hourly tap-in counts per zone
        truth, hourly = {}, {}
        tap_in_zone = next(s for s in new.aggregates if s.name == "tap_ins_zone_hour")
        for h0 in range(w_lo, w_hi, 4):
            for k, v in true_cells(tap_in_zone, by_w, range(h0, h0 + 4)).items():
                truth[(h0, k)] = v[0]
        if tag == "new":
            for m in merged:
                if m["aggregate"] == "tap_ins_zone_hour" and m["output"] == "per_window":
                    hourly[(m["span_start_window"], m["group_key"])] = m["value"]
        else:
            for m in merged:
                if m["aggregate"] == "taps_per_zone" and m["output"] == "per_window" and m["group"]["event_type"] \
                        == "tap_in":
                    h0 = w_lo + (m["window"] - w_lo) // 4 * 4
                    key = (h0, m["group"]["zone"])
                    hourly[key] = hourly.get(key, 0.0) + m["value"]
        res["hourly_tap_ins_per_zone"] = relative_errors(hourly, truth, 500)
        by_hour: dict = {}
        for (h0, _), v in truth.items():
            by_hour[h0] = by_hour.get(h0, 0) + v
        day_end = {first + n - 1: first for first, n in
                   {new.clock.period_of(w)[1:] for w in range(w_lo, w_hi)}}
        res["tap_ins_per_hour_all_zones"] = hour_totals(tag, merged, by_hour, w_lo, day_end)
        common = [k for k in truth if k in hourly]
        res["hourly_tap_ins_per_zone"]["rmse_all_zone_hours"] = float(np.sqrt(np.mean(
            [(hourly[k] - truth[k]) ** 2 for k in common])))
        result[tag] = res
        merged_by[tag] = merged
        print(tag, json.dumps({k: v for k, v in res.items() if k != "aggregates"}, default=str)[:600], flush=True)
    # legacy figures at the new release granularity (same aggregate names)
    for spec in old.aggregates:
        mine = [m for m in merged_by["new"] if m["aggregate"] == spec.name and m["output"] == "per_window"]
        if not mine:
            continue
        spans = sorted({(m["span_start_window"], m["window"]) for m in mine})
        result["legacy"]["aggregates"][spec.name]["at_new_granularity"] = coarse_rmse(spec, merged_by["legacy"],
                                                                                      spans, by_w)
    t1 = time.perf_counter()
    if args.attack_cards:
        result["membership"] = membership_auc(new, by_w, args.attack_cards, seed=14)
    else:
        result["membership"] = {"auc_no_noise": math.nan, "auc_default_budget": math.nan}
    result["membership"]["seconds"] = round(time.perf_counter() - t1, 1)
    result["targets"] = {
        "epsilon_per_card_per_day_le_1": result["new"]["epsilon_max_per_card_per_day"] <= 1.0 + 1e-9,
        "zone_hours_ge_500_within_10pct": (result["new"]["hourly_tap_ins_per_zone"]["within_10pct"] ==
                                           result["new"]["hourly_tap_ins_per_zone"]["cells"]),
        "membership_auc_default_le_0_55": result["membership"]["auc_default_budget"] <= 0.55,
        "membership_auc_no_noise_ge_0_9": result["membership"]["auc_no_noise"] >= 0.9}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result["targets"]), json.dumps(result["membership"]))


if __name__ == "__main__":
    main()
