"""A sparse fleet (issue 44): the bundled OBD-II slice (one car, 19 drivers, Natal, Dec 2017; the driver is the
privacy unit) thinned to fewer drivers, through the engine under configs/obd2-h3.toml (h3-mondrian, resolutions
[7, 12], whole_domain = "withhold") with the window length and k varied. Writes bench/results/sparse_fleet.json and
prints the markdown table of docs/h3-positions.md.

Thinning: ``drivers`` of the 19 chosen at random (seed 0, the same choice for every window and k), all their
readings kept. One engine (a sparse fleet fits one partition; bench/bench_h3_positions.py shows what 4 do).
``max_delay_s`` is twice ``window_s``: a record may wait one more close for company in its cell, so a record is
published at most 2 windows after its event time (the latency a user gives up). Reported per run: suppression
(the share a user gives up in records), the audit's verdict, the share of positions published as the whole domain,
the mean published resolution and the position NCP (cell area over the domain's area), for strict Mondrian (main:
resolutions [5, 12]), h3-mondrian with ``whole_domain = "publish"`` and with ``"withhold"`` (the bundled config).

    .venv/bin/python bench/bench_sparse_fleet.py [--table]
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


def figures_of(r: dict) -> dict:
    p = r["positions"].get("position", {})
    return {"suppression_ratio": r["suppression_ratio"], "audit_passed": r["audit_passed"],
            "whole_domain_share": p.get("whole_domain_share"), "mean_resolution": p.get("mean_resolution"),
            "ncp": p.get("ncp"), "ncp_release_max": p.get("ncp_release_max")}


def row(fleet: int, window_s: int, k: int, events: int, **runs) -> dict:
    return {"drivers": fleet, "window_s": window_s, "max_delay_s": 2 * window_s, "k": k, "events": events,
            **{label: figures_of(r) for label, r in runs.items()}}


def main() -> None:
    if sys.argv[1:] == ["--table"]:          # the table of the last run's JSON
        print(table(json.loads((REPO / "bench" / "results" / "sparse_fleet.json").read_text())["rows"]))
        return
    events = load_events("obd2")
    rows = []
    for fleet in FLEETS:
        sub = thin(events, fleet)
        for w in WINDOWS:
            for k in KS:
                runs = {}
                for label, strategy, whole in (("mondrian", "mondrian", None), ("publish", "h3-mondrian", "publish"),
                                               ("withhold", "h3-mondrian", "withhold")):
                    anon = {"window_s": w, "max_delay_s": 2 * w, "k": k, "strategy": strategy}
                    if whole:
                        anon["strategy_params"] = {"whole_domain": whole}
                    cfg = variant(CONFIG, anon, {"position": [5, 12]} if strategy == "mondrian" else None)
                    runs[label] = figures(cfg, CONFIG, sub, SECRET, 1)
                rows.append(row(fleet, w, k, len(sub), **runs))
                print(json.dumps(rows[-1]), flush=True)
    out = REPO / "bench" / "results" / "sparse_fleet.json"
    out.write_text(json.dumps({"platform": platform.platform(), "python": platform.python_version(),
                               "config": CONFIG, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}\n")
    print(table(rows))


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def table(rows: list[dict]) -> str:
    """One row per fleet, window and k: strict Mondrian (main: whole domain, res [5, 12]), h3-mondrian publishing
    the whole domain, h3-mondrian withholding it (as configs/obd2-h3.toml)."""
    lines = ["| drivers | window | published within | k | Mondrian: suppressed / whole domain / NCP | "
             "h3-mondrian publish: "
             "suppressed / whole domain / NCP | h3-mondrian withhold: suppressed / mean resolution / NCP |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        m, p, w = r["mondrian"], r["publish"], r["withhold"]
        lines.append(f"| {r['drivers']} | {r['window_s'] / 3600:g} h | {r['max_delay_s'] / 3600:g} h | {r['k']} | "
                     f"{_pct(m['suppression_ratio'])} / {_pct(m['whole_domain_share'])} / {m['ncp']} | "
                     f"{_pct(p['suppression_ratio'])} / "
                     f"{_pct(p['whole_domain_share'])} / {p['ncp']} | {_pct(w['suppression_ratio'])} / "
                     f"{w['mean_resolution']} / {w['ncp']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
