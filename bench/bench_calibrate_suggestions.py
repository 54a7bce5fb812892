"""``stream-anon calibrate --suggest`` against the bundled configs' settings (issue 31, the last "Done when" item).
Writes bench/results/calibrate_suggestions.json.

Streams, each the bundled data in a real format, read back as ``calibrate --file`` reads it (written as a
length-delimited file, decoded through the config's ``[input]``):

- ``obd2-tesla``: data/obd2_19drivers.csv.gz as Tesla Fleet Telemetry protobuf ``Payload``s
  (stream_anon.inputs.samples.tesla_payloads) under configs/inputs/obd2-tesla.toml (k 3);
- ``citibike-gtfs``: data/citibike_slice.csv.gz as GTFS-realtime feeds, one per 15 minutes
  (stream_anon.inputs.samples.gtfs_feeds) under configs/inputs/citibike-gtfs.toml (k 5);
- ``citibike-h3``: the same trips in the built-in event shape under configs/citibike-h3.toml (k 5, H3 positions).

For each, :func:`stream_anon.suggest.suggest` (what ``calibrate --suggest`` runs) on the whole bundled stream as
the sample, with the bundled config: it chooses on the earlier half (by event time) and reports on the later half.
Once with the default latency limit (``max_delay_s`` at most the bundled one) and once with twice it. Then the
bundled and the suggested settings on the whole bundled stream. NCP is measured with the bundled config's bounds
in every run (the suggestions carry no bounds), so it is one yardstick; same k throughout. The search's time is
given as wall and CPU seconds (the CPU figure does not depend on what else the machine runs).

    PYTHONPATH=. python bench/bench_calibrate_suggestions.py [--samples-dir DIR]

``--samples-dir`` keeps the delimited files, for ``stream-anon calibrate --config C --file DIR/NAME.pb
--file-framing delimited --out C2 --suggest`` (which also calibrates the bounds from the sample first).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stream_anon.config import load_config  # noqa: E402
from stream_anon.inputs import decode_file  # noqa: E402
from stream_anon.inputs.files import write_delimited  # noqa: E402
from stream_anon.suggest import search_report, suggest  # noqa: E402
from stream_anon.suggest_search import run_settings, with_settings  # noqa: E402

STREAMS = {"obd2-tesla": "configs/inputs/obd2-tesla.toml", "citibike-gtfs": "configs/inputs/citibike-gtfs.toml",
           "citibike-h3": "configs/citibike-h3.toml"}


def sample_events(name: str, config, directory: Path) -> tuple[list[dict], int, str | None]:
    """(events, records the mapping rejected, the sample file) of a stream."""
    if name == "citibike-h3":
        from stream_anon.datasets import load_events
        return load_events("citibike"), 0, None
    from stream_anon.inputs.samples import gtfs_feeds, tesla_payloads
    messages = tesla_payloads("protobuf") if name == "obd2-tesla" else gtfs_feeds()
    path = directory / f"{name}.pb"
    write_delimited(messages, path)
    events, rejected = decode_file(path, config.input, framing="delimited")
    return events, len(rejected), str(path)


def improved(current: dict, chosen: dict) -> bool:
    """Lower NCP, no more suppressed events, late suppressions or dead letters."""
    return (chosen["ncp"] < current["ncp"] and chosen["suppressed"] <= current["suppressed"]
            and chosen["late_suppressed"] <= current["late_suppressed"]
            and chosen["dead_letters"] <= current["dead_letters"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples-dir", default=None, help="keep the sample files here (default: a temporary dir)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "calibrate_suggestions.json"))
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    directory = Path(args.samples_dir or tmp.name)
    directory.mkdir(parents=True, exist_ok=True)
    out = {"platform": platform.platform(), "python": platform.python_version(),
           "method": "stream_anon.suggest.suggest on the whole bundled stream as the sample with the bundled config "
                     "(choose on the earlier half by event time, report on the later half); bundled vs suggested "
                     "settings also on the whole stream; NCP with the bundled bounds, suppressed events count 1",
           "streams": {}}
    for name, path in STREAMS.items():
        config = load_config(REPO / path)
        events, rejected, sample = sample_events(name, config, directory)
        entry = {"config": path, "k": config.anonymization.k, "events": len(events), "mapping_rejected": rejected,
                 "sample_file": Path(sample).name if sample else None, "limits": {}}
        whole_current = run_settings(config, events)
        entry["whole_bundled"] = asdict(whole_current)
        for label, limit in (("bundled_max_delay", None), ("twice_max_delay", 2 * config.anonymization.max_delay_s)):
            t0 = time.perf_counter()
            suggestions, result = suggest(config, events, max_delay_limit_s=limit)
            seconds = time.perf_counter() - t0
            print(f"== {name}, max_delay_s limit {result.max_delay_limit_s:g}", flush=True)
            for line in search_report(suggestions, result):
                print(line, flush=True)
            whole = asdict(run_settings(with_settings(config, result.chosen), events)) \
                if result.chosen != result.current else entry["whole_bundled"]
            held = {k: (asdict(v) if hasattr(v, "ncp") else v) for k, v in result.held_out.items()}
            entry["limits"][label] = {
                "max_delay_limit_s": result.max_delay_limit_s, "bundled": result.current, "suggested": result.chosen,
                "suggestion_figures": {s.key: s.figures for s in suggestions},
                "held_out": held, "whole_suggested": whole,
                "lower_ncp_no_more_suppression": {
                    "held_out": improved(held["current"], held["chosen"]) if "current" in held else None,
                    "whole": improved(entry["whole_bundled"], whole)},
                "search_seconds": round(seconds, 2), "search_cpu_seconds": result.cpu_s,
                "search": result.to_dict()}
            print(f"{name} [{label}]: whole NCP {entry['whole_bundled']['ncp']:.4f} / "
                  f"{entry['whole_bundled']['suppression']:.2%} -> {whole['ncp']:.4f} / {whole['suppression']:.2%}; "
                  f"held out {held['current']['ncp']:.4f} -> {held['chosen']['ncp']:.4f}; search {seconds:.1f} s "
                  f"({result.cpu_s:.1f} s CPU)",
                  flush=True)
        if name == "citibike-h3":
            # the coarsest resolution alone, on the whole stream: the bundled one, the closed form's, and [9, 12]
            # of the earlier closed-form rule (cells at most 2% of the sample's domain)
            keys = [f"quasi_identifiers.{q.name}.resolutions" for q in config.quasi_identifiers if q.h3]
            entry["h3_resolutions_whole"] = {
                str(r): asdict(run_settings(with_settings(config, {k: r for k in keys}), events))
                for r in ([5, 12], entry["limits"]["bundled_max_delay"]["suggested"][keys[0]], [9, 12])}
        out["streams"][name] = entry
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
