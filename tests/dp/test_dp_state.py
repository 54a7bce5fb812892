"""Incremental DP state: PartitionAggregates is a Checkpointable (stream_anon.checkpoint) -- a bounded core, the
keyed table ``aggregator/unit_windows`` (keyed unit id or hash -> windows used in the period, a column per
aggregate) and its changes since the previous record -- so a checkpoint carries what changed instead of every
unit seen in the period.

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
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_dp_golden import cached_slice  # noqa: E402  (the shipped slice: runs on every clone)

from stream_anon import contract  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.engine import Engine  # noqa: E402
from stream_anon.worker.aggregates import PartitionAggregates, needed_fields  # noqa: E402
from stream_anon.worker.partition import PartitionState, split_tables  # noqa: E402

SECRET = b"dp-state-secret-0123456789abcdef0123"
BATCH = 1000
TABLE = "aggregator/unit_windows"


def _config():
    config = load_config(contract.config_path("oyster"))
    specs = tuple(dataclasses.replace(s, max_windows=1) for s in config.dp.aggregates)
    return dataclasses.replace(config, dp=dataclasses.replace(config.dp, aggregates=specs, max_windows_per_period=1))


def _apply(mirror: dict, changes: dict) -> None:
    """Apply a change set to ``mirror`` (name -> {key: record}), as a consumer of the checkpoint would."""
    for name, (keys, rows, deleted) in changes.items():
        table = mirror.setdefault(name, {})
        table.update(zip(keys.tolist(), rows.tolist()))
        for k in deleted.tolist():      # a key put and deleted between two calls is reported deleted only
            table.pop(k, None)


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
    pa = PartitionAggregates(config, 0, SECRET)
    first = pa.record_state()[1]
    assert set(first) == {TABLE}
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
        core, changes, n_rows = pa.record_state()
        _apply(mirror, changes)
        put_rows += sum(len(k) for k, _, _ in changes.values())
        deleted_rows += sum(len(d) for _, _, d in changes.values())
        tables = pa.full_tables()
        assert n_rows == sum(len(k) for k, _ in tables.values())
        full_rows += sum(len(k) for k, _ in tables.values())
        dtype = next(iter(tables.values()))[1].dtype
        rebuilt = _as_tables(mirror, dtype)
        assert set(rebuilt) == set(tables)
        for name, (keys, recs) in tables.items():
            assert np.array_equal(rebuilt[name][0], keys) and np.array_equal(rebuilt[name][1], recs), name
        if start == half:        # a worker restarting from the core and the tables rebuilt from the changes
            core = json.loads(json.dumps(core))
            restored = PartitionAggregates(config, 0, SECRET)
            restored.load_state(core, rebuilt)
            assert restored.state_core() == json.loads(json.dumps(pa.state_core()))
            assert restored.state_tables()[TABLE] == pa.state_tables()[TABLE]
            # a restored part's first change set is every row (its base is an empty table)
            assert restored.record_state()[1][TABLE][0].tolist() == tables[TABLE][0].tolist()
    windows = engine.flush().windows
    rows, metrics = pa.close_windows(windows)
    assert restored.close_windows(windows)[0] == rows
    assert pa.aggregator.state.period == "2009-11-10"
    assert deleted_rows > 0, "the new period deletes the counts of the old one"
    assert sum(pa.aggregator.metrics["windows_cut"].values()) > 0, "the slice must exercise the window cap"
    # incremental: the change sets carried a fraction of what full tables after every batch would have
    assert put_rows + deleted_rows < full_rows / 3


def test_tables_hold_keyed_hashes_not_units_and_do_not_collide_with_the_engines():
    config = _config()
    events = [orjson.loads(m) for m in cached_slice()[:4000]]
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    pa = PartitionAggregates(config, 0, SECRET)
    pa.close_windows(engine.process(events).windows)
    tables = pa.full_tables()
    keys = np.concatenate([k for k, _ in tables.values()])
    assert len(keys) > 1000
    journeys = {int(e["journey_id"]) for e in events}          # Oyster journey ids are numeric text
    assert not journeys & set(keys.tolist())
    # in the partition's state the parts' tables are told apart by their prefixes, and split back (qi/leaves: the
    # hierarchies' leaves the buffered codes are coded with)
    part_tables = PartitionState(0, engine, pa).full_tables()
    engine_tables, dp_tables, qi_tables = split_tables(part_tables)
    assert set(engine_tables) == set(engine.state_tables()) and set(dp_tables) == set(tables)
    assert set(qi_tables) == {"leaves"}
    # keyed: another secret gives other keys for the same units
    other_secret = b"another-secret-0123456789abcdef"       # the worker's engine and aggregates share one
    other = PartitionAggregates(config, 0, other_secret)
    other.close_windows(Engine(config, partition=0, secret=other_secret, carried=needed_fields(config))
                        .process(events).windows)
    assert not set(other.full_tables()[TABLE][0].tolist()) & set(tables[TABLE][0].tolist())


def test_the_worker_messages_carry_exactly_the_rows_of_close_windows():
    """``messages`` serializes each release's common fields once: parsed back, its values are
    ``close_windows``' rows, in order, for twin aggregates fed the same windows (partial releases included)."""
    from stream_anon.render import json_bytes as dumps
    config = _config()
    events = [orjson.loads(m) for m in cached_slice()[:12000]]
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    twin_rows, twin_msgs = PartitionAggregates(config, 3, SECRET), PartitionAggregates(config, 3, SECRET)
    n_rows = 0
    for start in range(0, len(events), 3000):
        windows = engine.process(events[start:start + 3000]).windows
        rows, metrics = twin_rows.close_windows(windows)
        msgs, n = twin_msgs.messages(windows, dumps, "anon.metrics").result()
        values = [orjson.loads(v) for t, _, v in msgs if t != "anon.metrics"]
        assert n == len(rows) == len(values) and values == rows
        assert _without_ts([orjson.loads(v) for t, _, v in msgs if t == "anon.metrics"]) == _without_ts(metrics)
        n_rows += n
    assert n_rows > 1000 and {r["kind"] for r in rows} >= {"count", "mean", "ratio"}


def test_a_period_keyed_under_another_unit_key_scheme_is_refused(monkeypatch):
    """The unit window counts of a period are keyed by the scheme of the aggregator that wrote them: the engine's
    unit ids, or the aggregator's own keyed hash of the unit. Read by an aggregator of the other scheme, every unit
    would be looked up under a key it never had and start again at 0 windows, contributing past the cap W: the
    restore is refused. Its own scheme restores, and a state whose period holds no count loads under either."""
    from stream_anon.worker import aggregates
    config = _config()
    events = [orjson.loads(m) for m in cached_slice()[:8000]]
    with monkeypatch.context() as m:                      # the aggregates keyed by hashes of the unit field
        m.setattr(aggregates, "unit_ids_carried", lambda config: False)
        hashed = PartitionAggregates(config, 0, SECRET)
        assert needed_fields(config)[0] == config.stream.privacy_unit
        hashed.close_windows(Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
                             .process(events).windows)
        core, tables = json.loads(json.dumps(hashed.state_core())), hashed.full_tables()
        assert core["aggregator"]["unit_keys"] == "hash" and len(tables[TABLE][0]) > 100
        same = PartitionAggregates(config, 0, SECRET)
        same.load_state(core, tables)
        assert same.state_tables()[TABLE] == hashed.state_tables()[TABLE]
    ids = PartitionAggregates(config, 0, SECRET)
    assert ids.aggregator.bounding.keys.scheme == "ids"
    with pytest.raises(ValueError, match="unit key scheme 'hash'"):
        ids.load_state(core, tables)
    empty = {TABLE: (tables[TABLE][0][:0], tables[TABLE][1][:0])}
    PartitionAggregates(config, 0, SECRET).load_state(core, empty)
