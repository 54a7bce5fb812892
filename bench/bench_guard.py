"""Regression guard of the engine (issue 42), run first by ``make bench``: the engine benchmark (k = 10 and m = 3
on the full Oyster Monday) run now, compared with the results last committed (``git show HEAD:...``, else the
files as they are): the ratio of CPU events/s (now / committed) and whether the output fingerprint is the same.
A changed fingerprint fails (exit 1): an optimization must leave the releases unchanged, and a change of the
output is committed with its new results. Speed is printed, not judged: this machine's speed moves by up to 1.5x
between runs (read the ratio beside the machine's load). Writes bench/results/guard.json.

    .venv/bin/python bench/bench_guard.py [--passes 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"engine": ("bench/results/engine.json", []), "engine_m3": ("bench/results/engine_m3.json", ["--m", "3"])}


def committed(path: str) -> dict | None:
    out = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0:
        return json.loads(out.stdout)
    p = ROOT / path
    return json.loads(p.read_text()) if p.exists() else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=1, help="runs of each benchmark (median taken)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "guard.json"))
    args = ap.parse_args(argv)
    report = {"run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "load_average_at_start": os.getloadavg()[0], "results": {}}
    failed = False
    for name, (path, extra) in RUNS.items():
        before = committed(path)
        rates, prints = [], set()
        for _ in range(args.passes):
            with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                subprocess.run([sys.executable, str(ROOT / "bench" / "bench_engine.py"), *extra, "--out", tmp.name],
                               cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
                now = json.loads(Path(tmp.name).read_text())
            rates.append(now["engine_cpu_events_per_s"])
            prints.add(now["fingerprint_sha256"])
        rate = statistics.median(rates)
        row = {"engine_cpu_events_per_s": rate, "passes": rates, "fingerprints": sorted(prints),
               "committed_engine_cpu_events_per_s": before and before["engine_cpu_events_per_s"],
               "ratio_to_committed": before and round(rate / before["engine_cpu_events_per_s"], 3),
               "fingerprint_unchanged": before is not None and prints == {before["fingerprint_sha256"]}}
        failed |= not row["fingerprint_unchanged"]
        report["results"][name] = row
        print(f"{name}: {rate:,.0f} events per CPU second, {row['ratio_to_committed']} x the committed "
              f"{row['committed_engine_cpu_events_per_s']:,}; output "
              f"{'unchanged' if row['fingerprint_unchanged'] else 'CHANGED'}", flush=True)
    k, m3 = (report["results"][n]["engine_cpu_events_per_s"] for n in RUNS)
    report["m3_over_k_only"] = round(m3 / k, 3)
    print(f"m = 3 engine at {report['m3_over_k_only']} of the k-only engine")
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
