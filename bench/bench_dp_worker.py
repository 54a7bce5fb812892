"""Throughput cost of the DP aggregates in the worker: the same Oyster input with and without the ``[dp]`` /
``[[aggregates]]`` tables of configs/oyster.toml. Writes bench/results/dp_worker.json.

1. In process (no broker): ``WorkerCore.process_batch`` over the input in batches of ``--batch`` messages, with a
   producer stub that only collects the serialized messages; four partitions by the keyed pseudonym of the
   privacy unit (as ``replay`` keys them); checkpoints and the ledger are written to disk (fsync) as in the
   worker. Same input, same batches for both configurations; the two modes alternate ``--repeats`` times and
   the best run of each is reported, with its CPU time (all threads) and the thread CPU time spent inside the
   DP glue (``PartitionAggregates.messages`` and its checkpoint state), the figure least disturbed by the other
   jobs of a shared machine. Default input: the full Monday file.
2. On the embedded broker: ``run_until_accounted`` (a worker subprocess until every event is published,
   suppressed or dead-lettered) for each configuration, each on its own topic with the same events. Wall time
   includes the consumer-group join (~3-4 s). Default input: the bundled slice.

    .venv/bin/python bench/bench_dp_worker.py [--events N] [--broker-events N] [--repeats 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stream_anon import crypto  # noqa: E402
from stream_anon.calibrate import dumps as toml_dumps  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.demo import derived_config  # noqa: E402

SECRET = b"bench-dp-worker-secret-0123456789abcdef"


def stream_config(out_dir: Path, name: str, dp: bool) -> Path:
    """configs/oyster.toml (absolute hierarchy paths) as stream ``name`` on topic ``raw.bench.<name>``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = derived_config("oyster", out_dir, dp=dp)
    raw = tomllib.loads(path.read_text())
    raw["stream"].update(name=name, input_topic=f"raw.bench.{name}")
    path.write_text(toml_dumps(raw))
    return path


def in_process(config_path: Path, messages: list, batch: int) -> dict:
    import stream_anon.dp  # noqa: F401  (imported before timing: diffprivlib/sklearn load once per process)
    from stream_anon.kafka import aggregates
    from stream_anon.kafka.core import WorkerCore

    # CPU time of the calling thread inside the DP glue (rows, ledger, metrics; the checkpoint's dp state):
    # the cost of the aggregates themselves, robust to what the other jobs of a shared machine do
    dp_cpu = [0.0]
    originals = {name: getattr(aggregates.PartitionAggregates, name) for name in ("messages", "state_dict")}

    def timed(fn):
        def wrapper(*args, **kwargs):
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                dp_cpu[0] += time.thread_time() - t
        return wrapper
    for name, fn in originals.items():
        setattr(aggregates.PartitionAggregates, name, timed(fn))

    cfg = load_config(config_path)
    sent = {"messages": 0, "aggregates": 0, "bytes": 0}

    async def send(topic, key, value):
        sent["messages"] += 1
        sent["bytes"] += len(value)
        sent["aggregates"] += topic == "anon.aggregates"
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    with tempfile.TemporaryDirectory() as state:
        core = WorkerCore(cfg, state, "bench", SECRET, send)

        async def run():
            for i in range(0, len(messages), batch):
                await core.process_batch(messages[i:i + batch])
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            asyncio.run(run())
        finally:
            for name, fn in originals.items():
                setattr(aggregates.PartitionAggregates, name, fn)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": len(messages), "seconds": round(secs, 3), "events_per_s": round(len(messages) / secs, 1),
            "cpu_seconds": round(cpu, 3), "cpu_us_per_event": round(1e6 * cpu / len(messages), 2),
            "dp_glue_cpu_seconds": round(dp_cpu[0], 3),
            "dp_glue_cpu_us_per_event": round(1e6 * dp_cpu[0] / len(messages), 2),
            "messages_out": sent["messages"], "aggregate_rows": sent["aggregates"],
            "releases": core.stats["releases"], "published": core.stats["published"]}


def on_broker(events: list, work: Path) -> dict:
    from stream_anon.broker import EmbeddedBroker
    from stream_anon.kafka.replay import replay, unit_key_fn
    from stream_anon.kafka.topics import apply_topics, ensure_topics, load_topic_definitions
    from stream_anon.kafka.harness import run_until_accounted

    out = {}
    os.environ[crypto.SECRET_ENV] = SECRET.decode()
    with EmbeddedBroker() as broker:
        apply_topics(broker.bootstrap, load_topic_definitions())
        for mode in ("without_dp", "with_dp"):
            name = f"oyster_{mode}"
            path = stream_config(work / mode, name, dp=mode == "with_dp")
            cfg = load_config(path)
            ensure_topics(broker.bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records"],
                          default_partitions={cfg.stream.input_topic: 4, f"anon.{name}.records": 1})
            replay(broker.bootstrap, cfg.stream.input_topic, events, key_fn=unit_key_fn(cfg.stream.privacy_unit),
                   secret=SECRET, progress=False)
            acc = run_until_accounted(path, broker.bootstrap, work / mode / "state", len(events), timeout_s=280,
                                      log_path=work / mode / "worker.log")
            out[mode] = {k: acc[k] for k in ("expected", "accounted", "seconds", "events_per_s")}
            print(f"broker {mode}: {acc['events_per_s']} events/s ({acc['seconds']} s)", flush=True)
    out["throughput_ratio"] = round(out["with_dp"]["events_per_s"] / out["without_dp"]["events_per_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=None, help="in-process input (default: the full Monday file)")
    ap.add_argument("--broker-events", type=int, default=None, help="broker input (default: the bundled slice)")
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-broker", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench/results/dp_worker.json"))
    args = ap.parse_args()
    from stream_anon.datasets import load_events

    t0 = time.perf_counter()
    events = load_events("oyster", limit=args.events, full=args.events is None)
    messages, next_offset = [], [0, 0, 0, 0]
    for e in events:
        p = int(crypto.pseudonym(SECRET, str(e["journey_id"]))[:8], 16) % 4
        messages.append((p, next_offset[p], json.dumps(e).encode()))
        next_offset[p] += 1
    result = {"benchmark": "dp_worker", "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "config": "configs/oyster.toml with and without [dp]/[[aggregates]] "
                                                "(5 aggregates, 15-minute windows)",
              "in_process": {"input": "full Monday file" if args.events is None else f"first {args.events} events",
                             "batch": args.batch, "runs": {"without_dp": [], "with_dp": []}}}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        paths = {m: stream_config(work / m, "oyster", dp=m == "with_dp") for m in ("without_dp", "with_dp")}
        for r in range(args.repeats):
            for mode in ("without_dp", "with_dp") if r % 2 == 0 else ("with_dp", "without_dp"):
                run = in_process(paths[mode], messages, args.batch)
                result["in_process"]["runs"][mode].append(run)
                print(f"in process {mode}: {run['events_per_s']} events/s ({run['seconds']} s, "
                      f"{run['aggregate_rows']} aggregate rows)", flush=True)
        ip = result["in_process"]
        for mode in ("without_dp", "with_dp"):
            ip[mode] = max(ip["runs"][mode], key=lambda x: x["events_per_s"])
        ip["throughput_ratio"] = round(ip["with_dp"]["events_per_s"] / ip["without_dp"]["events_per_s"], 3)
        ip["cost_us_per_event"] = round(1e6 * (ip["with_dp"]["seconds"] - ip["without_dp"]["seconds"]) /
                                        len(messages), 2)
        ip["cpu_cost_us_per_event"] = round(ip["with_dp"]["cpu_us_per_event"] - ip["without_dp"]["cpu_us_per_event"],
                                            2)
        ip["dp_glue_cpu_us_per_event"] = ip["with_dp"]["dp_glue_cpu_us_per_event"]
        print(f"in process: DP glue {ip['dp_glue_cpu_us_per_event']} us/event of thread CPU", flush=True)
        print(f"in process: with DP {ip['throughput_ratio']:.3f} x the throughput without, "
              f"+{ip['cost_us_per_event']} us/event wall, +{ip['cpu_cost_us_per_event']} us/event CPU", flush=True)
        if not args.no_broker:
            slice_events = load_events("oyster", limit=args.broker_events)
            result["broker"] = {"input": f"{len(slice_events)} events of the bundled slice",
                                **on_broker(slice_events, work)}
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
