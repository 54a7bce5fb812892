"""Differential-privacy aggregates: running-count error of the binary tree vs per-window noising, and the
aggregator's throughput. Writes bench/results/dp.json.

RMSE of running counts: for epsilon in {0.1, 1, 10} and T in {2^8, 2^12, 2^16} windows, both counters run the
real code (stream_anon.dp.continual) over T windows with ``--reps`` independent cells at once (the counters are
vectorized over cells), Laplace noise, sensitivity 1; RMSE over every window t = 1..T and every cell, beside the
theoretical value. Throughput: DPAggregator with the aggregates of configs/oyster.toml over the Oyster events.

    .venv/bin/python bench/bench_dp.py [--reps 256] [--events N]
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stream_anon.dp import BinaryTreeCounter, BudgetLedger, DPAggregator, PerWindowCounter  # noqa: E402
from stream_anon.dp.continual import choose_mechanism, theoretical_running_mse  # noqa: E402
from stream_anon.dp.specs import load_dp_config  # noqa: E402


def running_rmse(counter, T: int, reps: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    rs = np.random.RandomState(seed)
    truth = np.zeros(reps)
    sq = 0.0
    t0 = time.perf_counter()
    for _ in range(T):
        x = rng.poisson(5.0, size=reps).astype(float)
        truth += x
        sq += float(np.sum((counter.update(x, rs) - truth) ** 2))
    return math.sqrt(sq / (T * reps)), time.perf_counter() - t0


def bench_rmse(reps: int) -> list[dict]:
    rows = []
    for T in (2 ** 8, 2 ** 12, 2 ** 16):
        for eps in (0.1, 1.0, 10.0):
            tree = BinaryTreeCounter(reps, eps, 1, "laplace", horizon=T)
            naive = PerWindowCounter(reps, eps, 1, "laplace")
            r_tree, s_tree = running_rmse(tree, T, reps, 1 + int(10 * eps))
            r_naive, s_naive = running_rmse(naive, T, reps, 1000 + int(10 * eps))
            row = {"windows": T, "log2_windows": int(math.log2(T)), "epsilon": eps, "reps": reps,
                   "tree_rmse": r_tree,
                   "tree_rmse_theory": math.sqrt(theoretical_running_mse("binary_tree", T, eps, 1, "laplace")),
                   "per_window_rmse": r_naive,
                   "per_window_rmse_theory": math.sqrt(theoretical_running_mse("per_window", T, eps, 1, "laplace")),
                   "tree_over_per_window": r_tree / r_naive,
                   "auto_choice": choose_mechanism(T, eps, 1, "laplace")["mechanism"],
                   "seconds": s_tree + s_naive}
            rows.append(row)
            print(f"T=2^{row['log2_windows']:<2} eps={eps:<4} tree {r_tree:9.2f} (theory {row['tree_rmse_theory']:9.2f})"
                  f"  per-window {r_naive:9.2f} (theory {row['per_window_rmse_theory']:9.2f})"
                  f"  ratio {row['tree_over_per_window']:.2f}  auto={row['auto_choice']}  {row['seconds']:.1f}s")
    return rows


def bench_throughput(limit: int | None) -> dict:
    from stream_anon.datasets import load_events
    from stream_anon.events import parse_event_time
    cfg = load_dp_config(REPO / "configs/oyster.toml")
    events = load_events("oyster", limit=limit)
    windows: dict[int, list] = {}
    for e in events:
        windows.setdefault(int(parse_event_time(e["event_time"]) // 900), []).append(e)
    agg = DPAggregator(cfg, BudgetLedger(None, cfg.epsilon_budget), seed=b"bench")
    t0 = time.perf_counter()
    n_rows = 0
    for w in sorted(windows):
        n_rows += len(agg.process_window(w, windows[w]))
    secs = time.perf_counter() - t0
    out = {"events": len(events), "windows": len(windows), "aggregates": len(cfg.aggregates), "rows": n_rows,
           "seconds": secs, "events_per_s": len(events) / secs,
           "contributions_cut": agg.metrics["contributions_cut"], "epsilon_spent": agg.ledger.spent}
    print(f"aggregator: {len(events)} Oyster events, {len(windows)} windows, {len(cfg.aggregates)} aggregates, "
          f"{n_rows} rows in {secs:.2f}s = {out['events_per_s']:.0f} events/s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=256)
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--out", default=str(REPO / "bench/results/dp.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = {"benchmark": "dp", "python": platform.python_version(), "machine": platform.machine(),
              "noise": "laplace (diffprivlib Laplace), sensitivity 1",
              "rmse": "over every window t=1..T and every rep", "running_counts": bench_rmse(args.reps),
              "aggregator_throughput": bench_throughput(args.events)}
    result["total_seconds"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} ({result['total_seconds']:.1f}s)")


if __name__ == "__main__":
    main()
