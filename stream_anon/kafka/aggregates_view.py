"""``stream-anon aggregates``: the analyst's view of ``anon.aggregates``, one figure per (window, key).

The worker publishes one row per input partition (each partition holds different individuals and its own
budget ledger). This view reads a stream's rows back and merges them with :func:`stream_anon.dp.merge.merge_rows`
(sum over partitions, combined noise and interval): consumers never add partitions themselves.

Reading: a ``read_committed`` consumer from the beginning of every partition, until the topic has been quiet for
``idle_s`` twice in a row (:func:`stream_anon.audit.kafka_source.read_topic`), never up to the broker's end offset
(the Tansu broker reports it wrong). A row of an aborted transaction that a broker still shows (Tansu does) is
identical to its committed re-production (same ``row_id``, same noise: see :mod:`stream_anon.kafka.aggregates`),
so deduplication by ``row_id`` makes it harmless.
"""
from __future__ import annotations

import csv
import json
import sys
from typing import IO

from stream_anon.audit.kafka_source import read_topic
from stream_anon.contract import topics
from stream_anon.dp.merge import merge_rows

# CSV columns of a merged row; dicts and lists (group, components, per-component noise, partitions) as JSON
CSV_FIELDS = ("stream", "aggregate", "output", "window", "window_start", "window_end", "period", "group_key", "group",
              "kind", "value", "noise_std", "interval_lo", "interval_hi", "interval_level", "interval_method",
              "partitions", "complete", "components")


def read_rows(bootstrap, stream: str, idle_s: float = 3.0, max_wait_s: float = 120.0) -> dict[str, dict]:
    """The committed ``anon.aggregates`` rows of ``stream``, by ``row_id`` (re-produced copies collapse)."""
    rows = {}
    for _src, value in read_topic(bootstrap, topics().aggregates, idle_s=idle_s, max_wait_s=max_wait_s):
        try:
            doc = json.loads(value)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("stream") == stream and "row_id" in doc:
            rows[doc["row_id"]] = doc
    return rows


def ledger_charge_by_period(rows) -> dict:
    """Period -> the largest ledger charge stated on the rows of that period (``ledger_epsilon_spent``: a
    partition's total through the row's window); key ``None`` for rows without a period (a ledger without periods)."""
    out: dict = {}
    for r in rows:
        period = r.get("period")
        out[period] = max(out.get(period, 0.0), float(r["ledger_epsilon_spent"]))
    return out


def merged_view(rows, level: float = 0.95) -> list[dict]:
    """Merged rows (:func:`merge_rows`) ordered by aggregate, output, window and key."""
    return sorted(merge_rows(rows, level=level),
                  key=lambda m: (m["aggregate"], m["output"], m["window"], str(m["group_key"])))


def write_view(merged: list[dict], fmt: str, out: IO[str]) -> None:
    """``jsonl``: one merged row per line, as :func:`merge_rows` returns it; ``csv``: :data:`CSV_FIELDS`."""
    if fmt == "jsonl":
        for m in merged:
            out.write(json.dumps(m, sort_keys=True) + "\n")
        return
    if fmt != "csv":
        raise ValueError(f"format: jsonl or csv, got {fmt!r}")
    w = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for m in merged:
        row = {**m, "interval_lo": m["interval"][0], "interval_hi": m["interval"][1]}
        for f in ("group", "components", "noise_std", "partitions"):
            if isinstance(row.get(f), (dict, list)):
                row[f] = json.dumps(row[f], sort_keys=True)
        w.writerow(row)


def run_view(bootstrap, stream: str, fmt: str = "jsonl", out_path: str | None = None, level: float = 0.95,
             incomplete: bool = False, idle_s: float = 3.0) -> dict:
    """Read, merge and write the view (to ``out_path`` or stdout); returns counts for the command's summary.
    Without ``incomplete`` only the windows every publishing partition has closed (``complete``: final figures)."""
    rows = read_rows(bootstrap, stream, idle_s=idle_s)
    everything = merged_view(rows.values(), level=level)
    merged = everything if incomplete else [m for m in everything if m["complete"]]
    if out_path:
        with open(out_path, "w", newline="") as f:
            write_view(merged, fmt, f)
    else:
        write_view(merged, fmt, sys.stdout)
    return {"rows_read": len(rows), "merged_rows": len(merged),
            "incomplete_held_back": 0 if incomplete else len(everything) - len(merged),
            "partitions": sorted({r.get("partition") for r in rows.values()}, key=str)}
