"""Inputs of the sizing table (docs/operations.md, Sizing) measured in process (no Kafka): the oyster-cards stream
(m-invariance: each card's signature is kept for ``m_horizon_s``) of ``--cards`` cards over one day of the full
Oyster Monday, through ``WorkerCore`` on ONE partition in batches of 10,000 messages. Reports the CPU per event,
the size of a full state record per individual held (the signatures table's rows), and the time to restore the
partition from that record (decode, resolve, open): the in-process part of a restart. Writes --out (JSON).

    STREAM_ANON_SHARED_DATA=/work/shared/data .venv/bin/python bench/bench_sizing.py --cards 300000
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from stream_anon import checkpoint  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import DATASETS, oyster_cards  # noqa: E402
from stream_anon.worker import state as st  # noqa: E402
from stream_anon.kafka.app import tune_gc  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402

SECRET = b"bench-sizing-secret-0123456789abcdef0123"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cards", type=int, default=300000, help="cards (individuals) of the oyster-cards stream")
    ap.add_argument("--batch", type=int, default=10000, help="messages per batch")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sizing.json"))
    args = ap.parse_args(argv)
    params = oyster_cards.OysterCardsParams(cards=args.cards, days=1)
    events = oyster_cards.read_events(DATASETS["oyster-cards"].full_path, params)
    raws = [orjson.dumps(e) for e in events]
    core = WorkerCore(load_config(ROOT / "configs" / "oyster-cards.toml"), "bench-sizing", SECRET,
                      aggregates_process=False, aggregates_setup=tune_gc)
    tune_gc()
    ps = core.open_partition(0)
    c0 = time.process_time()
    for i in range(0, len(raws), args.batch):
        msgs = [(i + j, raws[i + j]) for j in range(min(args.batch, len(raws) - i))]
        out = core.complete(ps, core.process(ps, msgs), msgs)
        ps.note_committed(core.state_record(ps, ps.seq + 1, out.last_offset))
    cpu = time.process_time() - c0
    record = ps.snapshot(core.stream, core.topic)         # the partition's state as one full record
    value = st.encode_state(record)
    tables = {name: len(keys) for name, (keys, _rows, _d) in record.tables.items()}
    individuals = max(n for name, n in tables.items() if "signature" in name)
    w0, c1 = time.perf_counter(), time.process_time()
    decoded = checkpoint.decode_state(value)
    doc, resolved = checkpoint.resolve_chain([decoded])
    core.close_partition(0)
    core.open_partition(0, doc, resolved)
    restore_wall, restore_cpu = time.perf_counter() - w0, time.process_time() - c1
    core.close()
    result = {"cards": args.cards, "events": len(raws), "cpu_s": round(cpu, 2),
              "cpu_us_per_event": round(1e6 * cpu / len(raws), 2), "table_rows": tables,
              "individuals_held": individuals, "full_state_bytes": len(value),
              "state_bytes_per_individual": round(len(value) / max(1, individuals), 1),
              "restore_wall_s": round(restore_wall, 2), "restore_cpu_s": round(restore_cpu, 2),
              "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
