"""The DP aggregates' output on a fixed slice of the Oyster day, against a golden file written by the per-event
implementation that preceded the columnar one (issue 11): for a given secret and input the rows, their values
and noise, the window metrics and the unit window counts must not change when the code gets faster.

The slice: every event of the journeys whose CRC-32 is 0 modulo 40 (whole journeys, so contribution cuts and the
W-windows cap bite; the whole day, so the period boundary at midnight in London is crossed), fed to one
partition of :class:`stream_anon.worker.core.WorkerCore` in batches of 1,000 with configs/oyster.toml, the worker
restarted from its state document half way, and flushed at the end. Four configurations: configs/oyster.toml as
it is (journeys never exceed its bounds), the station as privacy unit with W = 3 (contribution cuts, the window
cap, units missing on bus taps), the bus route as unit without a period (legacy mode, the budget runs out) and
the event as unit.

The slice's events ship in ``tests/golden/dp_oyster_slice_events.jsonl.gz`` (a test checks them against the full
file where it is present). Regenerate (only when a change of output is intended; needs the full file):
``python tests/dp/test_dp_golden.py``.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import gzip
import hashlib
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from stream_anon import contract
from stream_anon.config import load_config
from stream_anon.datasets import DATASETS, load_events
from stream_anon.worker.core import WorkerCore

# the golden file was recorded on a whole day of the full Oyster file, which lives in ../shared/data (not in a
# plain clone); the slice's events ship beside it (225 KB), so the test runs on every clone
FULL_OYSTER = DATASETS["oyster"].full_path
GOLDEN = Path(__file__).parents[1] / "golden" / "dp_oyster_slice.json"
SLICE = Path(__file__).parents[1] / "golden" / "dp_oyster_slice_events.jsonl.gz"
SECRET = b"golden-secret-0123456789abcdef0123456789"
BATCH = 1000


def oyster_slice() -> list[bytes]:
    events = load_events("oyster", full=True)
    return [orjson.dumps(e) for e in events if zlib.crc32(str(e["journey_id"]).encode()) % 40 == 0]


def variant_config(variant: str):
    config = load_config(contract.config_path("oyster"))
    dp = config.dp
    if variant == "station_unit":
        dp = dataclasses.replace(dp, privacy_unit="station", max_windows_per_period=3)
    elif variant == "legacy_route_unit":
        dp = dataclasses.replace(dp, privacy_unit="bus_route", period=None, epsilon_budget=3.0)
    elif variant == "event_unit":
        dp = dataclasses.replace(dp, unit="event")
    return dataclasses.replace(config, dp=dp)


VARIANTS = ("oyster", "station_unit", "legacy_route_unit", "event_unit")


@functools.lru_cache(maxsize=1)
def cached_slice() -> tuple[bytes, ...]:
    """The slice's messages as shipped (:func:`oyster_slice` of the full file, one a line)."""
    return tuple(gzip.decompress(SLICE.read_bytes()).splitlines())


@pytest.mark.skipif(not FULL_OYSTER.exists(), reason=f"full data {FULL_OYSTER} absent (plain clone without ../shared)")
def test_the_shipped_slice_is_the_selection_of_the_full_file():
    assert cached_slice() == tuple(oyster_slice())


def run_worker(messages, config) -> dict:
    """Aggregate rows, DP window metrics (without their wall-clock ``ts``) and the final DP state."""
    core = WorkerCore(config, "golden", SECRET)
    ps = core.open_partition(0)
    rows, windows = [], []

    def collect(out):
        for topic, _, value in out:
            doc = orjson.loads(value)
            if topic == "anon.aggregates":
                rows.append(doc)
            elif doc.get("type") in ("dp_window", "budget_exhausted"):
                doc.pop("ts", None)
                # the ledger's total was summed in an order that depended on the string hash seed (fixed since):
                # compare it to 12 decimals
                if "epsilon_spent" in doc:
                    doc["epsilon_spent"] = round(doc["epsilon_spent"], 12)
                windows.append(doc)

    half = len(messages) // 2 // BATCH * BATCH
    for start in range(0, len(messages), BATCH):
        if start == half:           # restart: a new worker from the committed state records, as Kafka returns them
            from stream_anon.worker import state as st
            doc, tables = st.resolve_chain([st.decode_state(st.encode_state(r)) for r in ps.chain])
            core = WorkerCore(config, "golden", SECRET)
            ps = core.open_partition(0, doc, tables)
        chunk = messages[start:start + BATCH]
        out = core.process(ps, [(start + i, m) for i, m in enumerate(chunk)])
        collect(out.messages)
        core.committed(ps, out.last_offset)
    out = core.flush(ps)
    collect(out.messages)
    return {"rows": rows, "windows": windows, "dp_state": aggregator_state(ps.dp)}


def aggregator_state(dp) -> dict:
    """The aggregator's state (core and unit window table) in the one document the golden file digests: the core,
    and in period mode each aggregate's unit window counts (base64 of the units' keys as uint64, ascending, and of
    their counts as u2) under ``unit_windows``."""
    core = dict(dp.state_core()["aggregator"])
    tables = dp.full_tables()
    if "aggregator/unit_windows" in tables:
        keys, rows = tables["aggregator/unit_windows"]
        core["unit_windows"] = {}
        for name in rows.dtype.names:
            used = rows[name] > 0
            hashes = keys[used].view(np.uint64)
            order = np.argsort(hashes)
            core["unit_windows"][name] = {
                "n": len(hashes), "hashes": base64.b64encode(hashes[order].astype("<u8").tobytes()).decode(),
                "counts": base64.b64encode(rows[name][used][order].astype("<u2").tobytes()).decode()}
    return {"aggregator": core}


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def summarize(result: dict) -> dict:
    """What the golden file holds (kept small): digests of every row, of the rows of each aggregate and output,
    of the window metrics and of the DP state, with readable totals (a failing comparison says where first)."""
    rows, windows = result["rows"], result["windows"]
    by_output: dict[str, list] = {}
    for r in rows:
        by_output.setdefault(f"{r['aggregate']}/{r['output']}", []).append(r)
    totals: dict[str, dict[str, int]] = {}
    for w in windows:
        for key in ("contributions_cut", "out_of_domain", "missing", "windows_cut", "units_window_capped"):
            for name, n in w.get(key, {}).items():
                totals.setdefault(key, {}).setdefault(name, 0)
                totals[key][name] += n
    state = result["dp_state"]["aggregator"]
    return {"n_rows": len(rows), "n_windows": len(windows), "cut_totals": totals,
            "unit_windows_n": {a: p["n"] for a, p in state.get("unit_windows", {}).items()},
            "rows_sha256_by_output": {k: digest(v) for k, v in sorted(by_output.items())},
            "windows_sha256": digest(windows), "rows_sha256": digest(rows),
            "dp_state_sha256": digest(result["dp_state"])}


@pytest.mark.parametrize("variant", VARIANTS)
def test_dp_rows_match_the_golden_file(variant):
    got = summarize(run_worker(cached_slice(), variant_config(variant)))
    want = json.loads(GOLDEN.read_text())[variant]
    for key in ("n_rows", "n_windows", "cut_totals", "unit_windows_n", "rows_sha256_by_output", "windows_sha256",
                "rows_sha256", "dp_state_sha256"):
        assert got[key] == want[key], key


if __name__ == "__main__":
    SLICE.write_bytes(gzip.compress(b"\n".join(oyster_slice()) + b"\n", 9, mtime=0))
    cached_slice.cache_clear()
    GOLDEN.write_text(json.dumps({v: summarize(run_worker(cached_slice(), variant_config(v))) for v in VARIANTS},
                                 indent=1) + "\n")
    print(GOLDEN, GOLDEN.stat().st_size, file=sys.stderr)
