"""The :class:`~stream_anon.checkpoint.Checkpointable` contract, checked on every stateful part: one suite of checks,
parts found from the registries (:mod:`.registry`), every part passes every check (in the style of river's
``utils/estimator_checks.py``; tests/state/test_checkpoint_contract.py runs them).

The checks (``CHECKS``), each on a part built by a :class:`Factory` and fed its inputs:

(a) ``restore``: a fresh part loaded from a full state record, taken after some input, gives the same output as the
    original on the next inputs;
(b) ``changes``: the change sets since the first record, applied in order to the first (full) record
    (:func:`stream_anon.worker.state.resolve_chain`), equal the full state; where the part deletes rows
    (``Factory.deletes``), the chain must carry deletions;
(c) ``no raw identifier``: fed units whose identifiers are recognisable strings, no state record (core and tables,
    as written) holds any of them;
(d) ``bounded core``: the core's serialized size does not grow with the number of distinct units fed (the same
    events, ten times more units); what grows goes to the keyed tables.

Records go through the state topic's own encoding (:func:`stream_anon.worker.state.encode_state`): what is checked
is what a worker writes and reads back. :func:`factories` makes the parts: the engine with each former (in the
bundled config that selects it), the DP aggregator (over every aggregate kind, with and without a period), the
budget ledger, and the partition's aggregates with each aggregate kind alone. A part of your own: a
:class:`Factory` (its ``build`` makes the part, ``inputs`` makes a list of inputs from a list of unit identifiers,
``feed`` gives one input to a part and returns its output, comparable with ``==``) passed to
:func:`check_checkpointable`.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, TypedDict

import numpy as np
import orjson

from stream_anon.checkpoint import Checkpointable, changes, full_state
from stream_anon.datasets import load_events
from stream_anon.dp import BudgetLedger, DPAggregator, parse_dp_config
from stream_anon.events import UNIT_IDS
from stream_anon.worker import state as st

from . import registry

MARK = "RAWID"                        # in every unit identifier fed: found in a record, it is a raw identifier
SECRET = b"contract-secret-0123456789abcdef0123"


@dataclass
class Factory:
    name: str
    build: Callable[[], Checkpointable]
    inputs: Callable[[list[str]], list]         # the part's inputs, from unit identifiers (each holds MARK)
    feed: Callable[[Any, Any], Any]             # (part, one input) -> the part's output for it
    deletes: bool = False                       # its inputs make it delete table rows (check (b) needs some)
    tables: bool = True                         # it has keyed tables that grow with the units
    unit_tables: tuple[str, ...] = ()           # those tables (empty: all of them; others grow with the events)
    # the unit counts check (d) compares: from the smallest on, what the configuration bounds (e.g. the m-invariant
    # former's pool of published values, pool_size per value) is full
    unit_counts: tuple[int, int, int] = (30, 300, 3000)


def units(n: int, tag: str = "") -> list[str]:
    return [f"PERSON-{tag}{i:05d}-{MARK}" for i in range(n)]


# -- the DP aggregator ------------------------------------------------------------------------------------------------
W0 = 1257724800 // 900                # 2009-11-09T00:00:00Z in 15-minute windows
LINE = {"name": "line", "field": "line", "values": ["a", "b", "c"]}
AGGREGATES = [
    {"name": "n", "kind": "count", "epsilon": 0.3, "max_contributions": 2, "group_by": [LINE], "output": "both"},
    {"name": "fares", "kind": "sum", "value": "fare", "lower": 0, "upper": 500, "epsilon": 0.2,
     "max_contributions": 1, "group_by": [LINE], "release_every_windows": 2},
    {"name": "mean_fare", "kind": "mean", "value": "fare", "lower": 0, "upper": 500, "epsilon": 0.2,
     "max_contributions": 1, "output": "running", "mechanism": "binary_tree"},
    {"name": "fare_bins", "kind": "histogram", "value": "fare", "bins": [0, 100, 300, 700], "epsilon": 0.1,
     "max_contributions": 1},
    {"name": "share_a", "kind": "ratio", "value": "line", "numerator_values": ["a"], "epsilon": 0.1,
     "max_contributions": 1, "group_by": [LINE]}]


def dp_config(period: str | None, unit: str = "individual"):
    raw = {"stream": {"name": "contract", "privacy_unit": "card", "event_time": "event_time"},
           "anonymization": {"window_s": 900}, "aggregates": AGGREGATES}
    if period is None:
        raw["dp"] = {"epsilon_budget": 1e6}
        raw["aggregates"] = [{**a, "horizon_windows": 64} for a in AGGREGATES if "release_every_windows" not in a]
    else:
        raw["dp"] = {"unit": unit, "period": period, "timezone": "Europe/London", "epsilon_per_period": 1.0,
                     **({} if unit == "event" else {"max_windows_per_period": 2})}
        if unit == "event":
            raw["aggregates"] = [{**a, "max_contributions": 1} for a in AGGREGATES]
    return parse_dp_config(raw)


def unit_id(unit: str) -> int:
    """A keyed 64-bit id of the unit, as the engine carries it (``UNIT_IDS``)."""
    return int.from_bytes(hashlib.blake2b(unit.encode(), key=SECRET[:32], digest_size=8).digest(), "little",
                          signed=True)


def window_events(pool: list[str], steps: int = 14, per_window: int = 60) -> list[tuple[int, list[dict]]]:
    """(window, events) over ``steps`` windows from 23:00 (an hourly period ends every 4 windows, a daily one at
    midnight): the same lines and fares whatever the pool, the units drawn from ``pool``."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(steps):
        lines = rng.choice(["a", "b", "c", "zz"], size=per_window)
        fares = rng.integers(0, 700, size=per_window)
        who = rng.integers(0, len(pool), size=per_window)
        out.append((W0 + 92 + i, [{"card": pool[j], "line": str(l), "fare": int(f)}
                                  for j, l, f in zip(who, lines, fares)]))
    return out


def release(part: DPAggregator, window) -> list[dict]:
    w, events = window
    return [{k: v for k, v in r.items() if k != "ts"} for r in part.process_window(w, events)]


def release_by_ids(part: DPAggregator, window) -> list[dict]:
    """The worker's form: columns, the units as the engine's keyed ids."""
    w, events = window
    columns: dict[str, Any] = {f: [e.get(f) for e in events] for f in part.fields}    # lists, the ids an array
    columns[UNIT_IDS] = np.array([unit_id(e["card"]) for e in events], dtype=np.int64)
    return [{k: v for k, v in r.items() if k != "ts"} for r in part.process_columns(w, columns)]


def aggregator(period, unit="individual", unit_ids=False) -> Callable[[], DPAggregator]:
    cfg = dp_config(period, unit)
    return lambda: DPAggregator(cfg, BudgetLedger(None, cfg.epsilon_budget), seed=SECRET, unit_ids=unit_ids)


# -- the budget ledger ----------------------------------------------------------------------------------------------
def ledger_requests(pool: list[str], steps: int = 12) -> list[tuple[str, list]]:
    """(period, the window's reservations) per window, three windows per period: the ledger never sees a unit, so
    its inputs are the same whatever the pool."""
    out = []
    for i in range(steps):
        period = f"2009-11-{9 + i // 3:02d}"
        content = hashlib.sha256(str(i).encode()).hexdigest()[:32]
        out.append((period, [("n", W0 + i, 0.25, content, period, 0.5), ("m", W0 + i, 0.2, content, period, 0.4)]))
    return out


def reserve(ledger: BudgetLedger, step) -> list:
    period, requests = step
    ledger.compact(period)                 # as the aggregator does when a period starts
    return [(o.ok, o.window, round(o.spent, 12)) for o in ledger.reserve_many(requests)]


# -- the partition's aggregates (aggregator and ledger), fed the engine's closed windows -----------------------------
@functools.lru_cache(maxsize=8)
def _closed_windows(pool: tuple[str, ...]) -> list:
    from stream_anon.engine import Engine
    from stream_anon.worker.aggregates import needed_fields
    config = registry.bundled()["oyster"]
    events = load_events("oyster", limit=4000)            # 04:31-05:52: moved to 23:31-00:52, across a period
    journeys = {j: pool[i % len(pool)] for i, j in enumerate(dict.fromkeys(e["journey_id"] for e in events))}
    later = lambda t: (datetime.fromisoformat(t) + timedelta(hours=19)).isoformat()     # noqa: E731
    engine = Engine(config, partition=0, secret=SECRET, carried=needed_fields(config))
    windows = []
    for start in range(0, len(events), 500):
        batch = [{**e, "journey_id": journeys[e["journey_id"]], "event_time": later(e["event_time"])}
                 for e in events[start:start + 500]]
        windows.append(engine.process(batch).windows)
    windows.append(engine.flush().windows)
    return [w for w in windows if w]


def partition_aggregates(config) -> Callable[[], Any]:
    def build():
        from stream_anon.worker.aggregates import PartitionAggregates
        return PartitionAggregates(config, 0, SECRET)
    return build


def close(part, windows) -> tuple:
    rows, metrics = part.close_windows(windows)
    return rows, [{k: v for k, v in m.items() if k != "ts"} for m in metrics]


# -- the engine (window core, former, registry) ------------------------------------------------------------------------
def engine_batches(dataset: str, unit_field: str, n: int = 4000, batch: int = 400) -> Callable[[list[str]], list]:
    """Batches of a bundled slice's events with their privacy unit drawn from the pool (in order of first
    appearance, so the same events whatever the pool)."""
    def inputs(pool: list[str]) -> list:
        events = load_events(dataset, limit=n)
        who = {u: pool[i % len(pool)] for i, u in enumerate(dict.fromkeys(str(e[unit_field]) for e in events))}
        mapped = [{**e, unit_field: who[str(e[unit_field])]} for e in events]
        return [mapped[i:i + batch] for i in range(0, len(mapped), batch)]
    return inputs


def engine_of(config, **anonymization) -> Callable[[], Any]:
    def build():
        from stream_anon.engine import Engine
        return Engine(config.replace_anonymization(**anonymization) if anonymization else config, partition=0,
                      secret=SECRET)
    return build


def engine_step(engine, batch: list[dict]) -> list:
    """What the engine outputs for a batch: its releases (manifest without the wall clock, records), the closed
    windows and the rejections."""
    res = engine.process(batch)
    out = []
    for rel in res.releases:
        manifest = rel.manifest()
        manifest.pop("created_at")
        out.append((as_written(manifest), as_written(rel.records)))
    return out + [[(w.index, w.late) for w in res.windows], [r.reason for r in res.rejected]]


class _Feed(TypedDict, total=False):
    """How an engine is fed: ENGINE_FEED has every key, an entry of ENGINE_FEEDS those it changes."""
    anonymization: dict                 # [anonymization] keys changed
    n: int                              # events of the slice
    batch: int                          # events per input
    tables: bool                        # Factory.tables, unit_counts, unit_tables
    unit_counts: tuple[int, int, int]
    unit_tables: tuple[str, ...]


# How the engine with a former is fed (default: as the k-anonymous one, whose tables grow with the events: seen
# event ids, buffered records, not with the units). The m-invariant former's pool of published values (bounded by
# the configuration: pool_size per value) is made small, so that it fills within the slice.
ENGINE_FEED: _Feed = {"anonymization": {}, "n": 4000, "batch": 400, "tables": False, "unit_counts": (30, 300, 3000),
                      "unit_tables": ()}
ENGINE_FEEDS: dict[str, _Feed] = {
    "MInvariantFormer": {"anonymization": {"m_params": {"pool_size": 2}}, "n": 12000, "batch": 1000, "tables": True,
                         "unit_counts": (200, 600, 2000), "unit_tables": ("former/signatures",)}}


def engine_factory(former: str) -> Factory:
    """The engine of the bundled config that selects ``former`` (:func:`.registry.former_config`)."""
    config = registry.former_config(former)
    feed: _Feed = {**ENGINE_FEED, **ENGINE_FEEDS.get(former, {})}
    return Factory(f"engine/{former}", engine_of(config, **feed["anonymization"]),
                   engine_batches(config.stream.name, config.stream.privacy_unit, feed["n"], feed["batch"]),
                   engine_step, deletes=True, tables=feed["tables"], unit_counts=feed["unit_counts"],
                   unit_tables=feed["unit_tables"])


def factories() -> list[Factory]:
    """Every stateful part, from the registries: the engine with each former, the DP aggregator (every aggregate
    kind, four kinds of period and unit), the budget ledger, the partition's aggregates of the oyster config and
    with each aggregate kind alone."""
    missing = set(registry.aggregate_kinds()) - {a["kind"] for a in AGGREGATES}
    assert not missing, f"aggregate kinds {sorted(missing)}: add one to AGGREGATES (contract_checks/checkpointable.py)"
    oyster = registry.bundled()["oyster"]
    windows = lambda pool: _closed_windows(tuple(pool))     # noqa: E731
    return [
        *(engine_factory(former) for former in registry.formers()),
        Factory("dp-aggregator/hourly-period", aggregator("hour"), window_events, release, deletes=True),
        Factory("dp-aggregator/daily-period-unit-ids", aggregator("day", unit_ids=True), window_events,
                release_by_ids, deletes=True),
        Factory("dp-aggregator/no-period", aggregator(None), window_events, release, tables=False),
        Factory("dp-aggregator/event-unit", aggregator("hour", unit="event"), window_events, release, tables=False),
        Factory("budget-ledger", lambda: BudgetLedger(None, 1.0), ledger_requests, reserve, tables=False),
        Factory("dp-partition-aggregates", partition_aggregates(oyster), windows, close, deletes=True),
        *(Factory(f"dp-partition-aggregates/{kind}",
                  partition_aggregates(registry.with_only(oyster, [registry.aggregate_sample(kind)[1]])), windows,
                  close, deletes=True) for kind in registry.aggregate_kinds()),
    ]


# -- records as written and read back -------------------------------------------------------------------------------
def record(part, seq: int, full: bool) -> st.StateRecord:
    """The part's state record after ``changes`` (``full``: the first, whose change set is every row)."""
    doc = {"seq": seq, "offset": seq, "core": part.state_core()}
    rec = st.StateRecord(doc, changes(part), full=full)
    st.encode_state(rec)                    # written now: the part goes on changing
    return rec


def full_record(part) -> tuple[dict, dict]:
    """(core, tables) of a full state record of the part, as a restarted worker reads them."""
    core, tables = full_state(part)
    rec = st.decode_state(st.encode_state(st.StateRecord.full_of({"seq": 1, "offset": 0, "core": core}, tables)))
    return rec.doc["core"], {name: (k, r) for name, (k, r, _) in rec.tables.items()}


def as_written(obj):
    return orjson.loads(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY))


# -- the checks -----------------------------------------------------------------------------------------------------
def check_restore_gives_the_same_next_output(factory: Factory) -> None:
    inputs = factory.inputs(units(40))
    for at in (1, len(inputs) // 2, len(inputs) - 3):
        part = factory.build()
        for x in inputs[:at]:
            factory.feed(part, x)
        core, tables = full_record(part)
        again = factory.build()
        again.load_state(core, tables)
        for x in inputs[at:at + 3]:
            assert factory.feed(again, x) == factory.feed(part, x), f"{factory.name}: restored after input {at}"
        assert as_written(again.state_core()) == as_written(part.state_core())


def check_changes_rebuild_the_full_state(factory: Factory) -> None:
    part = factory.build()
    chain = [record(part, 1, full=True)]
    for i, x in enumerate(factory.inputs(units(2000))):     # units of a period that the next one does not see
        factory.feed(part, x)
        chain.append(record(part, i + 2, full=False))
    doc, tables = st.resolve_chain([rec.as_written() for rec in chain])
    core, full = full_state(part)
    assert doc["core"] == as_written(core)
    assert sorted(tables) == sorted(full), factory.name
    for name, (keys, rows) in full.items():
        assert np.array_equal(tables[name][0], keys) and np.array_equal(tables[name][1], rows), (factory.name, name)
    deleted = sum(len(d) for rec in chain[1:] for _, _, d in rec.tables.values())
    assert deleted > 0 or not factory.deletes, f"{factory.name}: the inputs must make the part delete rows"


def check_no_record_holds_a_raw_identifier(factory: Factory) -> None:
    pool = units(60)
    part = factory.build()
    written = [st.encode_state(record(part, 1, full=True))]
    for i, x in enumerate(factory.inputs(pool)):
        factory.feed(part, x)
        written.append(st.encode_state(record(part, i + 2, full=False)))
        core, tables = full_state(part)
        written.append(st.encode_state(st.StateRecord.full_of({"seq": i, "offset": i, "core": core}, tables)))
    blob = b"".join(written)
    # the JSON part of a record is compressed: search the decoded cores too
    blob += b"".join(orjson.dumps(st.decode_state(v).doc) for v in written)
    assert MARK.encode() not in blob and not any(u.encode() in blob for u in pool), factory.name


def check_the_core_stays_bounded(factory: Factory) -> None:
    sizes, rows = [], []
    for n in factory.unit_counts:
        part = factory.build()
        for x in factory.inputs(units(n, tag=str(n))):
            factory.feed(part, x)
        core, tables = full_state(part)
        sizes.append(len(orjson.dumps(core, option=orjson.OPT_SERIALIZE_NUMPY)))
        rows.append(sum(len(k) for name, (k, _) in tables.items()
                        if not factory.unit_tables or name in factory.unit_tables))
    assert max(sizes) <= 1.1 * min(sizes) + 64, f"{factory.name}: core sizes {sizes} for {factory.unit_counts} units"
    if factory.tables:                # the units fed did differ: the tables grew with them
        assert rows[2] > 2 * rows[0] > 0, f"{factory.name}: table rows {rows}"


CHECKS = [check_restore_gives_the_same_next_output, check_changes_rebuild_the_full_state,
          check_no_record_holds_a_raw_identifier, check_the_core_stays_bounded]


def check_checkpointable(factory: Factory) -> None:
    """Every check of ``CHECKS`` on the part ``factory`` makes (AssertionError naming the part and the check)."""
    assert isinstance(factory.build(), Checkpointable), f"{factory.name}: not Checkpointable"
    for check in CHECKS:
        check(factory)


