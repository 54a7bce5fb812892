"""No state-topic value over 900 KB with the state of 300,000 cards (issue 28), on the embedded broker or (``--broker
apache``, issue 40) on Apache Kafka with its default message limits.

The oyster-cards stream (m = 3, the DP aggregates) of ``--cards`` cards over one day of the full Oyster Monday
(as ``bench/bench_sizing.py``) through a worker loop, ``--partitions`` input partitions. Its full state records
are several MB a partition, so they are written in parts (stream_anon.checkpoint.split_value). Measured: the
largest value of the state topic (the figure the issue asks for), the largest whole state record, the records
written in parts and their parts, the largest message of each output topic (the producers' message.max.bytes
holds for them too), the state topic's max.message.bytes as the broker describes it; then a second worker
recovers through the broker (barrier, committed marker, parts reassembled) and its state is compared with the
first one's, table by table.

    STREAM_ANON_SHARED_DATA=/work/shared/data .venv/bin/python bench/bench_state_size.py [--cards 300000]
        -> bench/results/state_size.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from _kafka_helpers import write_cards_config  # noqa: E402
from stream_anon import checkpoint, contract  # noqa: E402
from stream_anon.audit.kafka_source import read_topic  # noqa: E402
from stream_anon.broker import EmbeddedBroker  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import DATASETS, oyster_cards  # noqa: E402
from stream_anon.kafka import state as st  # noqa: E402
from stream_anon.kafka.core import WorkerCore  # noqa: E402
from stream_anon.kafka.loop import KafkaLoop  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.topics import ensure_topics  # noqa: E402

SECRET = b"bench-state-size-secret-0123456789abcdef"
_T = contract.topics()
SHARED = (_T.releases, _T.deadletter, _T.metrics, _T.aggregates)


def run_loop(cfg, bootstrap: str, app_id: str, cache: Path):
    core = WorkerCore(cfg, app_id, SECRET, aggregates_process=False)
    loop = KafkaLoop(core, {"bootstrap.servers": bootstrap}, cache_dir=cache)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    return core, loop, thread


def stop(loop, thread) -> None:
    loop.stop()
    thread.join(120)
    if loop.error is not None:
        raise RuntimeError(f"worker loop failed: {loop.error!r}")


def wait_for(cond, timeout_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"waited {timeout_s} s for {what}")
        time.sleep(0.5)


def state_of(ps) -> dict:
    """What a partition's state record holds: its core as JSON and its tables as bytes."""
    tables = {name: (np.asarray(k).tobytes(), r if isinstance(r, list) else np.asarray(r).tobytes())
              for name, (k, r) in ps.full_tables().items()}
    cores = orjson.loads(orjson.dumps({"engine": ps.engine.state_core(), "dp": ps.dp.state_core()},
                                      option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    return {"seq": ps.seq, "offset": ps.offset, "cores": cores, "tables": tables}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cards", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=2, help="input partitions")
    ap.add_argument("--broker", choices=("tansu", "apache"), default="tansu",
                    help="apache: Apache Kafka with its default limits (tests/_apache_kafka.py, needs java and mvn), "
                    "which refuses a message over message.max.bytes where Tansu takes it")
    ap.add_argument("--out", default=None, help="default bench/results/state_size.json (state_size_apache.json)")
    args = ap.parse_args(argv)
    args.out = args.out or str(ROOT / "bench" / "results" /
                               ("state_size.json" if args.broker == "tansu" else f"state_size_{args.broker}.json"))
    full = DATASETS["oyster-cards"].full_path
    if not full.exists():
        raise SystemExit(f"full data {full} absent (set STREAM_ANON_SHARED_DATA)")
    from confluent_kafka.admin import AdminClient, ConfigResource

    work = Path(tempfile.mkdtemp(prefix="stream-anon-state-size-"))
    events = oyster_cards.read_events(full, oyster_cards.OysterCardsParams(cards=args.cards, days=1))
    cfg = load_config(write_cards_config(work / "cfg", "bigstate", "raw.test.bigstate"))
    topic, app_id = cfg.stream.input_topic, "bigstate-app"
    out: dict = {"benchmark": "state record size with many individuals (issue 28)",
                 "command": f"bench/bench_state_size.py --cards {args.cards} --partitions {args.partitions} "
                            f"--broker {args.broker}", "broker": args.broker,
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "cards": args.cards,
                 "cards_travelling": len({e["card_id"] for e in events}), "events": len(events),
                 "partitions": args.partitions, "part_max_bytes": checkpoint.PART_MAX_BYTES,
                 "producer_message_max_bytes": st.MESSAGE_MAX_BYTES}
    if args.broker == "apache":
        from _apache_kafka import ApacheKafka, kafka_version

        fresh, out["broker"] = ApacheKafka(), f"Apache Kafka {kafka_version()}"
    else:
        fresh = EmbeddedBroker()
    with fresh as broker:
        ensure_topics(broker.bootstrap, names=[topic, "anon.bigstate.records", *SHARED],
                      default_partitions={topic: args.partitions, "anon.bigstate.records": 1})
        sent = replay(broker.bootstrap, topic, events, "card_id", progress=False, secret=SECRET)
        t0 = time.monotonic()
        core, loop, thread = run_loop(cfg, broker.bootstrap, app_id, work / "cache")
        try:
            wait_for(lambda: len(core.parts) == len(sent["partitions"]) and all(
                core.parts[p].offset + 1 == n for p, n in sent["partitions"].items()), 3600,
                "the worker to commit every input offset")
            out["process_s"] = round(time.monotonic() - t0, 1)
            parts = dict(core.parts)
            time.sleep(1.0)
            before = {p: state_of(ps) for p, ps in parts.items()}
            whole = {p: len(checkpoint.encode_state(ps.snapshot(core.stream, core.topic))) for p, ps in parts.items()}
            out["halted"] = dict(loop.halted)
            out["transactions"] = loop.counters["transactions"]
        finally:
            stop(loop, thread)

        values = [v for _, v in read_topic(broker.bootstrap, st.state_topic(app_id), idle_s=1.0) if v is not None]
        in_parts = {}
        for v in values:
            if st.header(v) and st.header(v)[0] == st.KIND_PART:
                part = st.read_part(v)
                in_parts[(part.seq, part.digest)] = part.count
        out["state_values"] = len(values)
        out["state_value_max_bytes"] = max(len(v) for v in values)
        out["state_record_max_bytes_whole"] = max(whole.values())
        out["state_record_bytes_whole_per_partition"] = {str(p): n for p, n in sorted(whole.items())}
        out["records_in_parts"] = len(in_parts)
        out["parts_per_record_max"] = max(in_parts.values(), default=1)
        out["output_message_max_bytes"] = {
            t: max((len(v) for _, v in read_topic(broker.bootstrap, t, idle_s=1.0) if v is not None), default=0)
            for t in ("anon.bigstate.records", *SHARED)}
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        found = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, st.state_topic(app_id))])
        configs = {n: c.value for f in found.values() for n, c in f.result(30).items()}
        out["state_topic_max_message_bytes"] = configs.get("max.message.bytes")

        t0 = time.monotonic()
        core2, loop2, thread2 = run_loop(cfg, broker.bootstrap, app_id, work / "cache")
        try:
            wait_for(lambda: loop2.ready and len(core2.parts) == len(before), 1800, "the second worker to recover")
            out["recovery_s"] = round(time.monotonic() - t0, 1)
            out["recovery_halted"] = dict(loop2.halted)
            after = {p: state_of(ps) for p, ps in core2.parts.items()}
            out["recovered_records_in_parts"] = {str(p): sorted(ps.record_parts.items())
                                                 for p, ps in core2.parts.items()}
        finally:
            stop(loop2, thread2)
    out["recovered_state_equal"] = {str(p): after.get(p) == before[p] for p in before}
    out["passed"] = (out["state_value_max_bytes"] <= 900_000 and all(out["recovered_state_equal"].values())
                     and not out["halted"] and not out["recovery_halted"])
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "recovered_records_in_parts"}, indent=1))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
