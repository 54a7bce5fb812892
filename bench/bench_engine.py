"""Engine-only benchmark on the 525,680 Oyster Monday events (k = 10), writing bench/results/engine.json.

Measures: engine throughput on one core (numpy threads pinned to 1; CPU seconds next to wall seconds, since the
machine is shared), peak memory, mean NCP, the minimum number of distinct individuals in any published class
(recounted here from the raw events, not taken from the engine), and the NCP of offline Mondrian (a) on the same
windows (the records of each release, anonymized as one batch) and (b) on the whole day at once, as ratios; and a
**fingerprint** of the output (sha256 over every release's manifest without ``created_at`` and its records, and
the rejections): optimizations must leave it unchanged.

``--m 3``: the m-invariant engine instead (configs/oyster-cards.toml, m = 3, with the journey as privacy unit:
the Oyster file has no card id), writing bench/results/engine_m3.json (no offline Mondrian comparison).

    .venv/bin/python bench/bench_engine.py [--events N] [--k 10] [--m 3] [--batch 5000]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from stream_anon import crypto  # noqa: E402
import orjson  # noqa: E402

from stream_anon.config import load_config, parse_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine import Engine, QISpace, get_path  # noqa: E402
from stream_anon.strategies.mondrian import Mondrian  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"bench-secret-0123456789abcdef"


def offline_mondrian_ncp(space: QISpace, X: np.ndarray, units: np.ndarray, k: int) -> tuple[float, int]:
    """Record-weighted NCP of strict Mondrian over X (one batch), and its class count."""
    classes = Mondrian().form_classes(X, units, k, space)
    if not classes:
        return float("nan"), 0
    lo = np.stack([X[c].min(axis=0) for c in classes])
    hi = np.stack([X[c].max(axis=0) for c in classes])
    lo, hi, _ = space.snap(lo, hi)
    ncp = space.ncp(lo, hi)
    sizes = np.array([len(c) for c in classes])
    return float((ncp * sizes).sum() / sizes.sum()), len(classes)


def fingerprint(releases, rejections) -> str:
    """sha256 of every release's manifest (without created_at) and records, and of the rejections."""
    h = hashlib.sha256()
    for r in releases:
        m = r.manifest()
        m.pop("created_at")
        h.update(orjson.dumps(m, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))
        h.update(orjson.dumps(r.records, option=orjson.OPT_SORT_KEYS))
    h.update(orjson.dumps(rejections))
    return h.hexdigest()


def m_config(m: int):
    """configs/oyster-cards.toml with the journey as privacy unit (the Oyster file has no card id)."""
    import tomllib
    path = ROOT / "configs" / "oyster-cards.toml"
    raw = tomllib.loads(path.read_text())
    raw["stream"]["name"] = f"oyster-m{m}"
    raw["stream"]["privacy_unit"] = "journey_id"
    raw["anonymization"]["m"] = m
    return parse_config(raw, base_dir=path.parent, source=path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--m", type=int, default=None)
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out_path = args.out or str(ROOT / "bench" / "results" / ("engine.json" if args.m is None else
                                                              f"engine_m{args.m}.json"))

    if args.m is None:
        config = load_config(ROOT / "configs" / "oyster.toml").replace_anonymization(k=args.k)
    else:
        config = m_config(args.m).replace_anonymization(k=args.k)
    t0 = time.perf_counter()
    events = load_events("oyster", limit=args.events, full=True)
    load_s = time.perf_counter() - t0

    engine = Engine(config, secret=SECRET)
    releases, rejections = [], []
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(events), args.batch):
        out = engine.process(events[i:i + args.batch])
        releases += out.releases
        rejections += [(r.event.get("event_id"), r.reason) for r in out.rejected]
    releases += engine.flush().releases
    engine_s, engine_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    rejected = len(rejections)
    digest = fingerprint(releases, rejections)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    # Independent recount: audit token -> raw event -> privacy unit.
    unit_field = config.stream.privacy_unit
    by_token = {crypto.audit_token(SECRET, e["event_id"]): i for i, e in enumerate(events)}
    class_units: dict[str, set] = {}
    published = suppressed = 0
    ncp_sum = 0.0
    for r in releases:
        published += r.published
        suppressed += r.n_suppressed
        real = np.ones(len(r.record_token), dtype=bool) if r.record_counterfeit is None else ~r.record_counterfeit
        ncp_sum += float(r.record_ncp[real].sum())
        ids = [c.class_id for c in r.classes]
        for c, tok, is_real in zip(r.record_class.tolist(), r.record_token, real.tolist()):
            if is_real:       # counterfeit records (m-invariance) are no input event
                class_units.setdefault(ids[c], set()).add(get_path(events[by_token[tok]], unit_field))
    mean_ncp = ncp_sum / published

    result = {
        "benchmark": "engine-only, Oyster Monday (TfL 5% sample)" + (
            f", m = {args.m} (oyster-cards config, journey as privacy unit)" if args.m else ""),
        "command": "python bench/bench_engine.py" + (f" --events {args.events}" if args.events else "")
                   + (f" --m {args.m}" if args.m else ""),
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "numpy_threads": os.environ.get("OMP_NUM_THREADS"),
                    "note": "2 cores shared with other sessions: engine_cpu_events_per_s is the steadier figure"},
        "events": len(events), "k": args.k, "m": args.m, "window_s": config.anonymization.window_s,
        "max_delay_s": config.anonymization.max_delay_s, "batch": args.batch,
        "load_s": round(load_s, 2), "engine_s": round(engine_s, 3), "engine_cpu_s": round(engine_cpu_s, 3),
        "engine_events_per_s": round(len(events) / engine_s),
        "engine_cpu_events_per_s": round(len(events) / engine_cpu_s),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "fingerprint_sha256": digest,
        "releases": len(releases), "classes": len(class_units), "published": published, "suppressed": suppressed,
        "rejected": rejected, "deferred": engine.deferred,
        "counterfeit_records": sum(r.counterfeit_records for r in releases),
        "min_individuals_per_class": min(len(u) for u in class_units.values()),
        "k_violations": sum(len(u) < args.k for u in class_units.values()),
        "mean_ncp": round(ncp_sum / published, 5),
    }
    if args.m is not None:
        result["targets"] = {"engine_events_per_s": ">= 40000 (issue 11)", "k_violations": 0}
        write(out_path, result)
        return

    # Offline Mondrian on the same windows and on the whole day.
    space = engine.space
    cols = {f: [get_path(e, f) for e in events] for q in config.quasi_identifiers for f in q.fields}
    X_all, _ = space.encode(cols)
    units_all = np.array([hash(get_path(e, unit_field)) for e in events], dtype=np.int64)
    window_ncp_sum, window_n = 0.0, 0
    for r in releases:
        rows = np.array([by_token[t] for t in r.record_token], dtype=np.int64)
        if len(rows) == 0 or len({units_all[i] for i in rows}) < args.k:
            continue
        ncp, _ = offline_mondrian_ncp(space, X_all[rows], units_all[rows], args.k)
        window_ncp_sum += ncp * len(rows)
        window_n += len(rows)
    offline_window_ncp = window_ncp_sum / window_n
    t1 = time.perf_counter()
    offline_day_ncp, day_classes = offline_mondrian_ncp(space, X_all, units_all, args.k)
    offline_day_s = time.perf_counter() - t1

    result.update({
        "offline_mondrian_same_windows_ncp": round(offline_window_ncp, 5),
        "ncp_ratio_vs_same_windows": round(mean_ncp / offline_window_ncp, 4),
        "offline_mondrian_whole_day_ncp": round(offline_day_ncp, 5),
        "offline_mondrian_whole_day_classes": day_classes, "offline_mondrian_whole_day_s": round(offline_day_s, 2),
        "ncp_ratio_vs_whole_day": round(mean_ncp / offline_day_ncp, 4),
        "targets": {"engine_events_per_s": ">= 100000 (issue 11)", "ncp_ratio_vs_same_windows": "<= 1.3",
                    "k_violations": 0},
    })
    write(out_path, result)


def write(path: str, result: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
