"""Zombies fenced by the broker (issue 40), on Apache Kafka: worker A, inside a transaction (its output and state
records sent, not committed), is stopped with SIGSTOP for longer than its session timeout and its transaction
timeout (``stream_anon.kafka.transactions.TXN_TIMEOUT_S``). Worker B takes its partitions; B's recovery fences A's
producers. A resumes: its commit is refused, it rejoins the group and recovers what it is given from the state
topic. What A sent and never committed is on the log, and no read_committed reader sees it: the read_uncommitted
view of the output topics holds records the read_committed view does not, the audit (read_committed) passes and
counts every event once, and no release id has two contents.

Apache Kafka only: Tansu 0.6 shows aborted records to read_committed readers and never expires a dead producer's
transaction (docs/brokers.md)."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import release_contents, wait_accounted, wait_while_running  # noqa: E402
from _netns import assigned_after  # noqa: E402
from _worker_harness import harness_entry  # noqa: E402

from stream_anon import contract  # noqa: E402
from stream_anon.audit.kafka_source import audit_from_kafka  # noqa: E402
from stream_anon.config import load_config  # noqa: E402
from stream_anon.datasets import oyster_cards  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.worker.state import state_topic  # noqa: E402
from stream_anon.kafka.supervise import start_worker_process, stop_worker_process  # noqa: E402
from stream_anon.kafka.topics import ensure_topics  # noqa: E402
from stream_anon.kafka.transactions import TXN_TIMEOUT_S  # noqa: E402

pytestmark = pytest.mark.kafka

PARTITIONS, N_EVENTS, SESSION_S = 4, 3000, 2.0
STOPPED_S = TXN_TIMEOUT_S + 5       # past the session timeout and the transaction timeout


def _read(bootstrap: str, topic: str, committed: bool) -> dict[tuple, bytes]:
    """(partition, offset) -> value of every record of ``topic``, read committed or uncommitted (the test's own
    reader: the project's readers are all read_committed)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest",
                      isolation_level="read_committed" if committed else "read_uncommitted")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or {0})]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out, quiet = {}, time.monotonic()
        while time.monotonic() - quiet < 2.0:
            for recs in c.poll(timeout_ms=300).values():
                for r in recs:
                    out[(r.partition, r.offset)] = r.value
                    quiet = time.monotonic()
        return out
    finally:
        c.close()


def test_a_worker_stopped_past_its_timeouts_is_fenced_and_nothing_it_wrote_after_is_read(
        apache_kafka, tmp_path, secret_env):
    apache_kafka.reset()
    bootstrap = apache_kafka.bootstrap
    events = oyster_cards.read_events()[:N_EVENTS]
    half = N_EVENTS // 2
    cfg_path = contract.config_path("oyster-cards")
    cfg = load_config(cfg_path)
    t = contract.topics()
    records_topic = t.records(cfg.stream.name)
    ensure_topics(bootstrap, names=[cfg.stream.input_topic, records_topic, t.releases, t.deadletter, t.metrics,
                                    t.aggregates])
    app_id, extra = "zombie-app", ["--batch-max", "100", "--batch-within", "0.1", "--session-timeout", str(SESSION_S)]
    hold, logs = tmp_path / "hold-a", {n: tmp_path / f"worker-{n}.log" for n in ("a", "b")}
    hold.write_text("")

    def start(name, entry):
        return start_worker_process(cfg_path, bootstrap, tmp_path / f"state-{name}", app_id, 2.0, logs[name],
                                    extra=extra, entry=entry)

    b = start("b", harness_entry({}))
    a = None
    fig: dict = {}
    try:
        wait_while_running(lambda: any(len(x) == PARTITIONS for x in assigned_after(logs["b"], 0)), 120,
                           "worker B to own every partition", (b,))
        b_mark = logs["b"].stat().st_size
        a = start("a", harness_entry({}, hold))
        wait_while_running(lambda: any(assigned_after(logs["a"], 0)) and any(assigned_after(logs["b"], b_mark)), 120,
                           "the group to split the partitions between A and B", (a, b))
        replay(bootstrap, cfg.stream.input_topic, events[:half], cfg.stream.privacy_unit, progress=False)
        wait_while_running(lambda: Path(str(hold) + ".held").exists(), 120, "worker A inside a transaction", (a, b))
        fig["a_partitions_before"] = assigned_after(logs["a"], 0)[-1]
        # every transaction writes its partition's state record (output records only when a window closes)
        uncommitted_before = _read(bootstrap, state_topic(app_id), committed=False)

        os.killpg(a.pid, signal.SIGSTOP)            # A and its DP child: nothing of A runs, its sockets stay open
        t_stop = time.monotonic()
        hold.unlink()                               # resumed, A goes on to commit the transaction it holds
        b_mark = logs["b"].stat().st_size
        fig["takeover_s"] = round(wait_while_running(
            lambda: any(len(x) == PARTITIONS for x in assigned_after(logs["b"], b_mark)), 60,
            "worker B to take every partition", (b,)), 1)
        time.sleep(max(0.0, STOPPED_S - (time.monotonic() - t_stop)))
        a_mark = logs["a"].stat().st_size
        os.killpg(a.pid, signal.SIGCONT)
        fig["stopped_s"] = round(time.monotonic() - t_stop, 1)
        fig["a_rejoin_s"] = round(wait_while_running(lambda: any(assigned_after(logs["a"], a_mark)), 120,
                                                     "worker A to rejoin with partitions", (a, b)), 1)
        replay(bootstrap, cfg.stream.input_topic, events[half:], cfg.stream.privacy_unit, progress=False)
        fig["accounting"] = wait_accounted(bootstrap, cfg.stream.name, N_EVENTS, 180, (a, b))
        fig["exits"] = (a.poll(), b.poll())
    finally:
        for p in (a, b):
            if p is not None:
                os.killpg(p.pid, signal.SIGCONT) if p.poll() is None else None
                stop_worker_process(p)
        hold.unlink(missing_ok=True)
    text = {n: path.read_text(errors="replace") for n, path in logs.items()}

    report = audit_from_kafka(bootstrap, cfg_path, secret_env, idle_s=1.5)
    contents = release_contents(bootstrap)
    looked_at = (records_topic, t.releases, state_topic(app_id))
    committed = {topic: _read(bootstrap, topic, committed=True) for topic in looked_at}
    uncommitted = {topic: _read(bootstrap, topic, committed=False) for topic in looked_at}

    assert fig["exits"] == (None, None), fig                      # neither worker died
    assert fig["takeover_s"] < 30 and fig["a_partitions_before"], fig
    after_resume = text["a"][a_mark:]
    assert "producer fenced" in after_resume, after_resume[-3000:]     # its commit refused by the broker
    assert "HALTED" not in text["a"] + text["b"]
    # what A sent inside the held transaction (before the stop) is on the log and hidden from read_committed
    held = set(uncommitted_before) - set(committed[state_topic(app_id)])
    assert held, "the held transaction's state record is missing from the read_uncommitted view"
    assert held <= set(uncommitted[state_topic(app_id)])
    for topic in looked_at:
        assert set(committed[topic]) <= set(uncommitted[topic])
    # read_committed: every event once, no release id with two contents
    assert contents and all(len(c) == 1 for c in contents.values()), "a release id with two contents"
    assert fig["accounting"]["accounted"] == N_EVENTS, fig
    assert report.passed, report.format_text()
    s = report.summary
    assert s["events_in"] == N_EVENTS == s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"]
    print(f"zombie figures: {fig}; aborted records: "
          f"{ {topic: len(uncommitted[topic]) - len(committed[topic]) for topic in looked_at} }")
