"""A partition's transaction commits while the worker's loop goes on (kafka/loop.py): its outcome is taken before
anything else uses the partition's state. On a real broker (Tansu and Apache Kafka), with the loop in this process."""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import account, collect, setup_stream, synthetic_fares, wait_for  # noqa: E402

from stream_anon.audit.kafka_source import audit_from_kafka  # noqa: E402
from stream_anon.worker.core import WorkerCore  # noqa: E402
from stream_anon.kafka.loop import KafkaLoop  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.supervise import OutputReader  # noqa: E402

N = 3000
FAILING_COMMIT = 3          # the partition's transaction whose commit fails (a normal batch's)
HELD_S = 0.5                # how long that commit is under way first: the loop consumes and processes meanwhile


def test_a_commit_failing_in_flight_is_taken_before_the_partition_goes_on_and_nothing_is_lost_or_repeated(
        broker, tmp_path, secret_env):
    """The third transaction of the first partition to reach it fails after half a second in flight (an abortable
    error: the coordinator is not available). Meanwhile the loop consumes that partition's next batch: it must not
    process it on the state the failed transaction held (no batch is processed while its partition has a
    transaction in flight), the partition is recovered from Kafka and its input consumed again, and the stream
    ends with every event published or suppressed once, no release id with two contents, the audit passing."""
    name = "inflight"
    path, cfg = setup_stream(tmp_path, broker.bootstrap, name)
    events = synthetic_fares(N, seed=23)
    replay(broker.bootstrap, cfg.stream.input_topic, events, "journey_id", progress=False)

    core = WorkerCore(cfg, "inflight-app", secret_env, flush_when_idle_s=1.0)
    loop = KafkaLoop(core, {"bootstrap.servers": broker.bootstrap}, batch_max=200, cache_dir=tmp_path / "cache",
                     session_timeout_s=2.0)
    commits, failed = Counter(), []
    end = loop._end_transaction

    def end_or_fail(prod, offsets, group):
        p = offsets[0].partition
        commits[p] += 1
        if not failed and commits[p] == FAILING_COMMIT:
            failed.extend((p, offsets[0].offset))       # the partition, the input offset after the batch
            time.sleep(HELD_S)
            raise KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "injected by the test"))
        return end(prod, offsets, group)

    processed_in_flight, processed_after_failure = [], []
    process = core.process

    def process_watched(ps, msgs):
        if ps.partition in loop.in_flight:
            processed_in_flight.append(ps.partition)
        if failed and ps.partition == failed[0]:
            processed_after_failure.append(msgs[0][0])
        return process(ps, msgs)

    loop._end_transaction, core.process = end_or_fail, process_watched
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    reader = OutputReader(broker.bootstrap, name)
    try:
        def accounted():
            reader.poll(300)
            acc = reader.accounting()
            return acc["accounted"] >= N and acc["deferred"] == 0
        wait_for(accounted, 120, f"{N} events accounted", explain=lambda: (reader.accounting(), loop.counters))
    finally:
        reader.close()
        loop.stop()
        thread.join(60)
    assert loop.error is None, loop.error
    assert failed and loop.counters["aborted"] == 1 and not loop.halted, (failed, loop.counters, loop.halted)
    assert processed_in_flight == [], "a batch processed while its partition's transaction was in flight"
    # the partition went on from its committed input: its first batch after the failure is (part of) the failed
    # transaction's input, consumed again
    assert processed_after_failure and processed_after_failure[0] < failed[1], (processed_after_failure, failed)

    manifests, _, records, dead = collect(broker.bootstrap, name)    # asserts one content per release id
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) + len(dead) == N
    report = audit_from_kafka(broker.bootstrap, path, secret_env, idle_s=1.0)
    assert report.passed, report.format_text()
