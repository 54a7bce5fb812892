"""Which DP rows exist is a function of the configuration and the stream's clock, never of which events arrived
(issue 39): neighbouring inputs that differ in every event of one unit give the same set of rows (partition,
aggregate, output, release, group key), for a unit whose only event is the earliest of its partition, the latest, alone in
its hour, or alone on its partition. Each partition publishes every window from the schedule's start (``dp.start``,
default the event time's declared lower bound) through the end of the period the worker's clock stands in.

The attack it defeats: a partition's rows used to start at the window of its first event, so one card tapping in at
02:10 (before anyone else on its partition) added the 02:00 and 03:00 rows of every aggregate: the card's presence
was certain from the set of rows, whatever the noise. ``test_the_naive_schedule_reveals_the_earliest_unit`` runs
that attack on a schedule that starts at the first event (the aggregator without a declared start).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import read_all, synthetic_fares, wait_for, write_stream_config  # noqa: E402

from stream_anon import crypto  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.worker.aggregates import AGGREGATES_TOPIC  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402
from stream_anon.worker.placement import partitions_for  # noqa: E402

pytestmark = pytest.mark.one_broker        # its broker tests on one broker (tests/conftest.py)

SECRET = b"schedule-test-secret-0123456789abcdef"
N_PARTITIONS = 4
DP_TOML = '''
[dp]
unit = "journey"
period = "day"
timezone = "Europe/London"
epsilon_per_period = 1.0
max_windows_per_period = 2

[[aggregates]]
name = "taps_per_zone_hour"
kind = "count"
epsilon = 0.6
max_contributions = 2
release_every_windows = 4
output = "both"
[[aggregates.group_by]]
name = "zone"
field = ["station", "bus_route"]
hierarchy = "hierarchies/test_location.json"
level = "zone"

[[aggregates]]
name = "mean_fare_day"
kind = "mean"
value = "full_fare_pence"
lower = 0
upper = 500
epsilon = 0.4
max_contributions = 2
release_every_windows = 96
'''


def schedule_config(directory: Path, name: str) -> Path:
    path = write_stream_config(directory, name, f"raw.test.{name}")
    path.write_text(path.read_text() + DP_TOML)
    return path


def home(unit: str) -> int:
    return int(partitions_for(crypto.pseudonym_keys(SECRET, [unit]), N_PARTITIONS)[0])


def base_events() -> list[dict]:
    """Journeys between 06:00 and 10:00 on 2009-11-09, on partitions 0-2 only (partition 3 stays empty: a unit
    alone there is the partition's only data)."""
    return [e for e in synthetic_fares(1500, seed=41) if home(e["journey_id"]) != 3]


def target(case: str) -> list[dict]:
    """The one unit the neighbouring input adds: its events."""
    at = {"earliest": "2009-11-09T02:10:00+00:00",      # before any other event of its partition
          "latest": "2009-11-09T23:50:00+00:00",         # after every other event (the same day)
          "alone_in_hour": "2009-11-09T04:20:00+00:00",  # nobody else in that hour
          "alone_on_partition": "2009-11-09T08:05:00+00:00"}[case]
    for i in range(10_000):
        unit = f"T-{case}-{i}"
        if (home(unit) == 3) == (case == "alone_on_partition"):
            break
    return [{"kind": "fare", "journey_id": unit, "card_id": None, "fare_product": "PAYG",
             "product_category": "payg", "discounted_fare_pence": None, "daily_capping": False,
             "event_id": f"{unit}-i", "event_type": "tap_in", "event_time": at, "subsystem": "LUL",
             "station": "Bank", "bus_route": None, "full_fare_pence": 240}]


def row_shape(row: dict) -> tuple:
    """What an observer sees of a row besides its numbers: where it is and what it is about. Neither the
    stream's name nor its lineage (random per run) enters: both are the same within one stream."""
    return (row["partition"], row["aggregate"], row["output"], row["release"], row["group_key"], row["window"],
            row["window_start"], row["window_end"], row.get("period"))


def messages(events: list[dict]) -> list[tuple[int, int, bytes]]:
    offsets = [0] * N_PARTITIONS
    out = []
    for e in sorted(events, key=lambda e: e["event_time"]):
        p = home(e["journey_id"])
        out.append((p, offsets[p], orjson.dumps(e)))
        offsets[p] += 1
    return out


def in_process_rows(config, events: list[dict]) -> set:
    """The worker's core on ``events`` (each unit on its partition, every partition opened as the Kafka loop
    opens its assignment), flushed at the end: the shapes of its DP rows."""
    core = WorkerCore(config, "schedule", SECRET)
    core.check_placement(N_PARTITIONS)
    for p in range(N_PARTITIONS):
        core.open_partition(p)
    out = core.handle(messages(events)) + core.flush_all()
    return {row_shape(orjson.loads(v)) for t, _, v in out if t == AGGREGATES_TOPIC}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return load_config(schedule_config(tmp_path_factory.mktemp("cfg"), "sched"))


@pytest.fixture(scope="module")
def without(config):
    return in_process_rows(config, base_events())


@pytest.mark.parametrize("case", ["earliest", "latest", "alone_in_hour", "alone_on_partition"])
def test_neighbouring_inputs_publish_the_same_rows(config, without, case):
    with_unit = in_process_rows(config, base_events() + target(case))
    assert with_unit == without, f"{case}: rows only with the unit: {sorted(with_unit - without)[:5]}, only " \
                                 f"without: {sorted(without - with_unit)[:5]}"
    # the whole day on every partition: 96 windows, 24 hourly and one daily release each
    assert {r[0] for r in without} == set(range(N_PARTITIONS))
    per_partition = {(r[1], r[2], r[3]) for r in without if r[0] == 3}
    assert len({r for r in per_partition if r[0] == "taps_per_zone_hour"}) == 24 * 2
    assert {r[2] for r in per_partition if r[0] == "mean_fare_day"} == {str(1397472 + 95)}


def test_the_naive_schedule_reveals_the_earliest_unit(config):
    """The attack, against a schedule that starts where the partition's data starts (no declared start): the
    earliest unit's presence shows in the set of rows."""
    naive = dataclasses.replace(config, dp=dataclasses.replace(config.dp, start=None))
    rows_without = in_process_rows(naive, base_events())
    rows_with = in_process_rows(naive, base_events() + target("earliest"))
    assert rows_with - rows_without, "the naive schedule should publish more rows with the earliest unit"


def test_a_window_the_clock_released_is_not_released_again(config):
    """An idle flush releases the day to its end; an event of that day arriving afterwards enters no DP row (its
    window is released) and is counted as ``after_release``; the records path still handles it."""
    core = WorkerCore(config, "schedule", SECRET)
    for p in range(N_PARTITIONS):
        core.open_partition(p)
    events = base_events()
    core.handle(messages(events))
    first = core.flush_all()
    late = target("latest")
    p = home(late[0]["journey_id"])
    ps = core.parts[p]
    before = {orjson.loads(v)["row_id"] for t, _, v in first if t == AGGREGATES_TOPIC}
    out = core.handle([(p, ps.offset + 1, orjson.dumps(late[0]))]) + core.flush_all()
    rows = [orjson.loads(v) for t, _, v in out if t == AGGREGATES_TOPIC]
    assert not rows, "the released day was published again"
    metrics = [orjson.loads(v) for t, _, v in out if t == "anon.metrics"]
    assert any(m.get("after_release") == 1 for m in metrics)
    assert ps.dp.aggregator.metrics["after_release"] == 1
    assert before


def test_events_before_the_start_are_counted_and_not_released(config):
    early = dataclasses.replace(config, dp=dataclasses.replace(
        config.dp, start=datetime(2009, 11, 10, tzinfo=timezone.utc).timestamp()))
    core = WorkerCore(early, "schedule", SECRET)
    core.open_partition(0)
    events = [e for e in base_events() if home(e["journey_id"]) == 0]
    out = core.handle([(0, i, orjson.dumps(e)) for i, e in enumerate(events)]) + core.flush_all()
    assert not [v for t, _, v in out if t == AGGREGATES_TOPIC]
    assert core.parts[0].dp.aggregator.metrics["before_start"] == len(events)


@pytest.mark.parametrize("case", ["earliest", "alone_on_partition"])
def test_on_the_broker_neighbouring_inputs_publish_the_same_rows(broker, tmp_path, case, monkeypatch):
    """The same through replay, the broker and a worker process with an idle flush, both inputs on one broker
    (two streams; rows compared without the stream's name and lineage)."""
    from stream_anon.kafka.replay import replay
    from stream_anon.kafka.supervise import start_worker_process
    from stream_anon.kafka.topics import ensure_topics

    monkeypatch.setenv("STREAM_ANON_SECRET", SECRET.decode())
    shapes = {}
    for name, events in (("nbwithout", base_events()), ("nbwith", base_events() + target(case))):
        path = schedule_config(tmp_path / name, name)
        cfg = load_config(path)
        ensure_topics(broker.bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records", "anon.releases",
                                               "anon.deadletter", "anon.metrics", AGGREGATES_TOPIC],
                      default_partitions={cfg.stream.input_topic: N_PARTITIONS, f"anon.{name}.records": 1})
        replay(broker.bootstrap, cfg.stream.input_topic, sorted(events, key=lambda e: e["event_time"]),
               "journey_id", secret=SECRET, progress=False)
        proc = start_worker_process(path, broker.bootstrap, tmp_path / f"state-{name}", f"{name}-app", 2.0,
                                    tmp_path / f"{name}.log")
        # the day ends at window 1397472 + 95 (2009-11-09 in London = UTC); every partition gets there
        last = 1397472 + 95
        try:
            def done():
                rows = [doc for _, doc, _, _ in read_all(broker.bootstrap, AGGREGATES_TOPIC, stream=name, idle_s=0.5)]
                ends = {}
                for r in rows:
                    ends[r["partition"]] = max(ends.get(r["partition"], 0), r["window"])
                return rows if ends == dict.fromkeys(range(N_PARTITIONS), last) else None
            rows = wait_for(done, 180, f"{name}: DP rows of the whole day on every partition",
                            lambda: (tmp_path / f"{name}.log").read_text()[-2000:])
            time.sleep(1.0)
        finally:
            proc.terminate()
            proc.wait(30)
        shapes[name] = {row_shape(r) for r in rows}
    assert shapes["nbwith"] == shapes["nbwithout"]
