"""The worker's input check alone: JSON payloads of the Oyster day -> checked events and the reader's columns.

Batches of ``--batch`` payloads (2,500: the worker's 10,000-message batch over 4 partitions), the garbage collector
tuned as in the worker. Passes alternate (general, decoded, general, ...) so that both paths see the machine's speed
of the moment; per path the best and the median pass in CPU microseconds per event:

- ``general``: :func:`stream_anon.worker.input_checks.parse_payloads` (orjson per payload) and
  :func:`stream_anon.events.schema_columns` (row-wise columns, checked a column at a time);
- ``check_batch``: :func:`stream_anon.worker.input_checks.check_batch`, what the worker runs (the msgspec decoder of
  :mod:`stream_anon.schema_decoder` for a batch of complete events).

    .venv/bin/python bench/bench_input_checks.py [--events N] [--passes 5] -> bench/results/input_checks.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.events import schema_columns  # noqa: E402
from stream_anon.kafka.app import tune_gc  # noqa: E402
from stream_anon.worker.input_checks import check_batch, parse_payloads  # noqa: E402


def general(batches, config) -> None:
    for raws in batches:
        events, rejected = parse_payloads(raws, config)
        assert not rejected and schema_columns(events, config.stream.kind) is not None


def decoded(batches, config) -> None:
    for raws in batches:
        _, rejected, columns = check_batch(raws, config)
        assert not rejected and columns is not None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000, help="first N events of the day (default 200,000)")
    ap.add_argument("--batch", type=int, default=2500)
    ap.add_argument("--passes", type=int, default=5, help="passes per path, alternating")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "input_checks.json"))
    args = ap.parse_args(argv)
    config = load_config(ROOT / "configs" / "oyster.toml")
    raws = [orjson.dumps(e) for e in load_events("oyster", full=True, limit=args.events)]
    batches = [raws[i:i + args.batch] for i in range(0, len(raws), args.batch)]
    tune_gc()
    paths = {"general": general, "check_batch": decoded}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.passes):
        for name, run in paths.items():
            c = time.process_time()
            run(batches, config)
            cpu[name].append(1e6 * (time.process_time() - c) / len(raws))
    out = {"benchmark": "input check of the worker alone (issue 27)",
           "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "events": len(raws), "batch": args.batch, "passes": args.passes,
           "results": {name: {"best_us_per_event": round(min(v), 2),
                              "median_us_per_event": round(statistics.median(v), 2),
                              "passes_us_per_event": [round(x, 2) for x in v]} for name, v in cpu.items()}}
    out["check_batch_vs_general_median"] = round(out["results"]["check_batch"]["median_us_per_event"]
                                                 / out["results"]["general"]["median_us_per_event"], 3)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"[input checks] {json.dumps(out['results'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
