"""Input formats: events/s of decoding and of the worker's in-process path, per bundled input format."""
from __future__ import annotations

import math
import time
from pathlib import Path

from stream_anon import contract

def format_throughput(batch: int = 1000, repeat: int = 3) -> list[dict]:
    """Events/s per input format on the bundled data, in process (no broker): ``decode`` = the message decoder
    alone (``check_payload`` for the built-in JSON shape); ``worker`` = ``WorkerCore.handle`` in batches of
    ``batch`` messages on one partition (decode, reader, engine, serialization of every output message), best of
    ``repeat`` runs (each). The decoder's caches (parsed times) are warm after the first run. Inputs: Citi Bike
    trips as built-in JSON events and as CSV records (20,000), the raw Oyster and OBD-II CSV files (33,536 taps,
    8,261 readings), the OBD-II readings as Tesla payloads in protobuf and protojson (8,261), Citi Bike as
    GTFS-realtime feeds (20,000 vehicles in 15-minute snapshots)."""
    import orjson

    from stream_anon.config import load_config
    from stream_anon.datasets import load_events
    from stream_anon.inputs import Decoder, file_messages
    from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads
    from stream_anon.worker.core import WorkerCore
    from stream_anon.worker.input_checks import check_payload

    checkout = Path(__file__).resolve().parents[2] / "configs"     # a source checkout, else the installed configs
    cfg_dir = checkout if (checkout / "inputs" / "obd2-tesla.toml").is_file() else contract.configs_dir()
    cases: list[tuple[str, str, str | list[bytes]]] = [    # (label, config, messages or a bundled file's name)
        ("json (built-in shape)", "citibike", [orjson.dumps(e) for e in load_events("citibike")]),
        ("csv", "citibike-csv", "citibike_slice.csv.gz"),
        ("csv", "oyster-csv", "oyster_slice.csv.gz"),
        ("csv", "obd2-csv", "obd2_19drivers.csv.gz"),
        ("tesla-fleet-telemetry protobuf", "obd2-tesla", tesla_payloads("protobuf")),
        ("tesla-fleet-telemetry json", "obd2-tesla", tesla_payloads("json")),
        ("gtfs-realtime", "citibike-gtfs", gtfs_feeds())]
    rows = []
    for label, name, messages in cases:
        cfg = load_config(cfg_dir / f"{name}.toml" if name == "citibike" else cfg_dir / "inputs" / f"{name}.toml")
        if isinstance(messages, str):       # a bundled raw file, one message per record
            messages = list(file_messages(contract.data_path(messages), cfg.input))
        t_dec = math.inf
        for _ in range(repeat):
            if cfg.input.legacy:
                t0 = time.perf_counter()
                n_events = sum(1 for m in messages if check_payload(m, cfg) is not None)
            else:
                dec = Decoder(cfg.input, cfg.limits.max_event_bytes)
                t0 = time.perf_counter()
                n_events = sum(max(1, len(dec.decode(m, "t", 0, i).events)) for i, m in enumerate(messages))
            dt = time.perf_counter() - t0
            t_dec = min(t_dec, dt)
        best = math.inf
        for _ in range(repeat):
            core = WorkerCore(cfg, "bench", b"bench-secret-0123456789abcdef")
            msgs = [(0, offset, m) for offset, m in enumerate(messages)]
            t0 = time.perf_counter()
            for start in range(0, len(msgs), batch):
                core.handle(msgs[start:start + batch])
            core.flush_all()
            dt = time.perf_counter() - t0
            events_in = core.stats.totals["events_in"]
            best = min(best, dt)
        rows.append({"format": label, "config": name, "messages": len(messages), "events": events_in,
                     "bytes_per_message": round(sum(map(len, messages)) / len(messages), 1),
                     "decode_events_per_s": round(n_events / t_dec), "worker_events_per_s": round(events_in / best)})
    return rows
