"""End-to-end throughput on the embedded broker next to the engine alone, in the same run (issue 11).

Scenarios: the full Oyster Monday file (525,680 events, k = 10) without DP aggregates, the same with the
aggregates of configs/oyster.toml, the Oyster file under the oyster-cards config with m = 3 (journeys as
individuals), oyster-cards with m = 3, and two workers on the Oyster file. The re-identification risk figures of
each release (issue 29; on by default) are paired by ``oyster_norisk`` (``[risk] per_release = false``) and
``oyster_population`` (journalist figures and population uniqueness against a declared population of
1,000,000). For each: the events replayed to the broker, the engine alone on the same events (events/s), a worker
started and timed until every event is accounted for on the output topics, the engine alone again, the independent
audit, and the worker's CPU seconds (from /proc). The engine's rate is over its two passes, right before and right
after the workers, each in a fresh process as the worker's: this machine's speed moves by up to 1.5x within minutes,
and the replay and the audit take minutes each. Two rates are reported: over the worker's whole run (consumer-group
join, state recovery and the final idle flush included) and over its processing span (first output to last); CPU
likewise, in all and after the first output (``cpu_us_per_event_span``: without each worker's fixed start).
``end_to_end_vs_engine`` is the span rate over the engine's rate; ``end_to_end_vs_engine_cpu`` the engine's CPU per
event over the workers' (after their first output): the machine's other load moves the first much more than the
second. The processing span ends after the worker's final idle flush, so it holds the quiet time the worker waits
for before it (2 s here), which the engine alone (``flush()`` at once) does not: ``drain`` is the rate at which the
workers' consumer group committed the input (its committed offsets, read every 0.1 s, from the first commit to the
last input offset; the consumer lag drained), CPU likewise, and ``drain_vs_engine`` that rate over the engine's.

    .venv/bin/python bench/bench_end_to_end.py [--events N] [--repeat R]
        [--only oyster,oyster_dp,oyster_m3,cards_m3,two_workers,oyster_norisk,oyster_population]
        -> bench/results/end_to_end.json

``--repeat R`` runs the listed scenarios R times in turn (a, b, a, b, ...: a pair sees the same load) and keeps
each scenario's median run by processing-span rate, with every run's figures under ``runs``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
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
AUDIT_MAX_WAIT_S = 1800.0


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


RISK_POPULATION = 1_000_000     # oyster_population: the [risk] population the journalist figures are against


def config_file(name: str, workdir: Path, without_dp: bool = False, journeys: bool = False,
                risk: str | None = None) -> Path:
    """The bundled config (its hierarchies copied beside it), optionally without its DP tables, or with the journey
    as privacy unit (oyster-cards on the Oyster Monday file, which has no card id: every journey an individual,
    the worst case for the m-invariance signature table); ``risk``: a ``[risk]`` table appended ("off": no risk
    figures on the release metric; "population": against :data:`RISK_POPULATION`)."""
    src = contract.config_path(name)
    raw = tomllib.loads(src.read_text())
    text = src.read_text()
    shutil.copytree(src.parent / "hierarchies", workdir / "hierarchies", dirs_exist_ok=True)   # in its tree
    if without_dp:
        text = text[:text.index("[dp]")] if "[dp]" in text else text
    if journeys:
        text = text.replace('privacy_unit = "card_id"', 'privacy_unit = "journey_id"')
        assert 'privacy_unit = "journey_id"' in text
    if risk is not None:
        assert "[risk]" not in text
        text += {"off": "\n[risk]\nper_release = false\n",
                 "population": f"\n[risk]\npopulation = {RISK_POPULATION}\n"}[risk]
    path = workdir / f"{name}{'-nodp' if without_dp else ''}{'-journeys' if journeys else ''}" \
                     f"{'-risk-' + risk if risk else ''}.toml"
    path.write_text(text)
    load_config(path)
    assert ("dp" in raw) or not without_dp
    return path


def engine_pass(cfg_path: Path, dataset: str, limit: int | None) -> dict:
    """:func:`time_engine` in a process of its own, as the worker runs in its own (the events loaded there first,
    untimed): this process has replayed the events and read the outputs, and its heap is not a fresh one."""
    out = subprocess.run([sys.executable, __file__, "--engine-pass", str(cfg_path), dataset, str(limit or 0)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_engine(cfg, events) -> dict:
    """The engine alone on ``events``: ``process`` then ``flush``, timed (wall and CPU)."""
    engine = Engine(cfg, secret=SECRET.encode())
    t0, c0 = time.perf_counter(), time.process_time()
    res = engine.process(events)
    res.extend(engine.flush())
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": len(events), "events_per_s": round(len(events) / dt, 1), "seconds": round(dt, 3),
            "cpu_s": round(cpu, 3), "cpu_us_per_event": round(1e6 * cpu / len(events), 2),
            "published": sum(r.published for r in res.releases)}


def engine_only(passes: list[dict]) -> dict:
    """The engine alone over its passes (right before and right after the workers' run: this machine's speed
    moves by up to 1.5x within minutes, and the replay and audit take minutes): every pass's events over their
    seconds, CPU likewise, each pass under ``passes``."""
    events, seconds = sum(p["events"] for p in passes), sum(p["seconds"] for p in passes)
    return {"events_per_s": round(events / seconds, 1), "seconds": round(seconds / len(passes), 2),
            "cpu_us_per_event": round(1e6 * sum(p["cpu_s"] for p in passes) / events, 2),
            "published": passes[0]["published"], "passes": passes}


def fresh_broker(kind: str):
    """Tansu (the embedded broker) or Apache Kafka (tests/_apache_kafka.py: one KRaft node from Maven Central's
    jars), new and empty."""
    if kind == "apache":
        sys.path.insert(0, str(ROOT / "tests"))
        from _apache_kafka import ApacheKafka

        return ApacheKafka()
    return EmbeddedBroker()


def end_to_end(cfg_path: Path, events: list, workdir: Path, workers: int = 1, timeout_s: float = 3600,
               compression: str = "lz4", beside=None, broker: str = "tansu") -> dict:
    """The workers' run on a fresh broker. ``beside()``: called right before the workers start (after the replay)
    and right after they stop (before the audit), when the broker is idle: the engine-alone passes."""
    cfg = load_config(cfg_path)
    workdir.mkdir(parents=True, exist_ok=True)
    with fresh_broker(broker) as b:
        apply_topics(b.bootstrap, load_topic_definitions())
        t0 = time.monotonic()
        replay(b.bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False)
        replay_s = time.monotonic() - t0
        if beside is not None:
            beside()
        app_id = f"bench-{cfg.stream.name}-{workers}"
        start = time.monotonic()
        procs = [start_worker_process(cfg_path, b.bootstrap, workdir / f"state{i}", app_id, 2.0,
                                      workdir / f"worker{i}.log", extra=["--compression", compression])
                 for i in range(workers)]
        reader = OutputReader(b.bootstrap, cfg.stream.name)
        drain = DrainWatch(b.bootstrap, app_id, cfg.stream.input_topic)
        first = None
        cpu = {}
        cpu_at_first = None      # the workers' CPU when the first output was seen: start-up, group join, recovery
        try:
            while time.monotonic() - start < timeout_s:
                reader.poll(100)
                acc = reader.accounting()
                for p in procs:
                    if p.poll() is None:
                        cpu[p.pid] = cpu_seconds(p.pid)
                drain.poll(sum(cpu.values()))
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
            drain.close()
            for p in procs:
                stop_worker_process(p)
        if beside is not None:
            beside()
        # the audit reads the whole raw topic: on a loaded machine (2 cores shared) that takes minutes
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
                **drain.figures(), "accounting": acc, "audit_passed": report.passed,
                "audit_checks": {k: v.get("passed") for k, v in report.checks.items() if isinstance(v, dict)},
                **({"dp_output": dp_output} if dp_output is not None else {})}


class DrainWatch:
    """The workers' committed input offsets over time (their consumer group's, read without joining it): when the
    first was committed, when the last input offset was, and the workers' CPU at both."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        import confluent_kafka
        self.consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                                  "enable.auto.commit": False})
        parts = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.tps = [confluent_kafka.TopicPartition(topic, p) for p in sorted(parts)]
        self.ends = [self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in self.tps]
        self.first = self.last = None       # (monotonic time, committed offsets, workers' CPU seconds)

    def poll(self, cpu_s: float) -> None:
        if self.last is not None:
            return
        try:
            got = self.consumer.committed(self.tps, timeout=5)
        except Exception:   # noqa: BLE001 - the group not known yet: nothing committed
            return
        done = sum(min(max(tp.offset, 0), end) for tp, end in zip(got, self.ends))
        now = (time.monotonic(), done, cpu_s)
        if self.first is None and done > 0:
            self.first = now
        if done >= sum(self.ends):
            self.last = now

    def figures(self) -> dict:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return {}
        n = self.last[1] - self.first[1]
        return {"drain_s": round(self.last[0] - self.first[0], 2), "drain_events": n,
                "events_per_s_drain": round(n / (self.last[0] - self.first[0]), 1),
                "cpu_us_per_event_drain": round(1e6 * (self.last[2] - self.first[2]) / n, 1)}

    def close(self) -> None:
        self.consumer.close()


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
    """The issue's paired targets from the scenarios in the file: DP on / off in events/s (>= 0.85), two workers' /
    one worker's CPU per event (<= 1.1), over the whole run and over the processing span, and the risk figures on
    / off (issue 29: within 5%). Meaningful only when the scenarios of a pair ran in the same invocation (compare
    their ``run_at``)."""
    out = {}
    e2e = {name: r["end_to_end"] for name, r in results.items()}

    def paired(tag: str, num: str, den: str, keys) -> None:
        # with --repeat: the ratio of each repeat's pair (run next to each other), then their median; ``keys``:
        # (figure, the name it takes in ``out``)
        pairs = list(zip(results[num].get("runs") or [e2e[num]], results[den].get("runs") or [e2e[den]]))
        for key, name in keys:
            each = [round(a[key] / b[key], 3) for a, b in pairs]
            out[f"{tag}_{name}"] = statistics.median(each)
            if len(each) > 1:
                out[f"{tag}_{name}_per_repeat"] = each

    if "oyster" in e2e and "oyster_dp" in e2e:
        paired("dp_vs_nodp", "oyster_dp", "oyster",
               [("events_per_s_span", "events_per_s_span"), ("events_per_s_wall", "events_per_s_whole_run")])
    for other in ("oyster_norisk", "oyster_population"):     # risk figures on (oyster) against off / heavier
        if "oyster" in e2e and other in e2e:
            tag = "risk_vs_norisk" if other == "oyster_norisk" else "population_vs_risk"
            num, den = ("oyster", other) if other == "oyster_norisk" else (other, "oyster")
            paired(tag, num, den, [(k, k) for k in ("events_per_s_span", "cpu_us_per_event_span", "cpu_us_per_event")])
    if "oyster" in e2e and "two_workers" in e2e:
        for key in ("cpu_us_per_event", "cpu_us_per_event_span"):
            if key in e2e["oyster"] and key in e2e["two_workers"]:
                out[f"two_workers_vs_one_{key}"] = round(e2e["two_workers"][key] / e2e["oyster"][key], 3)
    return out


def scenario(name: str, workdir: Path, oyster: list, args, repeat: int = 0, broker: str = "tansu") -> dict:
    """One run of a scenario: end to end (a fresh broker, and fresh local state: a worker finding the cache of an
    earlier run halts its partitions as after a broker reset) with the engine alone right before and right after
    the workers."""
    if name in ("oyster", "two_workers", "oyster_norisk", "oyster_population"):
        risk = {"oyster_norisk": "off", "oyster_population": "population"}.get(name)
        path = config_file("oyster", workdir, without_dp=True, risk=risk)
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
    dataset = "oyster-cards" if name == "cards_m3" else "oyster"
    cfg = load_config(path)
    r = {"broker": broker, "config": path.name, "m": cfg.anonymization.m, "dp": cfg.dp is not None, "compression": args.compression,
         "risk_per_release": cfg.risk.per_release, "risk_population": cfg.risk.settings.population,
         "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg_at_start": os.getloadavg()}
    passes = []
    run_dir = workdir / (name if broker == "tansu" else f"{name}_{broker}") / f"run{repeat + 1}"
    r["end_to_end"] = end_to_end(path, events, run_dir,
                                 workers=2 if name == "two_workers" else 1, compression=args.compression,
                                 broker=broker, beside=lambda: passes.append(engine_pass(path, dataset, args.events)))
    r["engine_only"] = engine_only(passes)
    r["end_to_end_vs_engine"] = round(r["end_to_end"]["events_per_s_span"] / r["engine_only"]["events_per_s"], 3)
    if "events_per_s_drain" in r["end_to_end"]:
        r["drain_vs_engine"] = round(r["end_to_end"]["events_per_s_drain"] / r["engine_only"]["events_per_s"], 3)
    # the same in CPU per event (the engine's / the workers' after their first output): on a machine shared
    # with other work, wall rates follow the load of the moment; CPU much less
    r["end_to_end_vs_engine_cpu"] = round(r["engine_only"]["cpu_us_per_event"]
                                          / r["end_to_end"]["cpu_us_per_event_span"], 3)
    return r


def median_run(runs: list[dict]) -> dict:
    """The run with the median processing-span rate (the lower middle one of an even number), with every run's
    headline figures under ``runs`` when there are several."""
    ranked = sorted(runs, key=lambda r: r["end_to_end"]["events_per_s_span"])
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    if len(runs) > 1:
        chosen["runs"] = [{"run_at": r["run_at"], "load_avg_at_start": r["load_avg_at_start"],
                           "end_to_end_vs_engine": r["end_to_end_vs_engine"],
                           "end_to_end_vs_engine_cpu": r["end_to_end_vs_engine_cpu"],
                           "drain_vs_engine": r.get("drain_vs_engine"),
                           "engine_events_per_s": [p["events_per_s"] for p in r["engine_only"].get("passes", ())],
                           **{k: r["end_to_end"][k] for k in ("events_per_s_span", "events_per_s_wall",
                                                              "cpu_us_per_event", "cpu_us_per_event_span",
                                                              "events_per_s_drain", "cpu_us_per_event_drain",
                                                              "audit_passed") if k in r["end_to_end"]}}
                          for r in runs]
    return chosen


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--engine-pass"]:            # engine_pass's child: config, dataset, limit (0: all)
        cfg_path, dataset, limit = argv[1], argv[2], int(argv[3]) or None
        print(json.dumps(time_engine(load_config(cfg_path), load_events(dataset, full=True, limit=limit))))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=None, help="first N events (default: the full files)")
    ap.add_argument("--only", default="oyster,oyster_dp,oyster_m3,cards_m3,two_workers")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "end_to_end.json"))
    ap.add_argument("--compression", default="lz4", help="the workers' --compression (lz4, gzip, none)")
    ap.add_argument("--repeat", type=int, default=1, help="run the listed scenarios this many times in turn and "
                    "keep each one's median run (default: 1)")
    ap.add_argument("--brokers", default="tansu", help="comma-separated: tansu, apache (Apache Kafka, needs java "
                    "and mvn); each scenario runs on each, an Apache Kafka result under NAME_apache")
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
    names = args.only.split(",")
    brokers = args.brokers.split(",")
    keys = {(name, kind): name if kind == "tansu" else f"{name}_{kind}" for name in names for kind in brokers}
    runs: dict[str, list] = {key: [] for key in keys.values()}
    for rep in range(args.repeat):
        for (name, kind), key in keys.items():
            print(f"[e2e] {key} ({rep + 1}/{args.repeat}) ...", flush=True)
            runs[key].append(scenario(name, workdir, oyster, args, rep, kind))
            r = median_run(runs[key])
            out["results"][key] = r
            out["ratios"] = ratios(out["results"])
            print(f"[e2e] {key}: {json.dumps(runs[key][-1])}", flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"[e2e] ratios: {json.dumps(out['ratios'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
