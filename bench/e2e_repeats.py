"""Summary of repeated end-to-end runs (the machine's drift is +-20% between runs, so the pairwise ratios of
one run are read next to those of the others): per run the figures of ``oyster``, ``oyster_dp`` and
``two_workers`` (those the runs have) and the run's ratios, then median, min and max of each.

    for i in 1 2 3; do .venv/bin/python bench/bench_end_to_end.py --only oyster,oyster_dp,two_workers \\
        --out /tmp/e2e_rep$i.json; done
    .venv/bin/python bench/e2e_repeats.py /tmp/e2e_rep*.json  -> bench/results/end_to_end_repeats.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("events_per_s_span", "events_per_s_wall", "cpu_us_per_event", "cpu_us_per_event_span")


def run_row(path: Path) -> dict:
    doc = json.loads(path.read_text())
    res = doc["results"]
    row = {"file": path.name, "run_at": res["oyster"]["run_at"],
           "engine_only_events_per_s": res["oyster"]["engine_only"]["events_per_s"],
           "oyster_vs_engine": res["oyster"]["end_to_end_vs_engine"]}
    for name in [n for n in ("oyster", "oyster_dp", "two_workers") if n in res]:
        e = res[name]["end_to_end"]
        row.update({f"{name}.{f}": e[f] for f in FIELDS})
        row[f"{name}.audit_passed"] = e["audit_passed"]
        if "dp_output" in e:          # runs since the DP output was checked (bench_end_to_end.dp_output_checks)
            row[f"{name}.aggregate_rows"] = e["dp_output"]["aggregate_rows"]
            row[f"{name}.dp_output_audit_passed"] = e["dp_output"]["passed"]
    row.update(doc["ratios"])
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "end_to_end_repeats.json"))
    args = ap.parse_args(argv)
    rows = [run_row(p) for p in args.runs]
    if len({frozenset(r) for r in rows}) != 1:
        ap.error("the runs measured different configurations (--only): summarize like with like")
    numeric = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out = {"benchmark": "repeated end-to-end runs (issue 11)", "runs": rows,
           "median": {k: statistics.median(r[k] for r in rows) for k in numeric},
           "min": {k: min(r[k] for r in rows) for k in numeric},
           "max": {k: max(r[k] for r in rows) for k in numeric},
           "all_audits_passed": all(v for r in rows for k, v in r.items() if k.endswith("audit_passed"))}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("median", "min", "max", "all_audits_passed")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
