"""A 4x-longer stream: the Oyster Monday (525,680 real taps) shifted by whole days, four days (~2.1M events),
through one engine, writing bench/results/long_stream.json (issue 11 items 2 and 5).

Day d repeats the Monday with event times + d days and ids made unique per day (``event_id`` and ``journey_id``
suffixed ``-d<d>``: the privacy unit is the journey, so every day brings ~400k new individuals). Two runs:

* ``k10``: configs/oyster.toml (k = 10);
* ``m3``:  configs/oyster-cards.toml (m = 3, invariant ``product_category``) with the journey as privacy unit
  (the Oyster file has no card id): every individual gets a signature, the worst case for the signature table;
  default ``m_horizon_s`` (7 days: the table grows over the 4 days);
* ``m3-1d``: the same with ``m_horizon_s = 86400``: the table stops growing once the horizon is reached;
* ``k10-dp`` (not run by default): ``k10`` with the DP aggregates of configs/oyster.toml (a period per day: the
  unit window table and the budget ledger, written with every state record).
  ``--runs k10-dp --out bench/results/long_stream_dp.json``.

A separate **state record scaling** measurement encodes delta records of a fixed change set (5,000 signature rows
put, 500 deleted, the same core) against signature tables of growing size, to show that a delta's time and bytes do
not depend on the number of individuals in the table.

Both with the timestamp QI's upper bound widened to cover the four days. Per day: events/s of the engine (CPU
seconds, one core, numpy pinned to 1 thread) and with checkpoints; RSS at the end of the day and peak RSS so far;
individuals seen; sizes of the keyed tables. The events go through the worker's core (WorkerCore.process: payload
checks, reader, engine, output serialization; DP aggregates off but in ``k10-dp``) and after every batch the partition's state
record is built and encoded as the worker writes it to the state topic (stream_anon.worker.state: core + table
changes, or a full record); per day the bytes and seconds of the state records (mean, max, p50 of deltas, full
records) next to what a single document of the whole state (the earlier format) would cost at the end of the day.

    .venv/bin/python bench/bench_long_stream.py [--days 4] [--runs k10,m3] [--batch 5000] [--events N]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from stream_anon import checkpoint  # noqa: E402

from stream_anon.config import parse_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.worker import state as st  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"bench-secret-long-stream-0123456789"
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def config(run: str, days: int, **anon):
    path = ROOT / "configs" / ("oyster.toml" if run.startswith("k10") else "oyster-cards.toml")
    raw = tomllib.loads(path.read_text())
    if run == "m3-1d":
        raw["anonymization"]["m_horizon_s"] = 86400
    if run.startswith("m3"):
        raw["stream"]["name"] = "oyster-m3"
        raw["stream"]["privacy_unit"] = "journey_id"
    else:
        raw["anonymization"]["k"] = 10
    raw["anonymization"].update(anon)
    for q in raw["quasi_identifiers"]:
        if q["kind"] == "timestamp":
            q["lower"] = "2009-11-09T00:00:00+00:00"
            q["upper"] = f"2009-11-{9 + days:02d}T06:00:00+00:00"
    return parse_config(raw, base_dir=path.parent, source=path)


def shifted(events: list[dict], day: int, dates: dict) -> list[dict]:
    """The events of day ``day``: times + day days, ids unique per day (made one batch at a time, so that only
    one day's source events are held in memory)."""
    if day == 0:
        return events
    out = []
    for e in events:
        t = e["event_time"]
        d = t[:10]
        nd = dates.get(d)
        if nd is None:
            y, m, dd = map(int, d.split("-"))
            nd = dates[d] = f"{y:04d}-{m:02d}-{dd + day:02d}"     # November 2009: no month change up to day 20
        c = dict(e)
        c["event_time"] = nd + t[10:]
        c["event_id"] = f"{e['event_id']}-d{day}"
        c["journey_id"] = f"{e['journey_id']}-d{day}"
        out.append(c)
    return out


def single_document_cost(engine) -> tuple[int, float]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # child: measure, report, exit without cleanup
        t0 = time.process_time()
        core, tables = checkpoint.full_state(engine)
        doc = checkpoint.encode_state(checkpoint.StateRecord.full_of({"seq": 0, "offset": -1, "engine": core},
                                                                     tables))
        os.write(w, json.dumps([len(doc), time.process_time() - t0]).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        nbytes, secs = json.loads(fh.read())
    os.waitpid(pid, 0)
    return nbytes, secs


def run_stream(run: str, base: list[dict], days: int, batch: int, **anon) -> dict:
    cfg = config(run, days, **anon)
    if not run.endswith("-dp"):
        cfg = dataclasses.replace(cfg, dp=None)
    core = WorkerCore(cfg, "bench", SECRET)
    ps = core.open_partition(0)
    engine = ps.engine
    per_day = len({e["journey_id"] for e in base})      # journeys are suffixed per day: distinct every day
    out_days = []
    published = suppressed = rejected = releases = 0
    for day in range(days):
        dates: dict = {}
        cpu_engine = cpu_state = 0.0
        wall0 = time.perf_counter()
        st_bytes, st_secs, st_kinds = [], [], []
        for i in range(0, len(base), batch):
            chunk = shifted(base[i:i + batch], day, dates)
            msgs = [(ps.offset + 1 + j, orjson.dumps(e)) for j, e in enumerate(chunk)]
            t0 = time.process_time()
            res = core.process(ps, msgs)
            t1 = time.process_time()
            rec = core.state_record(ps, ps.seq + 1, res.last_offset)
            nbytes = len(st.encode_state(rec))
            ps.note_committed(rec)
            kind = "full" if rec.full else "delta"
            t2 = time.process_time()
            cpu_engine += t1 - t0
            cpu_state += t2 - t1
            st_bytes.append(nbytes)
            st_secs.append(t2 - t1)
            st_kinds.append(kind)
            releases += res.counts["releases"]
            published += res.counts["published"]
            suppressed += res.counts["suppressed"]
            rejected += res.counts["dead_letters"]
        wall = time.perf_counter() - wall0
        del chunk, msgs
        engine = ps.engine
        # what a single document (the earlier format) of the whole state would cost now, measured in
        # a forked child so that its transient Python lists do not count in this process's peak RSS
        full_bytes, full_s = single_document_cost(engine)
        tables = {name: t for name, t in engine._tables().items()}
        deltas = [b for b, k in zip(st_bytes, st_kinds) if k == "delta"]
        delta_s = [s for s, k in zip(st_secs, st_kinds) if k == "delta"]
        n = len(base)
        row = {
            "day": day + 1, "events": n,
            "engine_events_per_s_cpu": round(n / cpu_engine),
            "with_state_records_events_per_s_cpu": round(n / (cpu_engine + cpu_state)),
            "wall_s": round(wall, 2),
            "rss_mb_end_of_day": round(rss_mb(), 1), "peak_rss_mb_so_far": round(peak_mb(), 1),
            "individuals_seen": per_day * (day + 1),
            "tables": {name: {"rows": len(t), "mb": round(t.nbytes / 2**20, 2)} for name, t in tables.items()},
            "state_records": {
                "count": len(st_kinds), "full": st_kinds.count("full"), "deltas": len(deltas),
                "mean_bytes": round(float(np.mean(st_bytes))), "max_bytes": int(max(st_bytes)),
                "delta_p50_bytes": int(np.median(deltas)) if deltas else None,
                "mean_ms": round(1000 * float(np.mean(st_secs)), 2), "max_ms": round(1000 * max(st_secs), 2),
                "delta_p50_ms": round(1000 * float(np.median(delta_s)), 2) if deltas else None,
                "us_per_event": round(1e6 * cpu_state / n, 2),
            },
            "single_document_state_end_of_day": {"bytes": full_bytes, "ms": round(1000 * full_s, 1)},
        }
        print(run, json.dumps(row), flush=True)
        out_days.append(row)
    res = core.flush(ps)
    releases += res.counts["releases"]
    published += res.counts["published"]
    suppressed += res.counts["suppressed"]
    first, last = out_days[0], out_days[-1]
    return {
        "run": run, "stream": cfg.stream.name, "k": cfg.anonymization.k, "m": cfg.anonymization.m,
        "m_horizon_s": cfg.anonymization.m_horizon_s, "duplicate_horizon_s": cfg.limits.duplicate_horizon_s,
        "days": out_days, "releases": releases, "published": published, "suppressed": suppressed,
        "rejected": rejected,
        "day4_vs_day1": {
            "events_per_s": round(last["engine_events_per_s_cpu"] / first["engine_events_per_s_cpu"], 3),
            "rss": round(last["rss_mb_end_of_day"] / first["rss_mb_end_of_day"], 3),
            "state_delta_p50_ms": (round(last["state_records"]["delta_p50_ms"]
                                         / first["state_records"]["delta_p50_ms"], 3)
                                   if first["state_records"]["delta_p50_ms"] else None),
        },
    }


def state_record_scaling(sizes=(100_000, 400_000, 1_600_000, 6_400_000), repeat: int = 15) -> list:
    """Encoding time and bytes of a delta record with a fixed change set against signature tables of growing
    size (what the worker writes per transaction)."""
    from stream_anon.keyed_table import KeyedTable
    from stream_anon.formers.signatures import SIGNATURE_FIELDS
    rng = np.random.default_rng(0)
    core = {"seq": 1, "offset": 0, "buffer": {"tokens": [f"{i:064x}" for i in range(2000)]}}   # fixed core
    out = []
    for n in sizes:
        table = KeyedTable(SIGNATURE_FIELDS)
        keys = rng.choice(2**62, size=n, replace=False).astype(np.int64)
        rows = np.zeros(n, dtype=table.dtype)
        rows["last"] = rng.random(n)
        table.put(keys, rows)
        table.changes()                                   # the full record's base
        secs, nbytes = [], []
        for r in range(repeat):
            table.put(rng.integers(0, 2**62, size=5000), np.zeros(5000, dtype=table.dtype))
            table.delete(keys[rng.integers(0, n, size=500)])
            t0 = time.perf_counter()
            k, rws, dele = table.changes()
            value = st.encode_state(st.StateRecord(core, {"signatures": (k, rws, dele)}, full=False))
            secs.append(time.perf_counter() - t0)
            nbytes.append(len(value))
        out.append({"table_rows": n, "table_mb": round(table.nbytes / 2**20, 1), "deltas": len(secs),
                    "delta_median_ms": round(1000 * float(np.median(secs)), 2),
                    "delta_median_bytes": int(np.median(nbytes))})
        print("state record scaling", out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--runs", default="k10,m3,m3-1d")
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--events", type=int, default=None, help="first N events of the Monday (quick runs)")
    ap.add_argument("--m-horizon-s", type=float, default=None, help="m3 run: anonymization.m_horizon_s")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "long_stream.json"))
    args = ap.parse_args()
    t0 = time.time()
    base = load_events("oyster", limit=args.events, full=True)
    base_rss = rss_mb()
    print(f"loaded {len(base)} events in {time.time() - t0:.1f} s; rss {base_rss:.0f} MB", flush=True)
    runs = []
    for run in [r for r in args.runs.split(",") if r]:
        anon = {"m_horizon_s": args.m_horizon_s} if run == "m3" and args.m_horizon_s else {}
        runs.append(run_stream(run, base, args.days, args.batch, **anon))
    scaling = state_record_scaling()
    doc = {
        "benchmark": "long stream: Oyster Monday shifted by whole days (issue 11)",
        "command": "python bench/bench_long_stream.py" + "".join(
            f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v is not None
            and v != ap.get_default(k)),
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "numpy_threads": os.environ.get("OMP_NUM_THREADS"),
                    "note": "2 cores shared with other sessions: CPU seconds, not wall time, give events/s"},
        "events_per_day": len(base), "batch": args.batch,
        "rss_mb_after_loading_events": round(base_rss, 1),
        "notes": {
            "rss": "includes the 525,680 source event dicts held for the whole run (loaded once, copied per "
                   "batch); flatness is judged on the change from day 1 to day 4",
            "checkpoints": "one per batch, as the worker does after each delivered batch: a delta record "
                           "(core + table changes) or, when the log would outgrow the snapshot, a snapshot",
            "single_document_state_end_of_day": "a full state record of the engine (core + every table): what "
                                                     "a checkpoint would cost without deltas",
        },
        "runs": runs,
        "state_record_scaling": {"what": "delta state record of 5,000 puts + 500 deletions and a fixed core "
                                         "(changes + encoding) vs rows in the signature table (wall ms, median)",
                                 "rows": scaling},
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out} in {doc['seconds']} s")


if __name__ == "__main__":
    main()
