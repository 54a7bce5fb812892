"""Memory of the open state per distinct unit (issue 42): the m-invariant stream of ``bench_engine.py --m 3``
(configs/oyster-cards.toml with the journey as privacy unit: each journey's signature is kept for ``m_horizon_s``,
default 7 days, and the DP aggregates count each journey's windows in its day) over ``--days`` copies of the full
Oyster Monday, day d shifted by d days with its journey and event ids suffixed (about 260,000 new journeys a
day), through ``WorkerCore`` on one partition in batches of 10,000 messages, as ``bench_sizing.py`` runs it. After every batch:
the process's resident set (``VmRSS``), the rows of the partition's keyed tables (signatures: one per individual
released within the horizon; seen events: one per event within ``limits.duplicate_horizon_s``) and the CPU so far.

The input (events and their encoded messages) is built before the first sample, so the RSS growth from there is the
worker's state and the garbage it keeps. ``rss_bytes_per_unit`` is the least-squares slope of RSS against the
individuals held over the samples after the events within the duplicate horizon levelled off
(:func:`rss_per_unit`), and ``cpu_us_per_event_per_100k_units``
the CPU per event in each successive 100,000 individuals held (flat: no cost grows with the state).

    STREAM_ANON_SHARED_DATA=/work/shared/data .venv/bin/python bench/bench_rss_units.py --days 4
        -> bench/results/rss_units.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from stream_anon.datasets import load_events  # noqa: E402

from stream_anon.kafka.app import tune_gc  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402

SECRET = b"bench-rss-units-secret-0123456789abcdef"
DAY_S = 86400


def shifted_days(days: int) -> list[bytes]:
    """The Oyster Monday repeated ``days`` times, day d shifted by d days, ids suffixed ``-d<d>``; encoded."""
    from datetime import datetime, timedelta
    monday = load_events("oyster", full=True)
    raws = []
    for d in range(days):
        for e in monday:
            e = dict(e)
            e["event_time"] = (datetime.fromisoformat(e["event_time"]) + timedelta(days=d)).isoformat()
            e["event_id"] = f"{e['event_id']}-d{d}"
            e["journey_id"] = f"{e['journey_id']}-d{d}"
            raws.append(orjson.dumps(e))
    return raws


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def table_rows(core, ps) -> dict[str, int]:
    record = ps.snapshot(core.stream, core.topic)
    return {name: len(keys) for name, (keys, _rows, _d) in record.tables.items()}


def seen_rows(sample: dict) -> int:
    return max((n for name, n in sample["table_rows"].items() if "seen" in name), default=0)


def rss_per_unit(samples: list[dict]) -> tuple[float | None, int]:
    """(least-squares slope of RSS growth against individuals held, samples fitted): over the samples once the
    events within the duplicate horizon have levelled off (within 5% of the last sample's), where the individuals
    are what still grows."""
    level = seen_rows(samples[-1])
    late = [s for s in samples if abs(seen_rows(s) - level) <= 0.05 * level]
    x = np.array([s["individuals_held"] for s in late], dtype=float)
    if len(late) < 3 or np.ptp(x) <= 0:
        return None, len(late)
    y = np.array([s["rss_growth_bytes"] for s in late], dtype=float)
    return float(np.polyfit(x, y, 1)[0]), len(late)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--sample-every", type=int, default=10, help="batches between table counts (a snapshot)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rss_units.json"))
    args = ap.parse_args(argv)
    from bench_engine import m_config
    raws = shifted_days(args.days)
    core = WorkerCore(m_config(3), "bench-rss", SECRET,
                      aggregates_process=False, aggregates_setup=tune_gc)
    tune_gc()
    ps = core.open_partition(0)
    gc.collect()
    rss0 = rss_bytes()
    samples = []
    cpu = 0.0
    for b, i in enumerate(range(0, len(raws), args.batch)):
        msgs = [(i + j, raws[i + j]) for j in range(min(args.batch, len(raws) - i))]
        c = time.process_time()
        out = core.complete(ps, core.process(ps, msgs), msgs)
        ps.note_committed(core.state_record(ps, ps.seq + 1, out.last_offset))
        cpu += time.process_time() - c
        if (b + 1) % args.sample_every == 0 or i + args.batch >= len(raws):
            rows = table_rows(core, ps)
            units = max((n for name, n in rows.items() if "signature" in name), default=0)
            samples.append({"events": i + len(msgs), "individuals_held": units, "table_rows": rows,
                            "rss_growth_bytes": rss_bytes() - rss0, "cpu_s": round(cpu, 2)})
            print(json.dumps(samples[-1]), flush=True)
    core.close()
    slope, fitted = rss_per_unit(samples)
    per_100k = []                        # CPU per event while the individuals held went through each 100,000
    prev = {"events": 0, "cpu_s": 0.0, "individuals_held": 0}
    for s in samples:
        if s["individuals_held"] // 100000 > prev["individuals_held"] // 100000 or s is samples[-1]:
            n = s["events"] - prev["events"]
            if n:
                per_100k.append({"individuals_held": s["individuals_held"],
                                 "cpu_us_per_event": round(1e6 * (s["cpu_s"] - prev["cpu_s"]) / n, 1)})
            prev = s
    result = {"benchmark": "RSS and CPU against individuals held in the open state (issue 42)",
              "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "days": args.days, "events": len(raws),
              "individuals_held_at_end": samples[-1]["individuals_held"],
              "rss_growth_bytes_at_end": samples[-1]["rss_growth_bytes"],
              "rss_bytes_per_unit": None if slope is None else round(slope, 1),
              "rss_mb_per_1m_units": None if slope is None else round(slope, 1),
              "fitted_samples": fitted,
              "cpu_us_per_event_per_100k_units": per_100k, "samples": samples,
              "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print({k: v for k, v in result.items() if k != "samples"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
