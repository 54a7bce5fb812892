"""End-to-end benchmark: the 525,680 Oyster events through the embedded broker with one worker, audited.

Runs the demo pipeline (stream_anon/demo.py) on the full Monday file and writes bench/results/end_to_end.json.
Throughput = input events / wall seconds from worker start until every event is accounted for (includes the
consumer-group join); the replay is done before the worker starts and is reported separately.

    .venv/bin/python bench/bench_end_to_end.py [--events N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stream_anon.demo import run_demo

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args()
    sys.exit(run_demo("oyster", events=args.events, k=args.k, full=True, timeout_s=3000,
                      report_path=str(ROOT / "bench" / "results" / "end_to_end.json")))
