"""The analyst's query error (issue 29): the streaming releases against offline Mondrian on the same windows and on
the whole table, on the bundled Oyster and Citi Bike slices (and the Oyster cards demo stream with m-invariance and
DP aggregates), writing bench/results/query_error.json.

For each dataset and k: the streaming engine over the slice in file order (one partition, flushed at the end), then
:func:`stream_anon.evaluate.utility.query_error`: the seeded workload of area x hour, station x hour and product x
day range counts (stream_anon/evaluate/workload.py), its relative error over the run per family (mean, median,
90th percentile) for the streaming records, offline Mondrian per engine window and offline Mondrian on the whole
slice, and the spread of the per-release means. For a stream with DP aggregates also the realized and stated error
of its count aggregates.

    .venv/bin/python bench/bench_query_error.py            # about a minute on 2 cores
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from stream_anon import contract
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.evaluate.utility import placement_from_engine, query_error

OUT = Path(__file__).resolve().parent / "results" / "query_error.json"
RUNS = (("oyster", (5, 10, 20)), ("citibike", (5, 10)), ("oyster-cards", (10,)))
SEED = 0


def _per_release_spread(q: dict, variant: str) -> dict:
    means = np.array([r[variant]["all"]["mean"] for r in q["per_release"] if r[variant]["all"]["mean"] is not None])
    if not len(means):
        return {"releases": 0}
    return {"releases": int(len(means)), "median": round(float(np.median(means)), 4),
            "p90": round(float(np.percentile(means, 90)), 4), "max": round(float(means.max()), 4)}


def run() -> dict:
    rows = []
    for name, ks in RUNS:
        base = load_config(contract.config_path(name))
        events = load_events(name)
        for k in ks:
            cfg = base.replace_anonymization(k=k)
            t0 = time.perf_counter()
            placement = placement_from_engine(cfg, events)
            t1 = time.perf_counter()
            q = query_error(cfg, placement, seed=SEED)
            t2 = time.perf_counter()
            row = {"dataset": name, "k": k, "m": cfg.anonymization.m, "events": len(events),
                   "placed": q["events"], "releases": q["releases"], "published_records": q["published_records"],
                   "workload": q["workload"], "run": q["run"], "offline": q["offline"],
                   "per_release_mean": {v: _per_release_spread(q, v) for v in q["run"]},
                   "engine_s": round(t1 - t0, 2), "measure_s": round(t2 - t1, 2)}
            if "dp" in q:
                row["dp"] = q["dp"]
            rows.append(row)
            r = q["run"]
            print(f"{name} k={k}: mean relative error streaming {r['streaming']['all']['mean']} | same windows "
                  f"{r['offline_windows']['all']['mean']} | whole table {r['offline_table']['all']['mean']} "
                  f"({r['streaming']['all']['queries']} queries, {q['releases']} releases)", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=OUT.parent).stdout.strip()
    return {"benchmark": "query_error", "commit": commit, "python": platform.python_version(),
            "seed": SEED, "rows": rows,
            "notes": {"workload": "stream_anon/evaluate/workload.py: per family up to 100 distinct cells drawn from "
                                  "the events (seed 0); relative error |estimate - truth| / truth over queries with "
                                  "a true count, estimates by uniform spread inside each published box",
                      "variants": "streaming: the engine's records (counterfeits included for m-invariance); "
                                  "offline_windows: Mondrian (k in distinct individuals) per engine window; "
                                  "offline_table: Mondrian on the whole slice; suppressed events answer nothing",
                      "per_release_mean": "spread over releases of each release's mean relative error (queries "
                                          "with events in that release)"}}


if __name__ == "__main__":
    result = run()
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
