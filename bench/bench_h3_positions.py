"""Positions published as real H3 cells (issue 44): the bundled H3 configs before (strict Mondrian, resolutions
[5, 12], as on main) and after (h3-mondrian, configs/obd2-h3.toml and configs/citibike-h3.toml as bundled), on the
bundled slices. Writes bench/results/h3_positions.json.

Engine part (bench/h3_figures.py): one engine per partition of the raw topic as the worker runs them (1 partition,
and the raw topics' 4 partitions under three secrets: a unit's partition follows its keyed pseudonym, so the secret
decides which drivers share an engine), the independent audit on the outputs (k, coverage with h3 itself,
suppression within the config's limit, ...) and the position figures: share of the whole domain, mean published
resolution, position NCP (cell area over the domain's) over the run and per release, the coarsest cell.

Broker part (``--broker``): the bundled config through the embedded broker, a worker and audit_from_kafka (as
``stream-anon demo``), with a fixed secret; the audit's verdict, suppression and its health figures (whole domain,
H3 positions). obd2 twice: on the bundled raw topic's 4 partitions, and on a raw topic of 1 partition (one car's 19
drivers: 4 partitions leave an engine with 1 to 3 drivers, fewer than k = 3 in most day windows whatever the
strategy).

    .venv/bin/python bench/bench_h3_positions.py [--broker] [--only obd2,citibike]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from h3_figures import figures, variant  # noqa: E402

from stream_anon.datasets import load_events  # noqa: E402

SECRETS = [b"bench-h3-positions-secret-a-0123456789", b"bench-h3-positions-secret-b-0123456789",
           b"bench-h3-positions-secret-c-0123456789"]
CONFIGS = {"obd2": "configs/obd2-h3.toml", "citibike": "configs/citibike-h3.toml"}
# main's settings of the same configs (before issue 44)
BEFORE = {"obd2": ({"strategy": "mondrian", "window_s": 86400, "max_delay_s": 172800}, {"position": [5, 12]}),
          "citibike": ({"strategy": "mondrian", "window_s": 21600, "max_delay_s": 21600},
                       {"start": [5, 12], "end": [5, 12]})}


def engine_runs(name: str) -> dict:
    events = load_events(name)
    out = {}
    for label, config in (("before", variant(CONFIGS[name], *BEFORE[name])), ("after", variant(CONFIGS[name]))):
        runs = [figures(config, CONFIGS[name], events, SECRETS[0], 1)]
        runs += [{**figures(config, CONFIGS[name], events, s, 4), "secret": i} for i, s in enumerate(SECRETS)]
        out[label] = runs
        for r in runs:
            print(f"{name:8s} {label:6s} partitions={r['partitions']} secret={r.get('secret', 0)} "
                  f"suppression={r['suppression_ratio']} (limit {r['max_suppression_ratio']}) audit="
                  f"{r['audit_passed']} {r['failed_checks']} engine_s={r['engine_seconds']} "
                  f"positions={json.dumps(r['positions'])}", flush=True)
    return out


def broker_run(name: str, raw_partitions: int | None = None) -> dict:
    from stream_anon import contract, crypto
    from stream_anon.audit.kafka_source import audit_from_kafka
    from stream_anon.broker import EmbeddedBroker
    from stream_anon.config import load_config
    from stream_anon.kafka.replay import replay, unit_key_fn
    from stream_anon.kafka.supervise import run_until_accounted
    from stream_anon.kafka.topics import apply_topics, load_topic_definitions

    secret = SECRETS[0]
    config_path = REPO / CONFIGS[name]
    config = load_config(config_path)
    events = load_events(name)
    work = Path(tempfile.mkdtemp(prefix="bench-h3-positions-"))
    previous = os.environ.get(crypto.SECRET_ENV)
    os.environ[crypto.SECRET_ENV] = secret.decode()
    try:
        with EmbeddedBroker() as broker:
            definitions = load_topic_definitions()
            raw_topic = contract.Topics.raw(config)
            if raw_partitions is not None:       # created first: apply_topics leaves an existing topic alone
                apply_topics(broker.bootstrap, [replace(definitions[raw_topic], partitions=raw_partitions)])
            apply_topics(broker.bootstrap, definitions)
            replay(broker.bootstrap, raw_topic, events,
                   key_fn=unit_key_fn(config.stream.privacy_unit), secret=secret)
            t0 = time.monotonic()
            acc = run_until_accounted(config_path, broker.bootstrap, work / "state", len(events), timeout_s=900,
                                      log_path=work / "worker.log")
            worker_s = time.monotonic() - t0
            report = audit_from_kafka(broker.bootstrap, config_path, secret, idle_s=1.0)
    finally:
        if previous is None:
            os.environ.pop(crypto.SECRET_ENV, None)
        else:
            os.environ[crypto.SECRET_ENV] = previous
    s, h = report.summary, report.health or {}
    per_release = (h.get("h3_positions") or {}).get("releases") or {}
    out = {"config": CONFIGS[name], "raw_partitions": raw_partitions or definitions[raw_topic].partitions,
           "events_in": s["events_in"], "published": s["published"],
           "suppressed": s["suppressed"], "suppression_ratio": round(s["suppressed"] / max(s["events_in"], 1), 4),
           "max_suppression_ratio": config.anonymization.max_suppression_ratio, "releases": s["releases"],
           "classes": s["classes"], "min_individuals": s["min_individuals"], "audit_passed": report.passed,
           "verdict_reason": report.verdict_reason,
           "failed_checks": sorted(n for n, c in report.checks.items() if not c["passed"]),
           "whole_domain": (h.get("whole_domain") or {}).get("run"),
           "h3_positions": (h.get("h3_positions") or {}).get("run"),
           "h3_positions_releases": len(per_release), "worker_seconds": round(worker_s, 1),
           "accounted": {k: acc.get(k) for k in ("published", "suppressed", "deferred", "dead_lettered")}}
    print(f"{name:8s} broker {json.dumps(out)}", flush=True)
    print("\n".join(report.format_health()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", action="store_true", help="also run the bundled configs through broker and worker")
    ap.add_argument("--only", default="obd2,citibike")
    args = ap.parse_args()
    path = REPO / "bench" / "results" / "h3_positions.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results.update({"platform": platform.platform(), "python": platform.python_version(),
                    "secrets": "three bench constants (partition placement follows the keyed pseudonym)"})
    for name in args.only.split(","):
        entry = results.setdefault(name, {})
        entry["engine"] = engine_runs(name)
        if args.broker:
            entry["broker"] = [broker_run(name)] + ([broker_run(name, raw_partitions=1)] if name == "obd2" else [])
        path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
