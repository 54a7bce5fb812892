"""The DP aggregates released in a child process (stream_anon.worker.aggregates_process, issue 11): the worker's
output and state must be the ones it gives without the process, a release that fails there must be handled as a
failure of the batch's events (isolated, dead-lettered, the rest unchanged), and a process that is gone must stop
the worker (fail closed), never be taken for an event's fault.

The worker core is driven directly (``WorkerCore.handle``, what the Kafka loop does per batch); the Kafka tests of
``tests/kafka/test_kafka_dp.py`` run the worker with the process (``--aggregates-process`` is ``auto``: on with 2
CPUs)."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
import _aggregates_process_helpers as helpers  # noqa: E402

from stream_anon.config import load_config  # noqa: E402
from stream_anon.contract import config_path  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.worker.aggregates_process import AggregatesProcessLost  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402
from stream_anon.render import TOPICS  # noqa: E402

SECRET = b"aggregates-process-test-secret-0123456789"
VOLATILE = ("ts", "created_at", "received_at")


def messages(n: int = 6000, partitions: int = 2):
    events = load_events("oyster", limit=n)
    return [(i % partitions, i // partitions, orjson.dumps(e)) for i, e in enumerate(events)]


def run(msgs, batch: int = 700, flush: bool = True, **kwargs) -> tuple[WorkerCore, list, list]:
    """(core, output messages, each partition's committed state after each batch: :func:`_stable`)."""
    core = WorkerCore(load_config(config_path("oyster")), "t", SECRET, **kwargs)
    out, states = [], []
    try:
        for i in range(0, len(msgs), batch):
            out += core.handle(msgs[i:i + batch])
            states += [_stable(core, ps) for ps in core.parts.values()]
        if flush:
            out += core.flush_all()
            states += [_stable(core, ps) for ps in core.parts.values()]
    finally:
        core.close()
    return core, out, states


def _stable(core: WorkerCore, ps) -> tuple:
    """The partition's committed state (core and keyed tables), without the time it was written."""
    doc, tables = ps.committed_state()
    doc = {k: v for k, v in doc.items() if k != "written_at"}
    return (orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY),
            {name: (keys.tobytes(), b"".join(rows) if isinstance(rows, list) else rows.tobytes())
             for name, (keys, rows) in tables.items()})


def content(msgs) -> list:
    """The messages in order, without the fields that hold the time they were made."""
    out = []
    for topic, key, value in msgs:
        doc = orjson.loads(value)
        for f in VOLATILE:
            doc.pop(f, None)
        out.append((topic, key, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)))
    return out


def test_the_process_gives_the_output_and_the_state_of_the_worker_without_it():
    msgs = messages()
    core_a, out_a, states_a = run(msgs)
    core_b, out_b, states_b = run(msgs, aggregates_process=True)
    assert core_b.aggregates_process is not None
    rows = [m for m in out_a if m[0] == TOPICS.aggregates]
    assert len(rows) > 1000                     # the slice closes windows: there are rows to compare
    assert content(out_b) == content(out_a)     # same messages, same order (DP rows where the worker put them)
    assert states_b == states_a                 # same committed state, ledger and unit window counts included
    assert core_b.stats.totals["aggregate_rows"] == core_a.stats.totals["aggregate_rows"] == len(rows)
    ledger = core_b.parts[0].dp.ledger          # the metrics endpoint's view: as of the last state record
    assert ledger.spent == core_a.parts[0].dp.ledger.spent > 0
    # and its budget gauges' outlook: the same as that of the aggregates in the worker's own process
    from stream_anon.dp.outlook import budget_outlook
    outlooks = [budget_outlook(c.config.dp, *c.parts[0].dp.budget_view()) for c in (core_a, core_b)]
    assert outlooks[0] == outlooks[1] and outlooks[1].elapsed is not None and outlooks[1].projected > 0


def test_a_release_failing_in_the_process_is_handled_as_without_the_process(monkeypatch):
    """The child fails on the windows holding a marked event (helpers.serve_failing); the worker without the
    process is given the same failure. Both must do the same: the batches that fail go through the isolation path
    and end with the same dead letters, releases, rows and counts (every event accounted for). No flush: the
    window that holds the marked event never closes without failing (a flush has no isolation path, with or
    without the process)."""
    events = load_events("oyster", limit=3000)
    poisoned = list(events)
    poisoned.insert(1600, dict(events[1599], event_id="x-poison", full_fare_pence=helpers.POISON_FARE))
    msgs = [(0, i, orjson.dumps(e)) for i, e in enumerate(poisoned)]
    core_b, out_b, states_b = run(msgs, aggregates_process=True, aggregates_serve=helpers.serve_failing,
                                  flush=False)
    helpers.fail_in_this_process(monkeypatch)
    core_a, out_a, states_a = run(msgs, flush=False)
    dead = [orjson.loads(v)["reason"] for t, _, v in out_a if t == TOPICS.deadletter]
    # the failure did happen, and went through the isolation path
    assert dead and all(r.startswith("processing error: RuntimeError") for r in dead)
    assert content(out_b) == content(out_a)
    assert states_b == states_a
    for core in (core_a, core_b):
        totals = core.stats.totals
        accounted = totals["published"] + totals["suppressed"] + totals["dead_letters"]
        assert totals["events_in"] == len(msgs) == accounted + sum(p.engine.deferred for p in core.parts.values())
    assert core_b.stats.totals == {**core_a.stats.totals, "started": core_b.stats.totals["started"]}


def test_a_lost_process_stops_the_worker_instead_of_blaming_an_event():
    msgs = messages(3000, partitions=1)
    core = WorkerCore(load_config(config_path("oyster")), "t", SECRET, aggregates_process=True)
    try:
        core.handle(msgs[:1500])
        os.kill(core.aggregates_process.pid, signal.SIGKILL)
        with pytest.raises(AggregatesProcessLost):
            core.handle(msgs[1500:])
        assert core.stats.totals["dead_letters"] == 0
    finally:
        core.close()


def test_two_batches_in_one_state_record_join_the_changes_asked_after_each_and_lose_nothing():
    """Two batches processed before one state record (the loop's transaction of two batches): the record state
    asked after the first is stale once the second releases, but the table changes it took from the child's change
    tracking must still be in the record. The record stays a delta record, and the state the chain of written
    records resolves to must be the one the worker without the process commits."""
    msgs = [(off, raw) for _, off, raw in messages(4000, partitions=1)]
    states = []
    for kwargs in ({}, {"aggregates_process": True}):
        core = WorkerCore(load_config(config_path("oyster")), "t", SECRET, **kwargs)
        try:
            ps = core.open_partition(0)
            core.committed(ps, core.complete(ps, core.process(ps, msgs[:1000]), msgs[:1000]).last_offset)
            first = core.complete(ps, core.process(ps, msgs[1000:2500]), msgs[1000:2500])
            second = core.complete(ps, core.process(ps, msgs[2500:]), msgs[2500:])
            assert any(t == TOPICS.aggregates for t, _, _ in second.messages)    # the second batch released
            rec = core.committed(ps, second.last_offset)
            assert not rec.full
            states.append(_stable(core, ps))
            assert first.messages and second.messages
        finally:
            core.close()
    assert states[0] == states[1]


def test_batches_held_for_their_rows_and_joined_give_each_batchs_messages_in_order():
    """The loop holds a batch whose DP rows are under way and joins the partition's next batch to it
    (kafka/transactions.py, HeldBatches): the joined output, completed once, must be the two batches' messages in
    order with each batch's rows where that batch put them, as the worker without the process gives them."""
    from stream_anon.kafka.transactions import JOINED_BATCHES_MAX, HeldBatches, joined

    msgs = [(off, raw) for _, off, raw in messages(4000, partitions=1)]
    cut = [0, 1400, 2700, len(msgs)]
    results = []
    for kwargs in ({}, {"aggregates_process": True}):
        core = WorkerCore(load_config(config_path("oyster")), "t", SECRET, **kwargs)
        try:
            ps = core.open_partition(0)
            held, holder = None, HeldBatches()
            for a, b in zip(cut, cut[1:]):
                h = joined(held, ps, msgs[a:b], core.process(ps, msgs[a:b]), 0.0)
                assert bool(h.out.pending) == bool(kwargs)          # rows under way only with the process
                held = holder.hold_or_give(h)
                if held is not None:                                  # given back: no rows under way, or full
                    assert not kwargs or h.batches == JOINED_BATCHES_MAX
                    break
                held = holder.take(0)
            assert held is not None and held.batches == (1 if not kwargs else JOINED_BATCHES_MAX)
            if not kwargs:        # without the process each batch is given back at once: join them here
                outs = [held.out] + [core.process(ps, msgs[a:b]) for a, b in zip(cut[1:], cut[2:])]
                out = outs[0].followed_by(outs[1]).followed_by(outs[2])
            else:
                out = core.complete(ps, held.out, held.msgs)
            assert out.last_offset == msgs[-1][0] and not out.pending
            results.append((content(out.messages), out.counts))
        finally:
            core.close()
    assert results[0] == results[1]
    assert any(topic == TOPICS.aggregates for topic, _, _ in results[0][0])      # DP rows among them
