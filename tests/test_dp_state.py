"""Incremental DP state (issue 11): PartitionAggregates has the engine's state API -- a bounded core, keyed tables
``dp:unit.windows`` (keyed unit hash -> windows used in the period, a column per aggregate) and the changes since
the previous call -- so a checkpoint can carry what changed instead of every unit seen in the period.

Driven by the engine on a whole-day slice of the Oyster file (every journey whose CRC-32 is 0 modulo 40,
configs/oyster.toml with W = 1 so that the window cap bites), crossing midnight in London (a new period deletes
every count).
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).parent))
from test_dp_golden import cached_slice, pytestmark  # noqa: E402,F401  (needs the full Oyster file too)

from stream_anon import contract  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon import checkpoint
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.kafka.aggregates import PartitionAggregates, needed_fields  # noqa: E402

SECRET = b"dp-state-secret-0123456789abcdef0123"
BATCH = 1000


def _config():
    config = load_config(contract.config_path("oyster"))
    specs = tuple(dataclasses.replace(s, max_windows=1) for s in config.dp.aggregates)
    return dataclasses.replace(config, dp=dataclasses.replace(config.dp, aggregates=specs, max_windows_per_period=1))


def _apply(mirror: dict, changes: dict) -> None:
    """Apply a change set to ``mirror`` (name -> {key: record}), as a consumer of the checkpoint would."""
    for name, (keys, rows) in changes.items():
        if name.endswith(":deleted"):
            table = mirror.setdefault(name[:-len(":deleted")], {})
            for k in keys.tolist():      # a key put and deleted between two calls is reported deleted only
                table.pop(k, None)
        else:
            table = mirror.setdefault(name, {})
            table.update(zip(keys.tolist(), rows.tolist()))


def _as_tables(mirror: dict, dtype) -> dict:
    out = {}
    for name, table in mirror.items():
        keys = np.array(sorted(table), dtype=np.int64)
        out[name] = (keys, np.array([table[k] for k in keys.tolist()], dtype=dtype))
    return out


def _without_ts(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "ts"} for m in metrics]


def test_changes_rebuild_the_tables_and_a_restore_from_them_continues_identically():
    config = _config()
    events = [orjson.loads(m) for m in cached_slice()]
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    pa = PartitionAggregates(config, 0, SECRET, None)
    first = pa.state_changes()
    assert set(first) == {"dp:unit.windows", "dp:unit.windows:deleted"}
    mirror: dict = {}
    _apply(mirror, first)
    restored = None
    put_rows = deleted_rows = 0
    full_rows = 0                   # what writing every table in full after each batch would carry
    half = len(events) // 2 // BATCH * BATCH
    for start in range(0, len(events), BATCH):
        windows = engine.process(events[start:start + BATCH]).windows
        rows, metrics = pa.close_windows(windows)
        if restored is not None:
            rows2, metrics2 = restored.close_windows(windows)
            assert rows2 == rows and _without_ts(metrics2) == _without_ts(metrics)
        changes = pa.state_changes()
        _apply(mirror, changes)
        put_rows += sum(len(k) for n, (k, _) in changes.items() if not n.endswith(":deleted"))
        deleted_rows += sum(len(k) for n, (k, _) in changes.items() if n.endswith(":deleted"))
        tables = pa.state_tables()
        full_rows += sum(len(k) for k, _ in tables.values())
        dtype = next(iter(tables.values()))[1].dtype
        rebuilt = _as_tables(mirror, dtype)
        assert set(rebuilt) == set(tables)
        for name, (keys, recs) in tables.items():
            assert np.array_equal(rebuilt[name][0], keys) and np.array_equal(rebuilt[name][1], recs), name
        if start == half:        # a worker restarting from the core and the tables rebuilt from the changes
            core = json.loads(json.dumps(pa.state_core()))
            restored = PartitionAggregates.restore(config, 0, SECRET, None, core, rebuilt)
            assert restored.state_dict() == pa.state_dict()
            assert restored.state_changes()["dp:unit.windows"][0].tolist() == tables["dp:unit.windows"][0].tolist()
    windows = engine.flush().windows
    rows, metrics = pa.close_windows(windows)
    assert restored.close_windows(windows)[0] == rows
    assert pa.aggregator.period == "2009-11-10"
    assert deleted_rows > 0, "the new period deletes the counts of the old one"
    assert sum(pa.aggregator.metrics["windows_cut"].values()) > 0, "the slice must exercise the window cap"
    # incremental: the change sets carried a fraction of what full tables after every batch would have
    assert put_rows + deleted_rows < full_rows / 3
    # the state document (state_dict) is the core with the tables packed in
    again = PartitionAggregates(config, 0, SECRET, None, json.loads(json.dumps(pa.state_dict())))
    assert again.state_tables().keys() == pa.state_tables().keys()
    for name, (keys, recs) in pa.state_tables().items():
        k2, r2 = again.state_tables()[name]
        assert np.array_equal(keys, k2) and np.array_equal(recs, r2)


def test_tables_hold_keyed_hashes_not_units_and_do_not_collide_with_the_engines():
    config = _config()
    events = [orjson.loads(m) for m in cached_slice()[:4000]]
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    pa = PartitionAggregates(config, 0, SECRET, None)
    pa.close_windows(engine.process(events).windows)
    tables = pa.state_tables()
    keys = np.concatenate([k for k, _ in tables.values()])
    assert len(keys) > 1000
    journeys = {int(e["journey_id"]) for e in events}          # Oyster journey ids are numeric text
    assert not journeys & set(keys.tolist())
    assert not set(tables) & set(engine.state_tables()), "a table name of the engine's"
    # keyed: another secret gives other keys for the same units
    other_secret = b"another-secret-0123456789abcdef"       # the worker's engine and aggregates share one
    other = PartitionAggregates(config, 0, other_secret, None)
    other.close_windows(Engine(config, partition=0, secret=other_secret, carried=needed_fields(config))
                        .process(events).windows)
    assert not set(other.state_tables()["dp:unit.windows"][0].tolist()) & set(
        tables["dp:unit.windows"][0].tolist())


def test_a_state_with_the_earlier_per_aggregate_tables_restores_to_the_same_counts():
    """State written before the tables were merged (``dp:<aggregate>`` -> ``windows``) restores to the same
    unit window counts, and the restored aggregates release the same rows."""
    from stream_anon.dp.aggregator import UNIT_WINDOW_FIELDS
    config = _config()
    events = [orjson.loads(m) for m in cached_slice()[:20000]]
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    pa = PartitionAggregates(config, 0, SECRET, None)
    pa.close_windows(engine.process(events[:10000]).windows)
    legacy = {}
    for spec in config.dp.aggregates:
        keys, windows = pa.aggregator.unit_window_counts(spec.name)
        rows = np.zeros(len(keys), dtype=UNIT_WINDOW_FIELDS)
        rows["windows"] = windows
        legacy[f"dp:{spec.name}"] = (keys, rows)
    assert sum(len(k) for k, _ in legacy.values()) > len(pa.aggregator.unit_windows) > 1000
    core = json.loads(json.dumps(pa.state_core()))
    restored = PartitionAggregates.restore(config, 0, SECRET, None, core, legacy)
    assert restored.aggregator.unit_windows == pa.aggregator.unit_windows
    windows = engine.process(events[10000:]).windows
    assert restored.close_windows(windows)[0] == pa.close_windows(windows)[0]


def test_the_worker_messages_carry_exactly_the_rows_of_close_windows():
    """``messages`` serializes each release's common fields once: parsed back, its values are
    ``close_windows``' rows, in order, for twin aggregates fed the same windows (partial releases included)."""
    from stream_anon.kafka.render import json_bytes as dumps
    config = _config()
    events = [orjson.loads(m) for m in cached_slice()[:12000]]
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    twin_rows, twin_msgs = PartitionAggregates(config, 3, SECRET, None), PartitionAggregates(config, 3, SECRET, None)
    n_rows = 0
    for start in range(0, len(events), 3000):
        windows = engine.process(events[start:start + 3000]).windows
        rows, metrics = twin_rows.close_windows(windows)
        msgs, n = twin_msgs.messages(windows, dumps, "anon.metrics")
        values = [orjson.loads(v) for t, _, v in msgs if t != "anon.metrics"]
        assert n == len(rows) == len(values) and values == rows
        assert _without_ts([orjson.loads(v) for t, _, v in msgs if t == "anon.metrics"]) == _without_ts(metrics)
        n_rows += n
    assert n_rows > 1000 and {r["kind"] for r in rows} >= {"count", "mean", "ratio"}
