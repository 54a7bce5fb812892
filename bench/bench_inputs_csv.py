"""The bundled datasets as configs of the [input] layer (issue 13 item 1): the raw Oyster and OBD-II CSV files read
through configs/inputs/oyster-csv.toml and obd2-csv.toml against the adapters (stream_anon/datasets) with the
built-in configs on the same rows. Writes bench/results/inputs_csv.json.

Per dataset, in process, one partition, best of 3 runs:
- ``mapped``: ``decode_file`` (gzip, CSV reader, one message per record, the mapping) then the engine (flushed);
  ``builtin``: the adapter's ``read_events`` then the engine with the built-in config;
- events/s of each step and of both together (over the file's rows);
- the streaming NCP (stream_anon.evaluate.streaming_ncp: records at their class's NCP, suppressed at 1) and
  offline Mondrian on the same events (same windows, whole table), as ``stream-anon evaluate --config --file``;
- what the mapping rejects (dead letters on a broker), by reason.
Plus ``stream_anon.evaluate.format_throughput`` (decoder alone and worker core, every input format).

    PYTHONPATH=. python bench/bench_inputs_csv.py
"""
from __future__ import annotations

import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import DATASETS  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.evaluate import (format_throughput, offline_mondrian, streaming_ncp,  # noqa: E402
                                  table_from_events)
from stream_anon.inputs import decode_file  # noqa: E402

RUNS = {"oyster": ("configs/inputs/oyster-csv.toml", "configs/oyster.toml"),
        "obd2": ("configs/inputs/obd2-csv.toml", "configs/obd2.toml")}
REPEAT = 3


def best_of(read, config) -> dict:
    """Best of REPEAT runs of read() then the engine: seconds of each step, and the events read."""
    best = None
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        events = read()
        t1 = time.perf_counter()
        engine = Engine(config, partition=0, secret=b"bench-inputs-secret-0123456789")
        engine.process(events).extend(engine.flush())
        t2 = time.perf_counter()
        if best is None or t2 - t0 < best["total_s"]:
            best = {"read_s": t1 - t0, "engine_s": t2 - t1, "total_s": t2 - t0, "events": events}
    return best


def main() -> dict:
    out = {"python": platform.python_version(), "machine": platform.machine(), "datasets": {}}
    for name, (mapped_path, builtin_path) in RUNS.items():
        path = DATASETS[name].slice_path
        mapped_cfg, builtin_cfg = load_config(REPO / mapped_path), load_config(REPO / builtin_path)
        _, rejected = decode_file(path, mapped_cfg.input)
        mapped = best_of(lambda: decode_file(path, mapped_cfg.input)[0], mapped_cfg)
        builtin = best_of(lambda: DATASETS[name].read(path), builtin_cfg)
        rows = len(mapped["events"]) + len(rejected)
        entry = {"file": path.name, "rows": rows,
                 "mapping_rejected": dict(Counter(r.split(" (input")[0].split(", got")[0] for _, _, r in rejected))}
        for label, run, cfg in (("mapped", mapped, mapped_cfg), ("builtin", builtin, builtin_cfg)):
            events = run["events"]
            table = table_from_events(cfg.stream.name, cfg, events)
            k, window = cfg.anonymization.k, cfg.anonymization.window_s
            entry[label] = {
                "config": mapped_path if label == "mapped" else builtin_path, "events": len(events),
                "read_events_per_s": round(len(events) / run["read_s"]),
                "engine_events_per_s": round(len(events) / run["engine_s"]),
                "read_and_engine_rows_per_s": round(rows / run["total_s"]),
                "streaming": {key: v for key, v in streaming_ncp(cfg, events).items() if key != "runtime_s"},
                "offline_mondrian_windows_ncp": offline_mondrian(table, k, window)["ncp"],
                "offline_mondrian_table_ncp": offline_mondrian(table, k, None)["ncp"],
            }
            print(name, label, json.dumps({key: v for key, v in entry[label].items() if key != "streaming"}),
                  "streaming ncp", round(entry[label]["streaming"]["ncp"], 5), flush=True)
        out["datasets"][name] = entry
    out["formats"] = format_throughput()
    dest = REPO / "bench" / "results" / "inputs_csv.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest}")
    return out


if __name__ == "__main__":
    main()
