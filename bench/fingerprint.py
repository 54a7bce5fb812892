"""Fingerprints of what the package outputs on fixed runs, to show that a reshaping preserved behaviour.

Each run feeds one bundled stream config the events of its dataset (the bundled slice) through ``WorkerCore``
(no broker: 4 input partitions keyed by the keyed pseudonym of the privacy unit, as ``stream-anon replay`` keys
them; batches of 2,000 messages; every partition flushed at the end; every 500th message replaced by malformed JSON, a
duplicate, an event of the wrong kind or one without its event time, in turn) and audits the output with the independent
audit. Per run it writes the sha256 of each output topic's messages in order (release records, manifests, metrics,
dead letters, DP rows), with the fields that name the wall clock (``created_at``, ``received_at``, ``ts``,
``written_at``) removed, and the audit's verdict and counts. A second part runs ``stream_anon.evaluate`` (the
batch strategies on the Adult slice) and fingerprints its table of figures.

    .venv/bin/python bench/fingerprint.py --out /tmp/fp.json
    .venv/bin/python bench/fingerprint.py --compare /tmp/before.json /tmp/after.json

Two runs of the same code give the same fingerprints (the engine is deterministic for a seed and input; the secret
here is fixed).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from stream_anon import contract, crypto  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402

SECRET = b"fingerprint-secret-0123456789abcdef"
WALL_CLOCK = ("created_at", "received_at", "ts", "written_at", "run_at")
RUNS = {   # run name -> (bundled config, dataset, events)
    "oyster": ("oyster", "oyster", 6000),
    "oyster-cards": ("oyster-cards", "oyster-cards", 6000),
    "citibike": ("citibike", "citibike", 4000),
    "citibike-h3": ("citibike-h3", "citibike", 4000),
    "obd2": ("obd2", "obd2", 4000),
    "obd2-h3": ("obd2-h3", "obd2", 4000),
}
PARTITIONS = 4
BATCH = 2000


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in WALL_CLOCK}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _canonical(value: bytes) -> bytes:
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    return orjson.dumps(_strip(obj), option=orjson.OPT_SORT_KEYS)


def run_stream(name: str) -> dict:
    from stream_anon.audit import AuditConfig, audit
    from stream_anon.worker.core import WorkerCore

    config_name, dataset, n = RUNS[name]
    path = contract.config_path(config_name)
    config = load_config(path)
    events = load_events(dataset, limit=n)
    unit = config.stream.privacy_unit
    core = WorkerCore(config, "fingerprint", SECRET)
    msgs, raw = [], []
    offsets = [0] * PARTITIONS
    for i, event in enumerate(events):
        value = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
        if i % 500 == 499:      # bad input on a fixed schedule: the dead-letter path is fingerprinted too
            kind = (i // 500) % 4
            if kind == 1:       # the previous event again (same partition: duplicates are found per partition)
                event = events[i - 1]
            value = [b"{not json", json.dumps(events[i - 1], separators=(",", ":"), ensure_ascii=False).encode(),
                     json.dumps({**event, "kind": "other"}).encode(),
                     json.dumps({k: v for k, v in event.items() if k != "event_time"}).encode()][kind]
        u = event
        for part in unit.split("."):
            u = u.get(part) if isinstance(u, dict) else None
        p = int(crypto.pseudonym(SECRET, str(u))[:8], 16) % PARTITIONS
        msgs.append((p, offsets[p], value))
        raw.append(((config.stream.input_topic, p, offsets[p]), value))
        offsets[p] += 1
    out = []
    t0 = time.perf_counter()
    for i in range(0, len(msgs), BATCH):
        out += core.handle(msgs[i:i + BATCH])
    out += core.flush_all()
    seconds = time.perf_counter() - t0
    by_topic: dict[str, list[bytes]] = {}
    for topic, _key, value in out:
        by_topic.setdefault(topic, []).append(_canonical(value))
    digests = {t: {"messages": len(v), "sha256": hashlib.sha256(b"\n".join(v)).hexdigest()}
               for t, v in sorted(by_topic.items())}
    outputs = {"records": [], "manifests": [], "deadletters": []}
    names = contract.topics()
    for topic, _key, value in out:
        obj = orjson.loads(value)
        if topic == names.records(config.stream.name):
            outputs["records"].append(obj)
        elif topic == names.releases:
            outputs["manifests"].append(obj)
        elif topic == names.deadletter:
            outputs["deadletters"].append(obj)
    alerts = [orjson.loads(v) for t, _k, v in out if t == names.metrics]
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(path), alerts=alerts)
    summary = {k: v for k, v in report.summary.items() if isinstance(v, (int, float, str, bool, type(None), dict))}
    return {"topics": digests, "audit_passed": report.passed,
            "audit_checks": {c: bool(r.get("passed")) for c, r in report.checks.items()},
            "audit_summary": json.loads(json.dumps(summary, sort_keys=True, default=str)),
            "seconds": round(seconds, 2)}


def run_evaluate() -> dict:
    """``stream_anon.evaluate.evaluate`` of every registered strategy on the bundled Adult slice at k = 10: the
    figures that do not name the wall clock, rounded to 9 digits."""
    from stream_anon import evaluate

    table = evaluate.load_table("adult", limit=2000)
    rows = evaluate.evaluate(table, ["mondrian", "utility-clustering", "heuristicmin", "grouping", "severity",
                                     "car-data"], [10], seed=0)
    out = {}
    for row in rows:
        kept = {k: (round(v, 9) if isinstance(v, float) else v) for k, v in row.items()
                if k not in ("runtime_s",) and not k.endswith("_s")}
        out[f"{row['strategy']}-k{row['k']}"] = json.loads(json.dumps(kept, sort_keys=True, default=str))
    return out


_ABSENT = object()


def _equal(x, y) -> bool:
    """Equality of JSON values where NaN equals NaN (a figure that is undefined in both runs is the same)."""
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_equal(u, v) for u, v in zip(x, y))
    return x == y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the fingerprints to this JSON file")
    ap.add_argument("--only", help="comma-separated run names (default: all)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two fingerprint files")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        same = True
        for run in sorted(set(a["runs"]) | set(b["runs"])):
            ra, rb = a["runs"].get(run), b["runs"].get(run)
            if ra is None or rb is None:
                print(f"{run}: only in {'after' if ra is None else 'before'}")
                same = False
                continue
            for topic in sorted(set(ra["topics"]) | set(rb["topics"])):
                ta, tb = ra["topics"].get(topic), rb["topics"].get(topic)
                ok = ta == tb
                same &= ok
                print(f"{run:14s} {topic:28s} {'same' if ok else 'DIFFERENT'} "
                      f"{(ta or {}).get('messages')} / {(tb or {}).get('messages')}")
            for key in ("audit_passed", "audit_checks", "audit_summary"):
                ok = ra[key] == rb[key]
                same &= ok
                print(f"{run:14s} {key:28s} {'same' if ok else 'DIFFERENT'}")
        for name in sorted(set(a.get("evaluate", {})) | set(b.get("evaluate", {}))):
            ra, rb = a.get("evaluate", {}).get(name) or {}, b.get("evaluate", {}).get(name) or {}
            differ = sorted(k for k in set(ra) | set(rb) if not _equal(ra.get(k, _ABSENT), rb.get(k, _ABSENT)))
            same &= not differ
            print(f"evaluate {name:20s} {'same' if not differ else 'DIFFERENT: ' + ', '.join(differ)}")
        return 0 if same else 1
    names = args.only.split(",") if args.only else list(RUNS)
    result = {"benchmark": "output fingerprints on fixed runs (bench/fingerprint.py)",
              "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": {}}
    for name in names:
        if name == "evaluate":
            continue
        result["runs"][name] = run_stream(name)
        r = result["runs"][name]
        print(f"{name}: audit {'PASSED' if r['audit_passed'] else 'FAILED'} in {r['seconds']} s; "
              + ", ".join(f"{t} {d['messages']} {d['sha256'][:12]}" for t, d in r["topics"].items()), flush=True)
    if not args.only or "evaluate" in names:
        result["evaluate"] = run_evaluate()
        print("evaluate: " + ", ".join(f"{name} ncp={row.get('ncp')}" for name, row in result["evaluate"].items()),
              flush=True)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
