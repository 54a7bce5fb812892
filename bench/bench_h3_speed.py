"""Engine speed on positions (issue 44): the bundled H3 configs with strict Mondrian (main's strategy) and with
h3-mondrian, every other setting as bundled (so the windows are the same), one engine over the time-sorted bundled
slice, 1,000 events per batch. CPU seconds of the process (``time.process_time``: this machine is shared, wall
time moves with the other load), best of ``--repeat`` runs taken in turn (a, b, a, b). Writes
bench/results/h3_speed.json.

``--baseline DIR``: also the engine of another checkout (a ``git worktree`` of the commit before issue 44, whose
bundled H3 configs used strict Mondrian) on its own bundled configs and slices, in a subprocess, in the same
turns: the speed on positions the issue started from, ``h3_mondrian_over_baseline`` the ratio of CPU seconds.

    git worktree add --detach /tmp/h3base e58f8d8^
    .venv/bin/python bench/bench_h3_speed.py [--repeat 3] [--baseline /tmp/h3base]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
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


# run inside the baseline checkout: its engine, its bundled config and slice, the same batches and timing
BASELINE_RUN = """
import sys, time
sys.path.insert(0, ".")
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.engine import Engine
from stream_anon.engine.space import parse_time
events = sorted(load_events(sys.argv[1]), key=lambda e: parse_time(e["event_time"]))
engine = Engine(load_config(sys.argv[2]), secret=b"bench-h3-speed-secret-0123456789")
t0 = time.process_time()
for i in range(0, len(events), 1000):
    engine.process(events[i:i + 1000])
engine.flush()
print(len(events), time.process_time() - t0)
"""


def baseline_cpu_seconds(code: Path, name: str, path: str) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", BASELINE_RUN, name, path], cwd=code, check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", type=Path, default=None, help="checkout of the engine to compare with")
    args = ap.parse_args()
    out = {"platform": platform.platform(), "python": platform.python_version(), "repeat": args.repeat,
           "baseline": None if args.baseline is None else subprocess.run(
               ["git", "rev-parse", "--short", "HEAD"], cwd=args.baseline, capture_output=True, text=True).stdout.strip()}
    for name, path in CONFIGS.items():
        events = sorted(load_events(name), key=lambda e: parse_time(e["event_time"]))
        configs = {"mondrian": variant(path, {"strategy": "mondrian"}), "h3-mondrian": variant(path)}
        runs = {label: [] for label in [*configs, *(["baseline"] if args.baseline else [])]}
        n_events = {label: len(events) for label in configs}
        for _ in range(args.repeat):
            for label, config in configs.items():
                runs[label].append(round(cpu_seconds(config, events), 3))
            if args.baseline:
                n_events["baseline"], cpu = baseline_cpu_seconds(args.baseline, name, path)
                runs["baseline"].append(round(cpu, 3))
        best = {label: min(r) for label, r in runs.items()}
        out[name] = {"events": len(events), "cpu_s": runs, "events_per_cpu_s": {
            label: round(n_events[label] / s) for label, s in best.items()},
            "h3_mondrian_over_mondrian": round(best["h3-mondrian"] / best["mondrian"], 3)}
        if args.baseline:
            out[name]["baseline_events"] = n_events["baseline"]
            # per event: the baseline's slice may differ in length
            out[name]["h3_mondrian_over_baseline"] = round(
                out[name]["events_per_cpu_s"]["baseline"] / out[name]["events_per_cpu_s"]["h3-mondrian"], 3)
        print(name, json.dumps(out[name]), flush=True)
    path = REPO / "bench" / "results" / "h3_speed.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
