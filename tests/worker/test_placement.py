"""One privacy unit, one partition (stream_anon.worker.placement): the worker computes where each unit belongs as
Kafka's default partitioner does, and an event arriving elsewhere is dead-lettered before the engine and the DP
aggregates see it, so that no unit is charged on two partitions' ledgers.

The attack it defeats: a producer keyed by event (not by unit) spreads a card over partitions; each partition's
ledger then says "within budget" while the card's loss is the sum over partitions. Against the naive worker (no
check) the card is counted in two partitions' DP state; against ours in one.
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import orjson
from kafka.partitioner.default import murmur2 as kafka_murmur2

sys.path.insert(0, str(Path(__file__).parents[1]))

from stream_anon import crypto  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.contract import config_path  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402
from stream_anon.worker.placement import WRONG_PARTITION, UnitPlacement, murmur2, partitions_for  # noqa: E402
from stream_anon.render import TOPICS  # noqa: E402

SECRET = b"placement-test-secret-0123456789abcdef"


def test_murmur2_is_kafkas():
    rng = random.Random(3)
    keys = [os.urandom(rng.randint(0, 70)) for _ in range(2000)] + [b"21", b"foobar", b""]
    ours = murmur2(keys).view("uint32").tolist()
    assert ours == [kafka_murmur2(k) for k in keys]


def test_units_belong_where_kafka_python_puts_their_key():
    units = [f"card-{i}" for i in range(500)] + [17, 3.5, True]
    keys = crypto.pseudonym_keys(SECRET, units)
    assert keys == [crypto.pseudonym(SECRET, str(u)).encode() for u in units]
    want = [(kafka_murmur2(k) & 0x7FFFFFFF) % 6 for k in keys]      # kafka-python's DefaultPartitioner
    assert partitions_for(keys, 6).tolist() == want
    assert UnitPlacement(SECRET, "card", 6).home(units) == want


def _stream(n_partitions: int, key: str):
    """The bundled oyster-cards taps as (partition, offset, value) messages, partitioned as a producer keyed by
    ``key`` (``card_id``: the unit, as replay does; ``event_id``: wrongly) would."""
    events = load_events("oyster-cards", limit=4000)
    keys = crypto.pseudonym_keys(SECRET, [e[key] for e in events])
    parts = partitions_for(keys, n_partitions).tolist()
    offsets = [0] * n_partitions
    out = []
    for e, p in zip(events, parts):
        out.append((p, offsets[p], orjson.dumps(e)))
        offsets[p] += 1
    return events, out


def _run(msgs, n_partitions: int, check: bool):
    core = WorkerCore(load_config(config_path("oyster-cards")), "placement", SECRET)
    if check:
        core.check_placement(n_partitions)
    out = core.handle(msgs) + core.flush_all()
    return core, out


def _cards_in_dp_state(core) -> dict[int, set]:
    """Partition -> keyed unit ids in its DP unit window table (the units its ledger charged)."""
    out = {}
    for p, ps in core.parts.items():
        keys, rows = ps.dp.full_tables()["aggregator/unit_windows"]
        out[p] = set(keys.tolist())
    return out


def test_a_unit_on_two_partitions_is_charged_twice_by_the_naive_worker_and_once_by_ours():
    events, msgs = _stream(4, "event_id")
    # the naive worker: the same card's events counted in several partitions' DP state
    naive, _ = _run(msgs, 4, check=False)
    seen = _cards_in_dp_state(naive)
    everywhere = [u for u in set().union(*seen.values()) if sum(u in s for s in seen.values()) > 1]
    assert len(everywhere) > 100, "the attack needs units spread over partitions"

    core, out = _run(msgs, 4, check=True)
    seen = _cards_in_dp_state(core)
    assert all(sum(u in s for s in seen.values()) == 1 for u in set().union(*seen.values()))
    dead = [orjson.loads(v) for t, _, v in out if t == TOPICS.deadletter]
    wrong = [d for d in dead if d["reason"].startswith(WRONG_PARTITION)]
    assert wrong and len(wrong) == len(dead)
    alerts = [orjson.loads(v) for t, _, v in out if t == TOPICS.metrics and b'"alert"' in v]
    assert any(a.get("alert") == WRONG_PARTITION for a in alerts)
    totals = core.stats.totals
    assert totals["events_in"] == len(events) == totals["published"] + totals["suppressed"] + \
        totals["dead_letters"] + sum(ps.engine.deferred for ps in core.parts.values())


def test_a_stream_keyed_by_unit_loses_nothing_to_the_check():
    events, msgs = _stream(4, "card_id")
    core, out = _run(msgs, 4, check=True)
    assert core.stats.totals["dead_letters"] == 0
    assert not [v for t, _, v in out if t == TOPICS.metrics and WRONG_PARTITION.encode() in v]


def _audit(msgs, out, n_partitions):
    from stream_anon.audit import AuditConfig, audit
    cfg = load_config(config_path("oyster-cards"))
    outputs = {"records": [], "manifests": [], "deadletters": [], "aggregates": []}
    for topic, _, value in out:
        part = {"anon.aggregates": "aggregates", "anon.releases": "manifests", "anon.deadletter": "deadletters",
                "anon.oyster-cards.records": "records"}.get(topic)
        if part:
            outputs[part].append(orjson.loads(value))
    raw = [((cfg.stream.input_topic, p, o), v) for p, o, v in msgs]
    return audit(raw, outputs, SECRET, AuditConfig.from_toml(config_path("oyster-cards")))


def test_the_audit_charges_a_unit_the_sum_over_the_partitions_it_reached():
    """A stream keyed by event: the naive worker's outputs fail the audit (each card charged on every partition its
    events reached, naming the count and the worst charge); the checking worker's pass (the misplaced events are
    dead letters, charged nowhere)."""
    _, msgs = _stream(4, "event_id")
    _, out = _run(msgs, 4, check=False)
    rep = _audit(msgs, out, 4)
    dp = rep.checks["dp"]
    assert not dp["passed"] and dp["violations_by_kind"].get("unit on several partitions") == 1
    assert dp["units_on_several_partitions"] > 100 and dp["worst_charge_across_partitions"] > 1.0
    line = next(e["line"] for e in dp["examples"] if e["violation"] == "unit on several partitions")
    assert f"{dp['units_on_several_partitions']} unit-periods on several input partitions" in line
    _, out = _run(msgs, 4, check=True)
    rep = _audit(msgs, out, 4)
    assert rep.checks["dp"]["passed"] and rep.checks["dp"]["units_on_several_partitions"] == 0
    assert rep.checks["dp_values"]["passed"]
