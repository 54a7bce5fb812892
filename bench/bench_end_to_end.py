"""End-to-end throughput on the embedded broker next to the engine alone, in the same run (issue 11).

Scenarios: the full Oyster Monday file (525,680 events, k = 10) without DP aggregates, the same with the
aggregates of configs/oyster.toml, the Oyster file under the oyster-cards config with m = 3 (journeys as
individuals), oyster-cards with m = 3, and two workers on the Oyster file. For each: the engine
alone in this process on the same events (events/s), then the events replayed to the broker, a worker started and
timed until every event is accounted for on the output topics, the independent audit, and the worker's CPU
seconds (from /proc). Two rates are reported: over the worker's whole run (consumer-group join, state recovery and
the final idle flush included) and over its processing span (first output to last); CPU likewise, in all and after
the first output (``cpu_us_per_event_span``: without each worker's fixed start). ``end_to_end_vs_engine`` is the
span rate over the engine's rate; ``end_to_end_vs_engine_cpu`` the engine's CPU per event over the workers' (after
their first output): the machine's other load moves the first much more than the second.

    .venv/bin/python bench/bench_end_to_end.py [--events N] [--only oyster,oyster_dp,oyster_m3,cards_m3,two_workers]
        -> bench/results/end_to_end.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stream_anon import contract  # noqa: E402
from stream_anon.audit.kafka_source import audit_from_kafka  # noqa: E402
from stream_anon.broker import EmbeddedBroker  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.kafka.aggregates_view import ledger_charge_by_period, read_rows  # noqa: E402
from stream_anon.kafka.supervise import OutputReader, start_worker_process, stop_worker_process  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.topics import apply_topics, load_topic_definitions  # noqa: E402

SECRET = "bench-e2e-secret-4b6d8f0a2c4e6a8b0d2f4a6c8e0b2d4f"
AUDIT_MAX_WAIT_S = 900.0


def cpu_seconds(pid: int) -> float:
    """CPU (user + system) of the process and of its child processes (the worker's aggregates process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            try:
                total += cpu_seconds(int(child))
            except (OSError, ValueError):      # exited meanwhile
                pass
    return total


def config_file(name: str, workdir: Path, without_dp: bool = False, journeys: bool = False) -> Path:
    """The bundled config (hierarchy paths made absolute), optionally without its DP tables, or with the journey
    as privacy unit (oyster-cards on the Oyster Monday file, which has no card id: every journey an individual,
    the worst case for the m-invariance signature table)."""
    src = contract.config_path(name)
    raw = tomllib.loads(src.read_text())
    text = src.read_text().replace('hierarchy = "hierarchies/', f'hierarchy = "{src.parent}/hierarchies/')
    if without_dp:
        text = text[:text.index("[dp]")] if "[dp]" in text else text
    if journeys:
        text = text.replace('privacy_unit = "card_id"', 'privacy_unit = "journey_id"')
        assert 'privacy_unit = "journey_id"' in text
    path = workdir / f"{name}{'-nodp' if without_dp else ''}{'-journeys' if journeys else ''}.toml"
    path.write_text(text)
    load_config(path)
    assert ("dp" in raw) or not without_dp
    return path


def engine_only(cfg, events) -> dict:
    engine = Engine(cfg, secret=SECRET.encode())
    t0, c0 = time.perf_counter(), time.process_time()
    res = engine.process(events)
    res.extend(engine.flush())
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events_per_s": round(len(events) / dt, 1), "seconds": round(dt, 2),
            "cpu_us_per_event": round(1e6 * cpu / len(events), 2),
            "published": sum(r.published for r in res.releases)}


def end_to_end(cfg_path: Path, events: list, workdir: Path, workers: int = 1, timeout_s: float = 3600,
               compression: str = "lz4") -> dict:
    cfg = load_config(cfg_path)
    workdir.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker() as b:
        apply_topics(b.bootstrap, load_topic_definitions())
        t0 = time.monotonic()
        replay(b.bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False)
        replay_s = time.monotonic() - t0
        app_id = f"bench-{cfg.stream.name}-{workers}"
        start = time.monotonic()
        procs = [start_worker_process(cfg_path, b.bootstrap, workdir / f"state{i}", app_id, 2.0,
                                      workdir / f"worker{i}.log", extra=["--compression", compression])
                 for i in range(workers)]
        reader = OutputReader(b.bootstrap, cfg.stream.name)
        first = None
        cpu = {}
        cpu_at_first = None      # the workers' CPU when the first output was seen: start-up, group join, recovery
        try:
            while time.monotonic() - start < timeout_s:
                reader.poll(500)
                acc = reader.accounting()
                for p in procs:
                    if p.poll() is None:
                        cpu[p.pid] = cpu_seconds(p.pid)
                if first is None and acc["accounted"] > 0:
                    first = time.monotonic()
                    cpu_at_first = sum(cpu.values())
                if acc["accounted"] >= len(events) and acc["deferred"] == 0:
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited: {[p.returncode for p in procs]}")
            done = time.monotonic()
        finally:
            reader.close()
            for p in procs:
                stop_worker_process(p)
        # a loaded machine (2 cores shared) reads the topics slowly: the audit's read may take minutes
        report = audit_from_kafka(b.bootstrap, cfg_path, SECRET.encode(), max_wait_s=AUDIT_MAX_WAIT_S)
        dp_output = dp_output_checks(b.bootstrap, cfg) if cfg.dp is not None else None
        wall, span = done - start, done - (first or start)
        return {"events": len(events), "workers": workers, "replay_s": round(replay_s, 1),
                "wall_s": round(wall, 1), "events_per_s_wall": round(len(events) / wall, 1),
                "processing_span_s": round(span, 1), "events_per_s_span": round(len(events) / span, 1),
                "worker_cpu_s": round(sum(cpu.values()), 1),
                "cpu_us_per_event": round(1e6 * sum(cpu.values()) / len(events), 1),
                # CPU after the first output only: the per-event cost without the fixed start of each worker
                # (imports, consumer-group join, state recovery; ~1-2 CPU-s per worker)
                "worker_cpu_s_before_first_output": round(cpu_at_first or 0.0, 1),
                "cpu_us_per_event_span": round(1e6 * (sum(cpu.values()) - (cpu_at_first or 0.0)) / len(events), 1),
                "accounting": acc, "audit_passed": report.passed,
                "audit_checks": {k: v.get("passed") for k, v in report.checks.items() if isinstance(v, dict)},
                **({"dp_output": dp_output} if dp_output is not None else {})}


def dp_output_checks(bootstrap: str, cfg) -> dict:
    """What the audit does not look at: the committed aggregate rows (their number, which every run of the same
    input and partitioning must repeat) and the ledger's charge stated on them, per period, within the budget."""
    rows = read_rows(bootstrap, cfg.stream.name)
    spent = {str(p): v for p, v in ledger_charge_by_period(rows.values()).items()}
    budget = cfg.dp.epsilon_budget
    within = all(v <= budget * (1 + 1e-9) for v in spent.values())
    return {"aggregate_rows": len(rows), "epsilon_spent_max_by_period": spent, "epsilon_budget": budget,
            "passed": bool(rows) and within}


def ratios(results: dict) -> dict:
    """The issue's paired targets from the scenarios in the file: DP on / off in events/s (>= 0.85), and two
    workers' / one worker's CPU per event (<= 1.1), over the whole run and over the processing span. Meaningful
    only when the scenarios of a pair ran in the same invocation (compare their ``run_at``)."""
    out = {}
    e2e = {name: r["end_to_end"] for name, r in results.items()}
    if "oyster" in e2e and "oyster_dp" in e2e:
        out["dp_vs_nodp_events_per_s_span"] = round(e2e["oyster_dp"]["events_per_s_span"]
                                                    / e2e["oyster"]["events_per_s_span"], 3)
        out["dp_vs_nodp_events_per_s_whole_run"] = round(e2e["oyster_dp"]["events_per_s_wall"]
                                                         / e2e["oyster"]["events_per_s_wall"], 3)
    if "oyster" in e2e and "two_workers" in e2e:
        for key in ("cpu_us_per_event", "cpu_us_per_event_span"):
            if key in e2e["oyster"] and key in e2e["two_workers"]:
                out[f"two_workers_vs_one_{key}"] = round(e2e["two_workers"][key] / e2e["oyster"][key], 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=None, help="first N events (default: the full files)")
    ap.add_argument("--only", default="oyster,oyster_dp,oyster_m3,cards_m3,two_workers")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "end_to_end.json"))
    ap.add_argument("--compression", default="lz4", help="the workers' --compression (lz4, gzip, none)")
    args = ap.parse_args(argv)
    os.environ["STREAM_ANON_SECRET"] = SECRET
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"stream-anon-e2e-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    # scenarios run now replace their earlier results in the file; the others are kept (with their own dates)
    prior = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    out = {"benchmark": "end to end vs engine alone (issue 11)", "machine": {"cpus": os.cpu_count(),
           "python": platform.python_version()}, "results": prior.get("results", {}),
           **({"notes": prior["notes"]} if "notes" in prior else {})}
    oyster = load_events("oyster", full=True, limit=args.events)
    for name in args.only.split(","):
        print(f"[e2e] {name} ...", flush=True)
        if name in ("oyster", "two_workers"):
            path = config_file("oyster", workdir, without_dp=True)
            events = oyster
        elif name == "oyster_dp":
            path = config_file("oyster", workdir)
            events = oyster
        elif name == "oyster_m3":
            path = config_file("oyster-cards", workdir, without_dp=True, journeys=True)
            events = oyster
        elif name == "cards_m3":
            path = config_file("oyster-cards", workdir, without_dp=True)
            events = load_events("oyster-cards", full=True, limit=args.events)
        else:
            raise SystemExit(f"unknown scenario {name}")
        cfg = load_config(path)
        r = {"config": path.name, "m": cfg.anonymization.m, "dp": cfg.dp is not None, "compression": args.compression,
             "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg_at_start": os.getloadavg()}
        r["engine_only"] = engine_only(cfg, events)
        r["end_to_end"] = end_to_end(path, events, workdir / name, workers=2 if name == "two_workers" else 1,
                                     compression=args.compression)
        r["end_to_end_vs_engine"] = round(r["end_to_end"]["events_per_s_span"] / r["engine_only"]["events_per_s"], 3)
        # the same in CPU per event (the engine's / the workers' after their first output): on a machine shared
        # with other work, wall rates follow the load of the moment; CPU much less
        r["end_to_end_vs_engine_cpu"] = round(r["engine_only"]["cpu_us_per_event"]
                                              / r["end_to_end"]["cpu_us_per_event_span"], 3)
        out["results"][name] = r
        out["ratios"] = ratios(out["results"])
        print(f"[e2e] {name}: {json.dumps(r)}", flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"[e2e] ratios: {json.dumps(out['ratios'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
