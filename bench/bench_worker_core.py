"""The worker's processing without Kafka: ``WorkerCore`` on the full Oyster Monday file, as one worker sees it
(4 input partitions keyed as ``replay`` keys them, each event's unit checked against its partition, batches of
10,000 messages split by partition, the garbage collector tuned as in the worker), with and without the DP aggregates of
``configs/oyster.toml``. Per event: CPU in ``WorkerCore.process`` (parse, validate, engine, DP, output records)
and in building and encoding the state records; the state bytes written. No broker: the cost of the worker's own
work, which the end-to-end benchmark (``bench_end_to_end.py``) measures together with the broker's.

    .venv/bin/python bench/bench_worker_core.py [--events N] [--partitions 4] -> bench/results/worker_core.json

``dp_release_us_per_event``: the CPU in ``PartitionAggregates.messages`` (the aggregates' cells, noise, ledger
and serialized rows of the closed windows). ``risk_us_per_event`` / ``risk_share``: the CPU in
``render.release_risk_figures`` (the re-identification risk figures of each release metric, issue 29); the run
``no_dp_population`` adds the journalist figures against a declared ``[risk] population``. ``--code DIR``: measure the ``stream_anon`` of another checkout (e.g. a
``git worktree`` of an earlier commit), for paired runs of two versions on one machine:

    git worktree add /tmp/before <commit>
    for i in 1 2 3; do .venv/bin/python bench/bench_worker_core.py --only dp --code /tmp/before --out /tmp/a$i.json
                       .venv/bin/python bench/bench_worker_core.py --only dp --out /tmp/b$i.json; done
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
CODE = Path(sys.argv[sys.argv.index("--code") + 1]).resolve() if "--code" in sys.argv[:-1] else ROOT
sys.path.insert(0, str(CODE))
sys.path.insert(0, str(ROOT / "bench"))

import orjson  # noqa: E402

import stream_anon  # noqa: E402,F401  (first: from CODE, before bench_end_to_end puts this checkout first)
from stream_anon import crypto  # noqa: E402
from stream_anon.worker.placement import partitions_for  # noqa: E402
from bench_end_to_end import config_file, cpu_seconds  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.worker import aggregates as kafka_aggregates  # noqa: E402
from stream_anon.worker import state as st  # noqa: E402
from stream_anon.kafka.app import tune_gc  # noqa: E402
from stream_anon import render  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402

SECRET = b"bench-worker-core-secret-0123456789abcdef"


def run(cfg_path: Path, raws: list[bytes], parts: list[int], partitions: int, batch: int,
        aggregates_process: bool = False) -> dict:
    core = WorkerCore(load_config(cfg_path), "bench-core", SECRET, aggregates_process=aggregates_process,
                      aggregates_setup=tune_gc)
    if hasattr(core, "check_placement"):    # absent before issue 39 (--code DIR)
        core.check_placement(partitions)    # as the Kafka worker: each event's unit checked against its partition
    in_release = [0.0]
    release_messages = kafka_aggregates.PartitionAggregates.messages

    def timed_messages(self, *args, **kwargs):
        c = time.process_time()
        try:
            return release_messages(self, *args, **kwargs)
        finally:
            in_release[0] += time.process_time() - c
    kafka_aggregates.PartitionAggregates.messages = timed_messages
    in_risk = [0.0]
    risk_figures = getattr(render, "release_risk_figures", None)     # absent before issue 29 (--code DIR)

    def timed_risk(*args, **kwargs):
        c = time.process_time()
        try:
            return risk_figures(*args, **kwargs)
        finally:
            in_risk[0] += time.process_time() - c
    if risk_figures is not None:
        render.release_risk_figures = timed_risk
    states = [core.open_partition(p) for p in range(partitions)]
    offsets = [0] * partitions
    t_process = t_state = t_wait = 0.0
    state_bytes = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(0, len(raws), batch):
        by_partition: dict[int, list] = {}
        for j in range(i, min(i + batch, len(raws))):
            p = parts[j]
            by_partition.setdefault(p, []).append((offsets[p], raws[j]))
            offsets[p] += 1
        done = []                   # as the loop: every partition's batch, then their state records
        for p, messages in by_partition.items():
            ps = states[p]
            c = time.process_time()
            done.append((ps, messages, core.process(ps, messages)))
            t_process += time.process_time() - c
        for ps, messages, out in done:
            c2, w = time.process_time(), time.perf_counter()
            out = core.complete(ps, out, messages)
            record = core.state_record(ps, ps.seq + 1, out.last_offset)   # what a transaction writes
            state_bytes += len(st.encode_state(record))
            if hasattr(ps, "note_committed"):
                ps.note_committed(record)
            else:           # a checkout before the partition pipeline (--code DIR of an earlier commit)
                core.note_committed(ps, record)
            t_state += time.process_time() - c2
            t_wait += (time.perf_counter() - w) - (time.process_time() - c2)
    for ps in states:
        core.complete(ps, core.flush(ps))
    total = time.process_time() - c0
    wall = time.perf_counter() - w0
    child_cpu = cpu_seconds(core.aggregates_process.pid) if core.aggregates_process is not None else 0.0
    core.close()
    kafka_aggregates.PartitionAggregates.messages = release_messages
    if risk_figures is not None:
        render.release_risk_figures = risk_figures
    n = len(raws)
    out = {"cpu_us_per_event": round(1e6 * total / n, 2), "process_us_per_event": round(1e6 * t_process / n, 2),
           "state_records_us_per_event": round(1e6 * t_state / n, 2), "state_mb_written": round(state_bytes / 1e6, 1),
           "dp_release_us_per_event": round(1e6 * in_release[0] / n, 2),
           "dp_release_share": round(in_release[0] / total, 3), "wall_us_per_event": round(1e6 * wall / n, 2),
           "risk_us_per_event": round(1e6 * in_risk[0] / n, 3), "risk_share": round(in_risk[0] / total, 4)}
    if aggregates_process:
        # the main process's CPU no longer holds the release path; the child's is reported beside it, and the
        # time the main thread waited for the child (state records and releases not ready)
        out.update({"aggregates_process_cpu_us_per_event": round(1e6 * child_cpu / n, 2),
                    "waited_for_aggregates_us_per_event": round(1e6 * t_wait / n, 2)})
    return out



def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=None, help="first N events (default: the full file)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10000, help="messages per consumed batch (all partitions)")
    ap.add_argument("--only", choices=("no_dp", "dp", "no_dp_population"), default=None,
                    help="one of the runs (for profiling)")
    ap.add_argument("--aggregates-process", action="store_true",
                    help="the DP run with the aggregates in their own process (as the worker on 2+ CPUs)")
    ap.add_argument("--code", default=str(ROOT), help="checkout whose stream_anon is measured (default: this one)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "worker_core.json"))
    args = ap.parse_args(argv)
    if Path(args.code).resolve() != CODE:     # read before the imports, from "--code DIR"
        ap.error("--code: give it as '--code DIR'")
    events = load_events("oyster", full=True, limit=args.events)
    raws = [orjson.dumps(e) for e in events]
    # the partition replay gives them: Kafka's default partitioner on the unit's keyed pseudonym
    parts = partitions_for(crypto.pseudonym_keys(SECRET, [e["journey_id"] for e in events]), args.partitions).tolist()
    del events
    tune_gc()               # as the worker does at start (fewer cyclic collections; the start's objects frozen)
    workdir = Path(tempfile.mkdtemp(prefix="stream-anon-core-"))
    results = {}
    for name, without_dp, risk in (("no_dp", True, None), ("dp", False, None), ("no_dp_population", True,
                                                                                 "population")):
        if args.only not in (None, name):
            continue
        path = config_file("oyster", workdir, without_dp=without_dp, **({"risk": risk} if risk else {}))
        results[name] = run(path, raws, parts, args.partitions, args.batch,
                            aggregates_process=args.aggregates_process and not without_dp)
        print(f"[worker core] {name}: {results[name]}", flush=True)
    out = {"benchmark": "WorkerCore without Kafka, DP aggregates on and off (issue 11)",
           "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "code": str(CODE), "events": len(raws), "gc": "tuned as in the worker (stream_anon.kafka.app.tune_gc)",
           "partitions": args.partitions, "batch": args.batch, "results": results,
           }
    if "dp" in results and "no_dp" in results:
        out["dp_overhead_us_per_event"] = round(results["dp"]["cpu_us_per_event"]
                                                - results["no_dp"]["cpu_us_per_event"], 2)
        out["no_dp_vs_dp_cpu"] = round(results["no_dp"]["cpu_us_per_event"] / results["dp"]["cpu_us_per_event"], 3)
        print(json.dumps({k: out[k] for k in ("dp_overhead_us_per_event", "no_dp_vs_dp_cpu")}))
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
