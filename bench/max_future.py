"""How far ahead of the stream the events of each bundled config's data get, and what ``[stream] max_future_s``
dead-letters (issue 28): the value each bundled config sets is chosen from these figures.

``max_future_s`` is judged in stream time, not wall time: an event whose event time is more than ``max_future_s``
beyond the largest event time accepted before it ON ITS PARTITION is dead-lettered as ``future_event_time`` (and
moves nothing, so every later event of that partition stays measured against the old reference). A gap in the
data longer than the value (a night, the days between recordings of a slice cut at 07:30) therefore dead-letters
real events. This script reads each config's data as a replay sends it (file order, the privacy unit's keyed
pseudonym choosing the partition: here a keyed hash per seed, as a secret would), through the engine's record
reader (``stream_anon.engine.records``, exactly the rule the worker applies), on one partition and on the
config's partition count, and reports per config and data: the largest lead of an accepted event over the
largest time before it (``lead_max_s``: any ``max_future_s`` at least this dead-letters nothing), and the reader's
dead letters with the config's value and without it.

    STREAM_ANON_SHARED_DATA=/work/shared/data .venv/bin/python bench/max_future.py [--full] [--seeds 3]
        -> bench/results/max_future.json
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stream_anon import contract  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import DATASETS  # noqa: E402
from stream_anon.engine import get_path  # noqa: E402
from stream_anon.engine.records import FUTURE_EVENT_TIME, RecordReader  # noqa: E402
from stream_anon.engine.space import QISpace  # noqa: E402
from stream_anon.kafka.topics import input_partitions  # noqa: E402

SECRET = b"bench-max-future-secret-0123456789abcdef"
CHUNK = 20000
# the data a config reads: a dataset adapter (load_events), or the files / sample messages of its [input] mapping
DATASET_OF = {"oyster": "oyster", "oyster-cards": "oyster-cards", "citibike": "citibike", "citibike-h3": "citibike",
              "obd2": "obd2", "obd2-h3": "obd2"}
FILES_OF = {"oyster-csv": "oyster", "citibike-csv": "citibike", "obd2-csv": "obd2"}


def bundled_configs() -> list[Path]:
    root = contract.configs_dir()
    return sorted(root.glob("*.toml")) + sorted((root / "inputs").glob("*.toml"))


def messages(name: str, config, full: bool) -> list[list[dict]] | None:
    """The config's data as a replay sends it: one list of events per message, in order (None: no such data)."""
    if name in DATASET_OF:
        ds = DATASETS[DATASET_OF[name]]
        if full and not ds.full_path.exists():
            return None
        return [[e] for e in ds.read(ds.full_path if full else ds.slice_path)]
    from stream_anon.inputs import Decoder, file_messages
    from stream_anon.inputs import samples

    if name in FILES_OF:
        ds = DATASETS[FILES_OF[name]]
        path = ds.full_path if full else ds.slice_path
        if not path.exists():
            return None
        raws = file_messages(path, config.input, "auto", "name")
    elif name == "citibike-gtfs":
        raws = None if full else samples.gtfs_feeds()       # built from the bundled slice only
    elif name == "obd2-tesla":
        raws = None if full else samples.tesla_payloads()   # the bundled obd2 file is the whole recording
    else:
        raise SystemExit(f"no data known for bundled config {name}")
    if raws is None:
        return None
    decoder = Decoder(config.input, max_bytes=1 << 30, secret=SECRET)
    return [[e for e, r in zip(d.events, d.reasons) if r is None]
            for d in (decoder.decode(raw, "replay", 0, n) for n, raw in enumerate(raws))]


def assign(msgs: list[list[dict]], unit: str, partitions: int, seed: int) -> list[list[dict]]:
    """Events per partition: a message goes where the keyed hash of its first event's unit sends it."""
    out: list[list[dict]] = [[] for _ in range(partitions)]
    key = hashlib.sha256(f"seed-{seed}".encode()).digest()
    cache: dict = {}
    for msg in msgs:
        if not msg:
            continue
        u = str(get_path(msg[0], unit))
        p = cache.get(u)
        if p is None:
            p = cache[u] = int.from_bytes(hashlib.blake2b(u.encode(), key=key, digest_size=8).digest(), "big") \
                % partitions
        out[p].extend(msg)
    return out


def read_partition(reader: RecordReader, events: list[dict]) -> tuple[int, int, float]:
    """(dead letters of the reader, of which future_event_time, the largest lead of an accepted event over the
    largest event time accepted before it) for one partition's events in arrival order."""
    largest, rejected, future, lead = -np.inf, 0, 0, 0.0
    for i in range(0, len(events), CHUNK):
        rec, rej = reader.read(events[i:i + CHUNK], largest)
        rejected += len(rej)
        future += sum(r.startswith(FUTURE_EVENT_TIME) for _, r in rej)
        if len(rec):
            before = np.maximum.accumulate(np.concatenate([[largest], rec.times[:-1]]))
            ok = np.isfinite(before)
            if ok.any():
                lead = max(lead, float((rec.times[ok] - before[ok]).max()))
            largest = max(largest, float(rec.times.max()))
    return rejected, future, lead


def measure(path: Path, full: bool, seeds: int) -> dict | None:
    config = load_config(path)
    name = config.stream.name
    msgs = messages(name, config, full)
    if msgs is None:
        return None
    without = dataclasses.replace(config, stream=dataclasses.replace(config.stream, max_future_s=None))
    n_cfg = input_partitions(config)[0]
    runs = []
    for partitions in sorted({1, n_cfg, 4}):
        for seed in range(seeds if partitions > 1 else 1):
            has = config.stream.max_future_s is not None
            row = {"partitions": partitions, "seed": seed, "dead_letters_with": 0 if has else None,
                   "future_with": 0 if has else None, "dead_letters_without": 0, "lead_max_s": 0.0}
            for events in assign(msgs, config.stream.privacy_unit, partitions, seed):
                if not events:
                    continue
                for cfg, tag in ((config, "with"), (without, "without")):
                    if tag == "with" and config.stream.max_future_s is None:
                        continue
                    reader = RecordReader(cfg, QISpace(cfg), SECRET)
                    rej, fut, lead = read_partition(reader, events)
                    row[f"dead_letters_{tag}"] += rej
                    if tag == "with":
                        row["future_with"] += fut
                    else:
                        row["lead_max_s"] = max(row["lead_max_s"], round(lead, 1))
            runs.append(row)
    return {"config": str(path.relative_to(contract.configs_dir())), "data": "full" if full else "bundled",
            "events": sum(len(m) for m in msgs), "max_future_s": config.stream.max_future_s,
            "allowed_lateness_s": config.stream.allowed_lateness_s, "configured_partitions": n_cfg,
            "lead_max_s": max(r["lead_max_s"] for r in runs),
            "future_dead_letters_max": max((r["future_with"] for r in runs if r["future_with"] is not None),
                                           default=None),
            "dead_letters_with_max": max((r["dead_letters_with"] for r in runs if r["dead_letters_with"] is not None),
                                         default=None),
            "dead_letters_without_max": max(r["dead_letters_without"] for r in runs), "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="also the full files under STREAM_ANON_SHARED_DATA")
    ap.add_argument("--seeds", type=int, default=3, help="partition assignments per partition count > 1")
    ap.add_argument("--only", default="", help="comma-separated config names (default: every bundled config)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "max_future.json"))
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    results = []
    for path in bundled_configs():
        if only and path.stem not in only:
            continue
        for full in (False, True) if args.full else (False,):
            t0 = time.monotonic()
            r = measure(path, full, args.seeds)
            if r is None:
                continue
            r["seconds"] = round(time.monotonic() - t0, 1)
            results.append(r)
            print(f"{r['config']:28s} {r['data']:7s} events={r['events']:>8,} max_future_s={r['max_future_s']} "
                  f"lead_max_s={r['lead_max_s']:,.0f} future_dead_letters={r['future_dead_letters_max']} "
                  f"dead_letters with/without={r['dead_letters_with_max']}/{r['dead_letters_without_max']}",
                  flush=True)
    Path(args.out).write_text(json.dumps({"benchmark": "max_future_s against the bundled configs' data (issue 28)",
                                          "command": "bench/max_future.py" + (" --full" if args.full else ""),
                                          "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
