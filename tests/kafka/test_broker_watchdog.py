"""The worker's broker watchdog (issue 10, outages reported by us): a broker that stops answering (SIGSTOP gives no
transport error, only silence) is reported once when lost and once when back, and the idle flush then waits for
quiet time confirmed by the answering broker. In-process: a stub admin client stands for the broker."""
from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path

from stream_anon.config import load_config
from stream_anon.kafka import watchdog as watchdog_module
from stream_anon.worker.core import WorkerCore
from stream_anon.kafka.loop import KafkaLoop

OYSTER = Path(__file__).resolve().parents[2] / "configs" / "oyster.toml"
SECRET = b"watchdog-secret-6f1d0c9a8b7e2d4c3b5a69788f0e1d2c"


class PausableBroker:
    """An admin client whose metadata requests go unanswered while ``paused`` is set."""

    paused = threading.Event()
    calls = 0

    def __init__(self, conf):
        pass

    def list_topics(self, topic=None, timeout=None):
        type(self).calls += 1
        if self.paused.is_set():
            time.sleep(min(timeout, 0.02))
            raise watchdog_module.KafkaException("Local: Timed out")
        return object()


def test_one_warning_when_the_broker_stops_answering_and_one_when_it_is_back(monkeypatch, caplog):
    monkeypatch.setattr(watchdog_module, "AdminClient", PausableBroker)
    core = WorkerCore(load_config(OYSTER), "watchdog", SECRET, flush_when_idle_s=1.0)
    loop = KafkaLoop(core, {"bootstrap.servers": "localhost:9"})
    loop.watch.probe_interval_s, loop.watch.probe_timeout_s = 0.01, 0.02
    caplog.set_level(logging.WARNING, logger="stream_anon.worker")
    watchdog = threading.Thread(target=loop.watch.run, daemon=True)
    watchdog.start()

    def wait_for(pred):
        deadline = time.monotonic() + 5
        while not pred() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pred()
    try:
        wait_for(lambda: loop.watch.answered_at > -math.inf)
        PausableBroker.paused.set()
        wait_for(lambda: not loop.watch.connected)
        n = PausableBroker.calls
        wait_for(lambda: PausableBroker.calls > n + 10)        # many unanswered probes: still one warning
        assert loop.counters["broker_lost"] == 1
        paused_at = time.monotonic()
        PausableBroker.paused.clear()
        wait_for(lambda: loop.watch.connected and loop.watch.answered_at > paused_at)
        assert loop.watch.outage_ended_at >= paused_at             # the idle clock restarts at the end of the outage
    finally:
        loop.stop()
        PausableBroker.paused.clear()
        watchdog.join(5)
    warnings = [r.getMessage() for r in caplog.records if r.name == "stream_anon.worker"]
    assert [w.split(" (")[0] for w in warnings] == ["broker connection lost", "broker connection restored"]


def test_a_probe_asked_for_goes_out_at_its_time_not_at_the_next_interval(monkeypatch):
    """The idle flush needs an answer to a probe sent once the partitions' quiet time is up: the loop asks for one
    then (``probe_by``), and it goes out at that time, not up to an interval later; a time already covered by a
    sent probe asks for nothing."""
    monkeypatch.setattr(watchdog_module, "AdminClient", PausableBroker)
    core = WorkerCore(load_config(OYSTER), "watchdog", SECRET, flush_when_idle_s=1.0)
    loop = KafkaLoop(core, {"bootstrap.servers": "localhost:9"})
    loop.watch.probe_interval_s = 60.0                 # no probe of the regular cadence during the test
    watchdog = threading.Thread(target=loop.watch.run, daemon=True)
    watchdog.start()
    try:
        time.sleep(0.2)
        n, asked = PausableBroker.calls, time.monotonic() + 0.3
        loop.watch.probe_by(asked)
        time.sleep(0.2)
        assert PausableBroker.calls == n                 # not before its time
        deadline = time.monotonic() + 2
        while loop.watch.answered_at < asked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asked <= loop.watch.answered_at < asked + 0.5 and PausableBroker.calls == n + 1
        loop.watch.probe_by(asked)                       # already answered by a later probe: nothing asked
        time.sleep(0.3)
        assert PausableBroker.calls == n + 1 and loop.watch.asked_at == math.inf
    finally:
        loop.stop()
        watchdog.join(5)


def test_idle_due_at_is_when_the_last_input_is_flush_when_idle_s_old():
    core = WorkerCore(load_config(OYSTER), "watchdog", SECRET, flush_when_idle_s=2.0)
    assert core.idle_due_at() == math.inf               # no partition: nothing to flush
    ps = core.open_partition(0)
    ps.last_input = 100.0
    assert core.idle_due_at() == math.inf               # nothing buffered since the last flush
    ps.dirty_since_flush = True
    assert core.idle_due_at() == 102.0 and core.idle_due_at(not_before=105.0) == 107.0
    assert core.idle_partitions(answered_at=101.9) == [] and core.idle_partitions(answered_at=102.0) == [ps]


def test_the_loop_waits_for_input_until_the_idle_flush_may_follow_not_a_whole_batch_wait():
    """consume()'s wait is cut to the idle flush's due time (plus the probe's sending and answer), and while the
    probe asked for is under way or was just answered the loop looks again every ANSWER_POLL_S; with no flush
    pending, the broker lost, or no probe since the due time for a whole batch wait, that wait applies (a partition
    that stays unflushed, e.g. halted, makes no busy loop)."""
    watch = watchdog_module.BrokerWatch({"bootstrap.servers": "localhost:9"}, "raw.fare", threading.Event(),
                                        {"broker_lost": 0})
    poll, ask = watchdog_module.ANSWER_POLL_S, watchdog_module.ASKED_WITHIN_S
    assert watch.input_wait(math.inf, 0.5) == 0.5
    due = time.monotonic() + 0.2
    assert 0.2 - 0.05 < watch.input_wait(due, 0.5) <= 0.2 + ask + poll
    assert watch.input_wait(time.monotonic() + 5, 0.5) == 0.5
    past = time.monotonic() - 0.01
    watch.probe_by(past)                                  # asked for, not sent yet
    assert watch.input_wait(past, 0.5) == poll
    watch.asked_at, watch.sent_at = math.inf, past + 0.001    # sent, not answered yet
    assert watch.input_wait(past, 0.5) == poll
    watch.answered_at = watch.sent_at                     # just answered: the flush follows in the next step
    assert watch.input_wait(past, 0.5) == poll
    watch.sent_at = watch.answered_at = time.monotonic() - 0.6     # answered a batch wait ago, nothing flushed
    assert watch.input_wait(past, 0.5) == 0.5
    watch.sent_at = watch.answered_at = past - 1          # no probe since the due time, none asked for
    assert watch.input_wait(past, 0.5) == 0.5
    watch.answered_at = -math.inf
    watch.connected = False                               # lost: the flush waits for the broker
    assert watch.input_wait(past, 0.5) == 0.5
