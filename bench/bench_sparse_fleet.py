"""A sparse fleet (issue 44): the bundled OBD-II slice (one car, 19 drivers, Natal, Dec 2017; the driver is the
privacy unit) thinned to fewer drivers, through the engine under configs/obd2-h3.toml (h3-mondrian, resolutions
[7, 12], whole_domain = "withhold") with the window length and k varied. Writes bench/results/sparse_fleet.json and
prints the markdown table of docs/h3-positions.md.

Thinning: ``drivers`` of the 19 chosen at random (seed 0, the same choice for every window and k), all their
readings kept. One engine (a sparse fleet fits one partition; bench/bench_h3_positions.py shows what 4 do).
``max_delay_s`` is twice ``window_s``: a record may wait one more close for company in its cell, so a record is
published at most 2 windows after its event time (the latency a user gives up). Reported per run: suppression
(the share a user gives up in records), the audit's verdict, the share of positions published as the whole domain,
the mean published resolution and the position NCP (cell area over the domain's area); plus strict Mondrian
(main's config: resolutions [5, 12], whole domain published) at the bundled window and k for comparison.

    .venv/bin/python bench/bench_sparse_fleet.py
"""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from h3_figures import figures, variant  # noqa: E402

from stream_anon.datasets import load_events  # noqa: E402

CONFIG = "configs/obd2-h3.toml"
SECRET = b"bench-sparse-fleet-secret-0123456789"
FLEETS = (19, 10, 6)
WINDOWS = (21600, 86400, 172800)
KS = (2, 3, 5)


def thin(events: list[dict], drivers: int) -> list[dict]:
    units = sorted({str(e["vehicle_id"]) for e in events})
    keep = set(np.random.default_rng(0).choice(units, size=min(drivers, len(units)), replace=False).tolist())
    return [e for e in events if str(e["vehicle_id"]) in keep]


def row(fleet: int, label: str, window_s: int, k: int, r: dict) -> dict:
    p = r["positions"].get("position", {})
    return {"drivers": fleet, "strategy": label, "window_s": window_s, "max_delay_s": 2 * window_s, "k": k,
            "events": r["events"], "suppression_ratio": r["suppression_ratio"], "audit_passed": r["audit_passed"],
            "whole_domain_share": p.get("whole_domain_share"), "mean_resolution": p.get("mean_resolution"),
            "ncp": p.get("ncp"), "ncp_release_max": p.get("ncp_release_max")}


def main() -> None:
    events = load_events("obd2")
    rows = []
    for fleet in FLEETS:
        sub = thin(events, fleet)
        base = variant(CONFIG, {"strategy": "mondrian"}, {"position": [5, 12]})
        r = figures(base, CONFIG, sub, SECRET, 1)
        rows.append(row(fleet, "mondrian", 86400, base.anonymization.k, {**r, "events": len(sub)}))
        for w in WINDOWS:
            for k in KS:
                cfg = variant(CONFIG, {"window_s": w, "max_delay_s": 2 * w, "k": k})
                rows.append(row(fleet, "h3-mondrian", w, k, figures(cfg, CONFIG, sub, SECRET, 1)))
        for x in rows[-1 - len(WINDOWS) * len(KS):]:
            print(json.dumps(x), flush=True)
    out = REPO / "bench" / "results" / "sparse_fleet.json"
    out.write_text(json.dumps({"platform": platform.platform(), "python": platform.python_version(),
                               "config": CONFIG, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}\n")
    print(table(rows))


def table(rows: list[dict]) -> str:
    lines = ["| drivers | strategy | window | latency (max_delay) | k | suppressed | whole domain | mean resolution "
             "| position NCP | audit |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['drivers']} | {r['strategy']} | {r['window_s'] / 3600:g} h | {r['max_delay_s'] / 3600:g} h "
                     f"| {r['k']} | {r['suppression_ratio']:.1%} | {r['whole_domain_share']:.1%} | "
                     f"{r['mean_resolution']} | {r['ncp']} | {'passed' if r['audit_passed'] else 'NOT PASSED'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
