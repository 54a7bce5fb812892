"""Engine speed on positions (issue 44): the bundled H3 configs with strict Mondrian (main's strategy) and with
h3-mondrian, every other setting as bundled (so the windows are the same), one engine over the time-sorted bundled
slice, 1,000 events per batch. CPU seconds of the process (``time.process_time``: this machine is shared, wall
time moves with the other load), best of ``--repeat`` runs taken in turn (a, b, a, b). Writes
bench/results/h3_speed.json.

    .venv/bin/python bench/bench_h3_speed.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from h3_figures import variant  # noqa: E402

from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.engine.space import parse_time  # noqa: E402

CONFIGS = {"obd2": "configs/obd2-h3.toml", "citibike": "configs/citibike-h3.toml"}


def cpu_seconds(config, events) -> float:
    engine = Engine(config, secret=b"bench-h3-speed-secret-0123456789")
    t0 = time.process_time()
    for i in range(0, len(events), 1000):
        engine.process(events[i:i + 1000])
    engine.flush()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = {"platform": platform.platform(), "python": platform.python_version(), "repeat": args.repeat}
    for name, path in CONFIGS.items():
        events = sorted(load_events(name), key=lambda e: parse_time(e["event_time"]))
        configs = {"mondrian": variant(path, {"strategy": "mondrian"}), "h3-mondrian": variant(path)}
        runs = {label: [] for label in configs}
        for _ in range(args.repeat):
            for label, config in configs.items():
                runs[label].append(round(cpu_seconds(config, events), 3))
        best = {label: min(r) for label, r in runs.items()}
        out[name] = {"events": len(events), "cpu_s": runs, "events_per_cpu_s": {
            label: round(len(events) / s) for label, s in best.items()},
            "h3_mondrian_over_mondrian": round(best["h3-mondrian"] / best["mondrian"], 3)}
        print(name, json.dumps(out[name]), flush=True)
    path = REPO / "bench" / "results" / "h3_speed.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
