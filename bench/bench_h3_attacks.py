"""The prosecutor linkage attack (stream_anon/attacks/linkage.py: a target's one event known, the individuals behind
every published class covering it) on the bundled H3 configs before (strict Mondrian, resolutions [5, 12], main's
windows) and after issue 44 (h3-mondrian as bundled), one engine over the time-sorted bundled slice. Finer cells
must not let fewer than k individuals cover a target. Writes bench/results/h3_attacks.json.

    .venv/bin/python bench/bench_h3_attacks.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_h3_positions import BEFORE, CONFIGS  # noqa: E402
from h3_figures import run_partitions, variant  # noqa: E402

from stream_anon.attacks import linkage_attack  # noqa: E402
from stream_anon.audit.config import AuditConfig  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402

SECRET = b"bench-h3-attacks-secret-0123456789"


def main() -> None:
    out = {}
    for name, path in CONFIGS.items():
        events = load_events(name)
        audit_cfg = AuditConfig.from_toml(REPO / path)
        for label, config in (("before", variant(path, *BEFORE[name])), ("after", variant(path))):
            releases, _, _ = run_partitions(config, events, SECRET, 1)
            records = [r for rel in releases for r in rel.records]
            res = linkage_attack(records, events, audit_cfg, SECRET, n_targets=300)
            out.setdefault(name, {})[label] = {"k": config.anonymization.k, **res}
            print(name, label, json.dumps(out[name][label]), flush=True)
    path = REPO / "bench" / "results" / "h3_attacks.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
