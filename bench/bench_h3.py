"""Positions along H3 vs a lat/lon box (issue 13 item 4): information loss and the AOI attack on the bundled
positions (OBD-II readings, Citi Bike start and end stations). Writes bench/results/h3.json.

For each dataset the streaming engine runs twice on the time-sorted bundled slice with the same stream config
except the position QIs: the bundled config (configs/obd2.toml: boxes snapped to a 0.001 degree grid;
configs/citibike.toml: exact member boxes) and its H3 variant (configs/*-h3.toml: ``hierarchy = "h3"``,
``resolutions = [5, 12]``), and the H3 variant with ``resolutions = [5, 15]`` (cells down to ~1 m2, smaller than
the attack's 1e-4 degree cell, so that a published cell can pin an AOI). Reported per run:

- ``ncp_mean``: the engine's mean record NCP over all QIs (its own definition for each variant: a box counts
  its width per axis, an H3 cell counts cells, see stream_anon/engine/space.py);
- per position QI, over published real records: ``ncp`` (the variant's own position NCP), ``box_ncp`` (the
  box NCP of both variants' published region: mean over the two axes of its bounding box's extent over the
  domain's, capped at 1; for a cell, its boundary's bounding box), ``area_share`` (the published region's area
  over the domain's, capped at 1; a box by its degree extents scaled by cos(latitude), a cell by
  ``h3.cell_area``), and the share of records published with the whole domain;
- the AOI homogeneity attack (stream_anon/attacks/aoi.py: 1e-4 degree cells; a published position reveals a cell
  when its region, for a cell its bounding box, lies in one such cell);
- the coverage check of the audit (stream_anon/audit/primitives.py cover_test, which tests H3 cells with h3
  itself) over every published record, and the smallest number of distinct individuals of a new class.

    PYTHONPATH=. python bench/bench_h3.py
"""
from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import h3  # noqa: E402

from stream_anon import crypto  # noqa: E402
from stream_anon.attacks.aoi import aoi_attack, box_cells, cell_ids  # noqa: E402
from stream_anon.audit.config import AuditConfig  # noqa: E402
from stream_anon.audit.primitives import cover_test, qi_value  # noqa: E402
from stream_anon.config import load_config, parse_config  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.engine.space import parse_time  # noqa: E402

SECRET = b"bench-h3-secret-0123456789"
RUNS = {"obd2": ("configs/obd2.toml", "configs/obd2-h3.toml"),
        "citibike": ("configs/citibike.toml", "configs/citibike-h3.toml")}


def region(pub: dict, lower, upper):
    """(lat0, lat1, lon0, lon1, area km2, whole domain?) of a published position."""
    if "h3" in pub:
        if pub["h3"] == "*":
            return lower[0], upper[0], lower[1], upper[1], None, True
        b = np.array(h3.cell_to_boundary(pub["h3"]))
        return b[:, 0].min(), b[:, 0].max(), b[:, 1].min(), b[:, 1].max(), h3.cell_area(pub["h3"], "km^2"), False
    (a0, a1), (o0, o1) = pub["lat"], pub["lon"]
    area = (a1 - a0) * 111.32 * (o1 - o0) * 111.32 * math.cos(math.radians((a0 + a1) / 2))
    whole = a0 <= lower[0] and a1 >= upper[0] and o0 <= lower[1] and o1 >= upper[1]
    return a0, a1, o0, o1, area, whole


def with_resolutions(config, resolutions):
    """The config with every H3 geopoint's resolutions replaced (re-validated)."""
    raw = dict(config.raw)
    raw["quasi_identifiers"] = [{**q, "resolutions": list(resolutions)} if q.get("hierarchy") == "h3" else q
                                for q in raw["quasi_identifiers"]]
    return parse_config(raw, base_dir=config.source.parent, source=config.source)


def run(name: str, config_path: str, events: list[dict], resolutions=None) -> dict:
    config = load_config(REPO / config_path)
    if resolutions is not None:
        config = with_resolutions(config, resolutions)
    audit_cfg = AuditConfig.from_toml(REPO / config_path)
    engine = Engine(config, secret=SECRET)
    t0 = time.perf_counter()
    releases = []
    for i in range(0, len(events), 1000):
        releases += engine.process(events[i:i + 1000]).releases
    releases += engine.flush().releases
    seconds = time.perf_counter() - t0
    by_token = {crypto.audit_token(SECRET, e["event_id"]): i for i, e in enumerate(events)}
    units = np.array([str(e[config.stream.privacy_unit]) for e in events], dtype=object)
    record_class = np.full(len(events), None, dtype=object)
    published = {}
    for rel in releases:
        for rec in rel.records:
            i = by_token[rec["audit_token"]]
            record_class[i] = rec["class_id"]
            published[i] = rec["qi"]
    # independent coverage (the audit's primitives) and k of new classes
    fails = 0
    for i, qi in published.items():
        for q in audit_cfg.quasi_identifiers:
            ok, _ = cover_test(q, qi.get(q.name), qi_value(q, events[i]))
            fails += not ok
    min_individuals = min((c.individuals for r in releases for c in r.classes if not c.reused), default=None)
    out = {"config": config_path + (f" with resolutions = {list(resolutions)}" if resolutions else ""),
           "releases": len(releases), "published": sum(r.published for r in releases),
           "suppressed": sum(r.n_suppressed for r in releases),
           "ncp_mean": float(np.mean([r.ncp_mean for r in releases for _ in range(r.published)]))
           if published else None,
           "coverage_failures": fails, "min_individuals_new_class": min_individuals, "k": config.anonymization.k,
           "engine_seconds": round(seconds, 2), "positions": {}}
    # positions: NCP, box NCP, area share, AOI attack
    rec_idx, rec_unit, true_cells, shown = [], [], [], []
    for q in config.quasi_identifiers:
        if q.kind != "geopoint":
            continue
        lower, upper = q.lower, q.upper
        dom_area = ((upper[0] - lower[0]) * 111.32 * (upper[1] - lower[1]) * 111.32
                    * math.cos(math.radians((lower[0] + upper[0]) / 2)))
        ncp, box, area, whole = [], [], [], 0
        revealed = np.full(len(events), None, dtype=object)
        space = engine.space
        d = sum(x.dims for x in config.quasi_identifiers[:config.quasi_identifiers.index(q)])
        for i, qi in published.items():
            pub = qi[q.name]
            a0, a1, o0, o1, km2, is_whole = region(pub, lower, upper)
            whole += is_whole
            box.append(min(1.0, ((a1 - a0) / (upper[0] - lower[0]) + (o1 - o0) / (upper[1] - lower[1])) / 2))
            area.append(1.0 if is_whole else min(1.0, km2 / dom_area))
            if "h3" in pub:
                from stream_anon.engine.space import h3_ncp
                n_cells = next(h[4] for h in space.h3_qis if config.quasi_identifiers[h[0]].name == q.name)
                ncp.append(h3_ncp(None if pub["h3"] == "*" else pub["h3"], q.h3[1], n_cells))
            else:
                ncp.append(((a1 - a0) / space.width[d] + (o1 - o0) / space.width[d + 1]) / 2)
            revealed[i] = box_cells([a0], [a1], [o0], [o1])[0]
        lat = np.array([_float(v) for v in (qi_value(_spec(audit_cfg, q.name), e)[0] for e in events)])
        lon = np.array([_float(v) for v in (qi_value(_spec(audit_cfg, q.name), e)[1] for e in events)])
        truth = cell_ids(lat, lon)
        has = np.array([t is not None for t in truth])
        rec_idx.append(np.flatnonzero(has))
        rec_unit.append(units[has])
        true_cells.append(truth[has])
        shown.append(revealed[has])
        out["positions"][q.name] = {
            "ncp": float(np.mean(ncp)) if ncp else None, "box_ncp": float(np.mean(box)) if box else None,
            "area_share": float(np.mean(area)) if area else None,
            "whole_domain_share": whole / len(published) if published else None,
            "revealed_cells": int(sum(v is not None for v in revealed))}
    if rec_idx:
        cls = np.array([c if c is not None else -1 for c in record_class], dtype=object)
        res = aoi_attack(units, cls, np.concatenate(rec_unit), np.concatenate(true_cells), np.concatenate(rec_idx),
                         np.concatenate(shown))
        out["aoi"] = res.to_dict(prefix="")
    return out


def _spec(audit_cfg, name):
    return next(q for q in audit_cfg.quasi_identifiers if q.name == name)


def _float(v):
    return np.nan if v is None else float(v)


def main() -> None:
    results = {"platform": platform.platform(), "python": platform.python_version(), "h3": h3.__version__,
               "secret": "bench constant", "datasets": {}}
    for name, (grid_cfg, h3_cfg) in RUNS.items():
        events = sorted(load_events(name), key=lambda e: parse_time(e["event_time"]))
        results["datasets"][name] = {"events": len(events), "grid": run(name, grid_cfg, events),
                                     "h3": run(name, h3_cfg, events),
                                     "h3_5_15": run(name, h3_cfg, events, resolutions=(5, 15))}
        for variant in ("grid", "h3", "h3_5_15"):
            r = results["datasets"][name][variant]
            print(f"{name:9s} {variant:7s} releases={r['releases']} published={r['published']} "
                  f"suppressed={r['suppressed']} ncp_mean={r['ncp_mean']:.4f} coverage_failures="
                  f"{r['coverage_failures']} min_ind={r['min_individuals_new_class']} "
                  f"positions={json.dumps(r['positions'])} aoi={json.dumps(r.get('aoi'))}", flush=True)
    out = REPO / "bench" / "results" / "h3.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
