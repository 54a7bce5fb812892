"""``calibrate --suggest`` on H3 positions (issue 44): the search (stream_anon/suggest_search.py) from main's
citibike-h3 settings (strict Mondrian, resolutions [5, 12], 6-hour windows) on the bundled Citi Bike slice, with
the latency limit (``--max-delay-limit-s``) at 1 and at 4 days. Reported: the chosen settings, and the current and
chosen settings on the held-out later half (NCP as the engine counts it, suppression, release-delta minimum), plus
the position figures of the chosen settings through the engine on the whole slice (one partition; whole-domain
share, mean resolution, cell area over the domain's). Writes bench/results/h3_suggest.json.

    .venv/bin/python bench/bench_h3_suggest.py
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from h3_figures import figures, variant  # noqa: E402

from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.engine.space import parse_time  # noqa: E402
from stream_anon.suggest import suggest  # noqa: E402

CONFIG = "configs/citibike-h3.toml"
SECRET = b"bench-h3-suggest-secret-0123456789"


def main() -> None:
    events = sorted(load_events("citibike"), key=lambda e: parse_time(e["event_time"]))
    out = {}
    for limit in (86400, 345600):
        cfg = variant(CONFIG, {"strategy": "mondrian", "window_s": 21600, "max_delay_s": 21600},
                      {"start": [5, 12], "end": [5, 12]})
        _, res = suggest(cfg, events, max_delay_limit_s=limit)
        chosen = res.chosen
        anon = {k.split(".", 1)[1]: v for k, v in chosen.items() if k.startswith("anonymization.")}
        resolutions = {k.split(".")[1]: v for k, v in chosen.items() if k.endswith(".resolutions")}
        whole = figures(variant(CONFIG, anon, resolutions), CONFIG, events, SECRET, 1)
        held = {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in res.held_out.items()}
        out[str(limit)] = {"chosen": chosen, "held_out": {k: held.get(k) for k in ("events", "current", "chosen")},
                           "chosen_on_whole_slice": {"suppression_ratio": whole["suppression_ratio"],
                                                     "audit_passed": whole["audit_passed"],
                                                     "positions": whole["positions"]},
                           "runtime_s": round(res.runtime_s, 1)}
        c, h = held.get("current") or {}, held.get("chosen") or {}
        print(f"limit {limit}: chosen {json.dumps(chosen)}; held out NCP {c.get('ncp')} -> {h.get('ncp')}, "
              f"suppression {c.get('suppression')} -> {h.get('suppression')}; whole slice "
              f"{json.dumps(whole['positions'])}", flush=True)
    path = REPO / "bench" / "results" / "h3_suggest.json"
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
