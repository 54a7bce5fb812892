"""Shared by bench/bench_h3_positions.py and bench/bench_sparse_fleet.py (issue 44): a stream config with overrides,
the engine run as the worker runs it (one engine per partition of the raw topic, each unit on the partition Kafka's
default partitioner gives its keyed pseudonym: stream_anon.worker.placement), the independent audit on its outputs,
and the position figures of the published records.

Position figures, per H3 geopoint, over the published real records: ``whole_domain_share`` (published as ``*``),
``mean_resolution`` (over those published as a cell), ``ncp`` (mean cell area over the domain's area, 1 for ``*``:
stream_anon/audit/measures.py cell_area_share) and, per release, the mean and the largest release mean of that
NCP; ``min_resolution`` (the coarsest cell published) and ``largest_cell_over_domain`` (its area over the domain's).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from stream_anon.audit import audit
from stream_anon.audit.config import AuditConfig
from stream_anon.audit.measures import cell_area_share
from stream_anon.config import load_config, parse_config
from stream_anon.engine import Engine
from stream_anon.engine.space import parse_time
from stream_anon.worker.placement import UnitPlacement

REPO = Path(__file__).resolve().parent.parent


def variant(config_path: str, anonymization: dict | None = None, resolutions: dict | None = None):
    """The config at ``config_path`` with ``[anonymization]`` keys replaced and H3 geopoints' resolutions set
    (QI name -> [min, max]); re-validated as a file would be."""
    config = load_config(REPO / config_path)
    raw = dict(config.raw)
    raw["anonymization"] = {**raw["anonymization"], **(anonymization or {})}
    if raw["anonymization"].get("strategy") != "h3-mondrian":
        raw["anonymization"].pop("strategy_params", None)
    raw["quasi_identifiers"] = [{**q, "resolutions": list(resolutions[q["name"]])}
                                if resolutions and q["name"] in resolutions else q for q in raw["quasi_identifiers"]]
    return parse_config(raw, base_dir=config.source.parent, source=config.source)


def run_partitions(config, events: list[dict], secret: bytes, n_partitions: int):
    """Releases of one engine per partition over the time-sorted events, and the raw input as the audit reads it."""
    events = sorted(events, key=lambda e: parse_time(e["event_time"]))
    unit = config.stream.privacy_unit
    home = UnitPlacement(secret, unit, n_partitions).home([str(e[unit]) for e in events])
    releases, raw, seconds = [], [], 0.0
    for p in range(n_partitions):
        mine = [e for e, h in zip(events, home) if h == p]
        raw += [((config.stream.input_topic, p, i), json.dumps(e)) for i, e in enumerate(mine)]
        engine = Engine(config, secret=secret, partition=p)
        t0 = time.perf_counter()
        for i in range(0, len(mine), 1000):
            releases += engine.process(mine[i:i + 1000]).releases
        releases += engine.flush().releases
        seconds += time.perf_counter() - t0
    return releases, raw, seconds


def position_figures(audit_cfg: AuditConfig, records: list[dict]) -> dict:
    out = {}
    for q in audit_cfg.quasi_identifiers:
        if q.kind != "geopoint":
            continue
        pubs = [(r.get("release_id"), r["qi"][q.name]) for r in records if "h3" in r["qi"].get(q.name, {})]
        if not pubs:
            continue
        shares = np.array([cell_area_share(q, p["h3"]) for _, p in pubs])
        res = np.array([p["resolution"] for _, p in pubs if p["h3"] != "*"])
        per_release: dict = {}
        for (rid, _), s in zip(pubs, shares):
            per_release.setdefault(rid, []).append(s)
        release_means = [float(np.mean(v)) for v in per_release.values()]
        cells = shares[[p["h3"] != "*" for _, p in pubs]]
        whole = float(np.mean([p["h3"] == "*" for _, p in pubs]))
        out[q.name] = {"records": len(pubs), "whole_domain_share": round(whole, 4),
                       "mean_resolution": round(float(res.mean()), 3) if len(res) else None,
                       "min_resolution": int(res.min()) if len(res) else None,
                       "ncp": round(float(shares.mean()), 4),
                       "ncp_release_mean": round(float(np.mean(release_means)), 4),
                       "ncp_release_max": round(float(np.max(release_means)), 4),
                       "largest_cell_over_domain": round(float(cells.max()), 4) if len(cells) else None}
    return out


def figures(config, config_path: str, events: list[dict], secret: bytes, n_partitions: int) -> dict:
    """Engine run per partition, the audit's verdict and checks, suppression and the position figures."""
    releases, raw, seconds = run_partitions(config, events, secret, n_partitions)
    records = [r for rel in releases for r in rel.records]
    audit_cfg = AuditConfig.from_toml(REPO / config_path)
    audit_cfg = _with(audit_cfg, config)
    report = audit(raw, {"records": records, "manifests": [rel.manifest() for rel in releases], "deadletters": []},
                   secret, audit_cfg)
    s = report.summary
    return {"partitions": n_partitions, "events": len(events), "published": s["published"],
            "suppressed": s["suppressed"], "suppression_ratio": round(s["suppressed"] / max(len(events), 1), 4),
            "max_suppression_ratio": config.anonymization.max_suppression_ratio,
            "audit_passed": report.passed, "verdict_reason": report.verdict_reason,
            "failed_checks": sorted(n for n, c in report.checks.items() if not c["passed"]),
            "min_individuals": s.get("min_individuals"), "engine_seconds": round(seconds, 2),
            "positions": position_figures(audit_cfg, records)}


def _with(audit_cfg: AuditConfig, config) -> AuditConfig:
    """The audit's view of the file with the overridden settings it reads (k, windows, suppression limit)."""
    a = config.anonymization
    import dataclasses
    fields = {f.name for f in dataclasses.fields(audit_cfg)}
    repl = {name: value for name, value in (("k", a.k), ("window_s", a.window_s), ("max_delay_s", a.max_delay_s),
                                            ("max_suppression_ratio", a.max_suppression_ratio)) if name in fields}
    return dataclasses.replace(audit_cfg, **repl)
