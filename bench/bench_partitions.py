"""Information loss and suppression against the input topic's partition count (issue 12 item 6).

Classes form within a partition: each input partition has its own engine, and an individual's events all go to one
partition. This runs the bundled slices in process, split exactly as the replay splits them onto a topic of N
partitions (Kafka key = ``pseudonym(secret, privacy unit)``, partition = kafka-python's default partitioner:
``murmur2(key) & 0x7fffffff % N``), one engine per partition fed its events in arrival order and flushed at the
end, for N = 1, 2, 4, 8. The split depends on the secret, so each N is run with several secrets (mean and range).

    PYTHONPATH=. python bench/bench_partitions.py [--datasets oyster,citibike,obd2,oyster-cards] [--secrets 3]

Writes bench/results/partitions.json.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from kafka.partitioner.default import murmur2  # noqa: E402

from stream_anon import contract, crypto  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.kafka.replay import unit_key_fn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def partition_of(key: bytes | None, n: int, fallback: str) -> int:
    """kafka-python's DefaultPartitioner for a keyed record; an unkeyed one (no privacy unit: the worker
    dead-letters it) goes to a partition by a hash of its event id instead of at random."""
    if key is None:
        key = fallback.encode()
    return (murmur2(key) & 0x7FFFFFFF) % n


def split(events: list[dict], privacy_unit: str, secret: bytes, n: int) -> list[list[dict]]:
    key_fn = unit_key_fn(privacy_unit)
    parts: list[list[dict]] = [[] for _ in range(n)]
    cache: dict[str, bytes] = {}
    for e in events:
        unit = key_fn(e)
        key = None
        if unit is not None:
            key = cache.get(unit)
            if key is None:
                key = cache[unit] = crypto.pseudonym(secret, unit).encode()   # the replay's key
        parts[partition_of(key, n, str(e.get("event_id")))].append(e)
    return parts


def run(config, events: list[dict], secret: bytes, n: int) -> dict:
    published = suppressed = rejected = releases = classes = alerts = 0
    ncp_sum = 0.0
    by_reason: dict[str, int] = {}
    t0 = time.perf_counter()
    for p, evs in enumerate(split(events, config.stream.privacy_unit, secret, n)):
        engine = Engine(config, partition=p, secret=secret)
        res = engine.process(evs)
        res.extend(engine.flush())
        rejected += len(res.rejected)
        for r in res.releases:
            releases += 1
            classes += len(r.classes)
            published += r.published
            suppressed += r.n_suppressed
            ncp_sum += r.ncp_mean * r.published          # real records only (counterfeits excluded)
            alerts += bool(r.suppression_ratio > config.anonymization.max_suppression_ratio)
            for reason, count in r.suppressed.items():
                by_reason[reason] = by_reason.get(reason, 0) + count
    return {"published": published, "suppressed": suppressed, "suppressed_by_reason": by_reason,
            "rejected": rejected, "releases": releases, "classes": classes,
            "suppression_limit_alerts": alerts,
            "mean_ncp": round(ncp_sum / published, 5) if published else None,
            "suppressed_share": round(suppressed / (published + suppressed), 5) if published + suppressed else None,
            "seconds": round(time.perf_counter() - t0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="oyster,citibike,obd2,oyster-cards")
    ap.add_argument("--partitions", default="1,2,4,8")
    ap.add_argument("--secrets", type=int, default=3, help="runs per partition count, each with its own secret")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "partitions.json"))
    args = ap.parse_args()
    counts = [int(x) for x in args.partitions.split(",")]
    secrets = [f"bench-partitions-secret-{i}".encode() for i in range(args.secrets)]
    results = []
    for name in args.datasets.split(","):
        config = load_config(contract.config_path(name))
        events = load_events(name)
        rows = []
        for n in counts:
            runs = [run(config, events, s, n) for s in (secrets if n > 1 else secrets[:1])]   # N=1: no split
            ncps = [r["mean_ncp"] for r in runs]
            supp = [r["suppressed"] for r in runs]
            row = {"partitions": n, "runs": len(runs),
                   "mean_ncp": round(sum(ncps) / len(ncps), 5), "mean_ncp_range": [min(ncps), max(ncps)],
                   "suppressed": round(sum(supp) / len(supp), 1), "suppressed_range": [min(supp), max(supp)],
                   "suppressed_share": round(sum(r["suppressed_share"] for r in runs) / len(runs), 5),
                   "suppression_limit_alerts": round(sum(r["suppression_limit_alerts"] for r in runs) / len(runs), 1),
                   "releases": round(sum(r["releases"] for r in runs) / len(runs), 1),
                   "classes": round(sum(r["classes"] for r in runs) / len(runs), 1),
                   "detail": runs}
            rows.append(row)
            print(f"{name:13s} N={n}: NCP {row['mean_ncp']:.4f} {row['mean_ncp_range']}  suppressed "
                  f"{row['suppressed']} {row['suppressed_range']}  alerts {row['suppression_limit_alerts']}",
                  flush=True)
        base = rows[0]
        for row in rows:
            row["ncp_vs_1"] = round(row["mean_ncp"] / base["mean_ncp"], 3) if base["mean_ncp"] else None
        results.append({"dataset": name, "events": len(events), "k": config.anonymization.k,
                        "m": config.anonymization.m, "window_s": config.anonymization.window_s,
                        "max_delay_s": config.anonymization.max_delay_s,
                        "max_suppression_ratio": config.anonymization.max_suppression_ratio, "rows": rows})
    doc = {"benchmark": "NCP and suppression by input partition count (engine per partition, in process)",
           "command": "PYTHONPATH=. python bench/bench_partitions.py --datasets " + args.datasets
                      + f" --partitions {args.partitions} --secrets {args.secrets}",
           "split": "Kafka key pseudonym(secret, privacy unit), kafka-python default partitioner "
                    "(murmur2 & 0x7fffffff % N), as stream-anon replay produces",
           "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count()},
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
