"""How long `stream-anon audit` takes against a running worker, and with the worker stopped (issue 28: under 30 s).

The bundled oyster slice is replayed onto an embedded broker, a worker (without --flush-when-idle, as in the README
quick start) runs until its outputs account for the events it can place, and the audit CLI is timed while the
worker keeps running (it writes anon.metrics every few seconds), then again after it stopped.

    .venv/bin/python bench/bench_audit_running.py [--events 3000] [--repeats 3]
        -> bench/results/audit_running.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stream_anon import contract  # noqa: E402
from stream_anon.broker import EmbeddedBroker  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.supervise import OutputReader, start_worker_process, stop_worker_process  # noqa: E402
from stream_anon.kafka.topics import apply_topics, load_topic_definitions  # noqa: E402

SECRET = "bench-audit-secret-0123456789abcdef0123"


def timed_audit(bootstrap: str, report: Path) -> tuple[float, int, str]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "stream_anon.cli", "audit", "--config", "oyster", "--broker",
                           bootstrap, "--report", str(report)], capture_output=True, text=True, timeout=600)
    return time.monotonic() - t0, done.returncode, done.stdout.splitlines()[0] if done.stdout else done.stderr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "audit_running.json"))
    args = ap.parse_args(argv)
    os.environ["STREAM_ANON_SECRET"] = SECRET
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"stream-anon-audit-bench-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    events = load_events("oyster", limit=args.events)
    cfg = load_config(contract.config_path("oyster"))
    out = {"benchmark": "audit against a running worker", "events": len(events), "running": [], "stopped": []}
    with EmbeddedBroker() as b:
        apply_topics(b.bootstrap, load_topic_definitions())
        replay(b.bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False)
        worker = start_worker_process(contract.config_path("oyster"), b.bootstrap, work / "state", "bench-audit",
                                      None, work / "worker.log", extra=["--metrics-interval", "5"])
        reader = OutputReader(b.bootstrap, cfg.stream.name)
        try:
            last, since = -1, time.monotonic()
            # placed events stop growing (the rest is in open windows), after the worker placed some
            while last <= 0 or time.monotonic() - since < 10:
                reader.poll(500)
                now = reader.accounting()["accounted"]
                if now != last:
                    last, since = now, time.monotonic()
        finally:
            reader.close()
        out["placed_before_audit"] = last
        for i in range(args.repeats):
            seconds, code, line = timed_audit(b.bootstrap, work / f"running{i}.json")
            out["running"].append({"seconds": round(seconds, 2), "exit": code, "verdict": line})
            assert worker.poll() is None, "the worker stopped during the audit"
        stop_worker_process(worker)
        for i in range(args.repeats):
            seconds, code, line = timed_audit(b.bootstrap, work / f"stopped{i}.json")
            out["stopped"].append({"seconds": round(seconds, 2), "exit": code, "verdict": line})
    for key in ("running", "stopped"):
        out[f"{key}_median_s"] = statistics.median(r["seconds"] for r in out[key])
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
