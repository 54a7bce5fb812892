"""The worker's Kafka path: consume a batch, process it, and write its output, the partition's new state and the
consumer offsets in ONE Kafka transaction per partition batch (read-process-write exactly-once).

One thread runs the whole loop with confluent-kafka (librdkafka fetches and sends in its own threads, without the
GIL): ``consume()`` a batch of up to ``batch_max`` messages, ``WorkerCore.process`` of each partition of the batch,
then per partition ``WorkerCore.complete`` (the DP rows, when a second process releases the aggregates:
aggregates_process.py; a batch whose rows are under way is held and joined with the partition's next batches, up
to ``JOINED_BATCHES_MAX``, in one transaction: transactions.py ``HeldBatches``) -> begin transaction -> produce
the output -> produce the state record (state.py; in parts when long) -> ``send_offsets_to_transaction`` (input
offset + the state marker) -> commit. Each partition has its own transactional producer (kafka/transactions.py); a
partition's commit runs in a thread while the loop goes on (the next consume, the other partitions), and its
outcome is taken before anything else uses that partition's state: before its next batch is processed, before a
flush, before a rebalance moves it, and at the end. A partition has at most one transaction in flight. Group membership and rebalancing are the consumer's; partition assignment
happens inside ``consume()`` (the transactions in flight are settled first), and recovers each new partition's state
from the state topic (state.py).

Failures:
- a transaction that fails is aborted and the partition is recovered again from Kafka (its in-memory state may
  be ahead of what was committed); a fenced producer means another worker owns the partition: it is dropped;
- a partition whose state is not what it should be (state.py ``HALT_*``) is paused with an alert (log, metric,
  ``/readyz``) until an operator decides (``--accept-input-reset`` after a re-created input topic);
- the idle flush (end of a replay) is made deterministic: the decision to flush is committed first (a state
  record with ``flush_pending``), then the flush's output; a worker that dies in between re-does the same flush,
  so a release id is never published with two contents;
- losing the broker is reported once (WARNING) when it happens and once when it is back; librdkafka's own log
  lines are rate-limited;
- a fatal client error outside the partitions' transactions (the lineage producer's, after a broker reset) ends the
  loop: the app states it in one line and exits 70, and the restarted worker recovers or halts the partitions.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicCollection, \
    TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from stream_anon.worker import state as st
from stream_anon.worker.core import WorkerCore
from stream_anon.kafka.lineage import StreamLineage
from stream_anon.kafka.observe import MetricSender, throughput_metric
from stream_anon.worker.partition import ConfigChangeRefused, KeyRotationRefused, PartitionState
from stream_anon.kafka.retention import RetentionCheck, guard_raw_retention
from stream_anon.kafka.state_cache import CommittedCache, read_state_logs
from stream_anon.connection import REPLICATION_FACTOR
from stream_anon.kafka.transactions import TXN_TIMEOUT_S, CommitThreads, Held, HeldBatches, InFlight, \
    OpenTransaction, abort_or_fenced, fence_and_barrier, flush_leaving, joined, transactional_producer
from stream_anon.kafka.watchdog import BrokerWatch

log = logging.getLogger("stream_anon.worker")
client_log = logging.getLogger("stream_anon.kafka.client")

_UNSET = -1001                         # librdkafka's OFFSET_INVALID (no committed offset)
# Compression of the transaction's batches (output, state records). lz4: the worker's CPU per event fell 8-20% in
# paired end-to-end runs (fewer bytes through the broker), and every client reads it (kafka-python with the
# ``lz4`` package, a dependency). gzip: smaller, more CPU. No snappy/zstd: kafka-python would need other packages.
COMPRESSIONS = ("lz4", "gzip", "none")
DEFAULT_COMPRESSION = "lz4"


class RateLimited(logging.Filter):
    """At most one record per ``every_s`` seconds per message text (librdkafka repeats itself during outages)."""

    def __init__(self, every_s: float = 30.0):
        super().__init__()
        self.every_s = every_s
        self.last: dict[str, float] = {}      # message text -> when one was let through

    def filter(self, record: logging.LogRecord) -> bool:
        key = record.getMessage()[:80]
        now = time.monotonic()
        if now - self.last.get(key, -1e18) < self.every_s:
            return False
        self.last[key] = now
        return True


client_log.addFilter(RateLimited())


SESSION_TIMEOUT_S = 6.0      # Apache Kafka's smallest by default (group.min.session.timeout.ms)


def group_timeouts(session_timeout_s: float) -> dict:
    """The consumer's session and heartbeat settings: a worker whose heartbeats stop for ``session_timeout_s``
    loses its partitions to the group; a heartbeat every sixth of it (1 s at the default). A broker may hold a
    join for part of the session timeout (Tansu: half of it): every start and rebalance waits that long."""
    ms = int(round(float(session_timeout_s) * 1000))
    if not 1000 <= ms <= 300_000:
        raise ValueError(f"session timeout {session_timeout_s!r} s: between 1 and 300")
    return {"session.timeout.ms": ms, "heartbeat.interval.ms": max(100, ms // 6)}


def input_consumer_config(client_config: dict, app_id: str, timeouts: dict, on_error) -> dict:
    """The worker's input consumer: the app id's group, offsets committed only in the transactions, committed
    records only, eager range assignment (a rebalance revokes every partition first)."""
    return {**client_config, "group.id": app_id, "enable.auto.commit": False, "isolation.level": "read_committed",
            "auto.offset.reset": "earliest", **timeouts, "max.poll.interval.ms": 300000,
            "partition.assignment.strategy": "range", "fetch.max.bytes": 52428800, "error_cb": on_error,
            "logger": client_log}


# consumer errors no retry mends: the worker's settings do not fit the broker's. The loop ends on them (exit 70,
# the cause named: fail closed) instead of retrying for ever. INVALID_SESSION_TIMEOUT: --session-timeout outside
# the broker's group.min.session.timeout.ms .. group.max.session.timeout.ms
REFUSED_SETTINGS = {KafkaError.INVALID_SESSION_TIMEOUT:
                    "--session-timeout is outside the broker's group.min.session.timeout.ms .. "
                    "group.max.session.timeout.ms (Apache Kafka: 6 s .. 30 min by default)"}


def by_partition(msgs, parts, halted) -> dict[int, list | None]:
    """A consumed batch as ``(offset, value)`` per partition, in order; None for a partition that is halted or
    not (or no longer) this worker's (its messages are dropped: it is sought again when it resumes). A consumer
    error of :data:`REFUSED_SETTINGS` is raised (the loop ends on it)."""
    out: dict[int, list | None] = {}
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() in REFUSED_SETTINGS:
                raise KafkaException(err)
            if err.code() != KafkaError._PARTITION_EOF:
                client_log.warning("consumer: %s", err)
            continue
        p = m.partition()
        if p not in out:
            out[p] = [] if p in parts and p not in halted else None
        batch = out[p]
        if batch is not None:
            batch.append((m.offset(), m.value()))
    return out


def loop_error(exc) -> BaseException:
    """What ended the loop, as an exception. A Kafka client's error is stated in one line (the app's, on exit);
    anything else is a bug: its traceback is logged."""
    if isinstance(exc, KafkaError):
        return KafkaException(exc)
    if not isinstance(exc, KafkaException):
        log.error("worker loop failed", exc_info=exc)
    return exc


def end_offsets(consumer: Consumer, topic: str, partitions) -> dict[int, int | None]:
    """Each partition's end offset as the consumer last saw it (None: not known)."""
    out = {}
    for p in partitions:
        try:
            hi = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
            out[p] = hi if hi >= 0 else None
        except KafkaException:
            out[p] = None
    return out


def unread_input(consumer: Consumer, topic: str, parts: dict, partitions: list[int]) -> set[int]:
    """The ``partitions`` whose input is not all read: their position (or, before any message since the
    assignment, the offset after their state's) is below the broker's end offset, or the end is not known. An idle
    flush of such a partition would close its windows, and release its DP schedule to the worker's clock, before
    that input (a partition just taken over from another worker with a backlog)."""
    if not partitions:
        return set()
    waiting = set()
    positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in partitions])}
    for p in partitions:
        try:
            end = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1]
        except KafkaException:
            waiting.add(p)
            continue
        at = max(positions.get(p, -1), parts[p].offset + 1)
        if end < 0 or at < end:
            waiting.add(p)
    return waiting


# the loop's counters (/metrics and the throughput metric on anon.metrics)
COUNTERS = ("transactions", "aborted", "recoveries", "halts", "broker_lost", "state_bytes", "full_state_records",
            "lineages_started", "config_changes_accepted", "keys_rotated")
CONFIG_CHANGE_ACCEPTED, KEY_ROTATED = "config_change_accepted", "key_rotated"     # alerts of an operator's step


def resume_partition(core: WorkerCore, p: int, rec: st.Recovery, counters: dict | None = None, raise_alert=None
                     ) -> PartitionState | None:
    """The partition's pipeline from the chosen state, or None with ``rec.halt`` set. An accepted change or key
    rotation the state cannot carry halts it too. Each changed guarantee setting is logged (ERROR when the partition
    halts, WARNING when it resumes under the change the operator accepted). The outcome is logged; a partition
    resumed under an accepted change or a rotated key is counted (``counters``) and raises the alert
    ``config_change_accepted`` or ``key_rotated`` (``raise_alert(name, partition, **fields)``): someone should confirm the step was meant."""
    ps = None
    try:
        if not rec.halt:
            ps = core.open_partition(p, rec.doc, rec.tables, rec.base_seq, accepted_changes=rec.changes,
                                     lineage=rec.lineage, notes=rec.notes, rotated_from=rec.rotated_from)
    except ConfigChangeRefused as exc:
        rec.halt, rec.detail = st.HALT_CONFIG_CHANGE_REFUSED, str(exc)
    except KeyRotationRefused as exc:
        rec.halt, rec.detail = st.HALT_KEY_ROTATION_REFUSED, f"key {rec.rotated_from} -> {core.kid}: {exc}"
    for change in rec.changes:
        log.log(logging.ERROR if rec.halt else logging.WARNING, "config changed on partition %s: %s%s", p, change,
                "" if rec.halt else " (accepted by the operator)")
    if rec.halt:
        return None
    assert ps is not None              # opened: a refusal to open sets rec.halt
    if rec.rotated_from:
        log.warning("partition %s: key rotated from key id %s to %s (accepted by the operator: --rotate-key)", p,
                    rec.rotated_from, core.kid)
    steps: list[tuple[str, str, dict[str, Any]]] = []
    if rec.changes:
        steps.append((CONFIG_CHANGE_ACCEPTED, "config_changes_accepted", {"changes": rec.changes}))
    if rec.rotated_from:
        steps.append((KEY_ROTATED, "keys_rotated", {"from": rec.rotated_from, "to": core.kid}))
    for alert, counter, fields in steps:
        if counters is not None:
            counters[counter] = counters.get(counter, 0) + 1
        if raise_alert is not None:
            raise_alert(alert, p, **fields)
    if rec.adopted_reset:
        log.warning("partition %s: input topic re-created; accepted by the operator: resuming its state from offset "
                    "0 of the new topic", p)
    log.info("partition %s: %s", p, f"resumed at state transaction {ps.seq}, input offset {ps.offset}" if rec.doc
             else f"no history: new state in lineage {ps.lineage}")
    return ps


def _made(consumer: Consumer | None) -> Consumer:
    """The loop's input consumer, made by KafkaLoop._setup before any step, rebalance callback or commit: the loop
    uses it only then (its _shutdown checks for None itself)."""
    assert consumer is not None, "the loop's consumer is used before _setup"
    return consumer


def input_topic_id(admin: AdminClient, topic: str) -> str | None:
    """The topic's id (None on a broker without topic ids: the cache and offsets checks remain)."""
    try:
        desc = admin.describe_topics(TopicCollection([topic]))[topic].result(30)
        return str(desc.topic_id) if desc.topic_id is not None else None
    except Exception:          # noqa: BLE001
        return None


def prepare_topics(admin: AdminClient, core: WorkerCore, state_topic: str, part_bytes: int) -> None:
    """Before consuming: the input topic exists, the state topic has one partition per input partition, and the
    core checks that each event arrives on its unit's partition of the input topic's (stream_anon.worker.placement)."""
    md = admin.list_topics(timeout=30)
    if core.topic not in md.topics:
        raise RuntimeError(f"input topic {core.topic} does not exist (create it with `stream-anon topics apply`)")
    n = len(md.topics[core.topic].partitions)
    core.check_placement(n)
    ensure_state_topic(admin, state_topic, n, exists=state_topic in md.topics, part_bytes=part_bytes)


def ensure_state_topic(admin: AdminClient, topic: str, partitions: int, exists: bool,
                       part_bytes: int = st.PART_MAX_BYTES) -> None:
    """Create the state topic (compacted, ``max.message.bytes`` = ``state.MESSAGE_MAX_BYTES``), or refuse an
    existing one that cannot take the worker's values of at most ``part_bytes`` (:func:`state.topic_limit_problem`;
    a broker that does not describe it is taken at its word)."""
    if not exists:
        new = NewTopic(topic, partitions, REPLICATION_FACTOR, config=st.STATE_TOPIC_CONFIG)
        for f in admin.create_topics([new]).values():
            try:
                f.result(30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        return
    try:
        found = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
        configs = {name: c.value for f in found.values() for name, c in f.result(30).items()}
    except KafkaException:
        return
    problem = st.topic_limit_problem(configs, part_bytes)
    if problem:
        raise RuntimeError(f"state topic {topic}: {problem}")


class KafkaLoop:
    """The batch loop of one worker (see the module docstring); ``run()`` is the thread's target."""

    def __init__(self, core: WorkerCore, client_config: dict, batch_max: int = 10000, batch_within_s: float = 0.5,
                 metrics_interval_s: float = 5.0, accept_input_reset: bool = False, cache_dir=None,
                 compression: str = DEFAULT_COMPRESSION, accept_config_change: bool = False, new_lineage: bool = False,
                 rotate_from: str | None = None, state_part_bytes: int = st.PART_MAX_BYTES,
                 session_timeout_s: float = SESSION_TIMEOUT_S):
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r}: one of {', '.join(COMPRESSIONS)}")
        self.state_part_bytes = st.checked_part_bytes(state_part_bytes)
        self.group_timeouts = group_timeouts(session_timeout_s)
        self.core, self.compression, self.cfg = core, compression, dict(client_config)
        self.batch_max, self.batch_within_s = int(batch_max), float(batch_within_s)
        self.metrics_interval_s = float(metrics_interval_s)
        # operator decisions (--accept-input-reset, --accept-config-change, --rotate-key: the previous key id)
        self.accept_input_reset, self.accept_config_change, self.rotate_from = (accept_input_reset,
                                                                               accept_config_change, rotate_from)
        self.input, self.state_topic = core.topic, st.state_topic(core.app_id)
        self.producers: dict[int, Producer] = {}
        self.halted: dict[int, dict] = {}                 # partition -> {"reason", "detail", "since"}
        self.assigned: set[int] = set()
        self.ready = False                               # assigned partitions recovered (readiness)
        self.stopping, self.stopped = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.retention: RetentionCheck | None = None      # the raw topic's retention against the declared one
        # broker liveness: a stopped broker gives no transport error, only silence (a watchdog thread probes it)
        self.watch = BrokerWatch(self.cfg, self.input, self.stopping, self.counters)
        self.cache = CommittedCache(cache_dir, core.app_id, core.stream)
        self.lineage = StreamLineage(self.cfg, core.app_id, core.stream, self.cache, new_lineage)
        self._consumer: Consumer | None = None
        self.metrics = MetricSender(core.stream, core.stats.note_alert)
        self.commits = CommitThreads()                   # the partitions' transactions commit side by side
        self.in_flight = InFlight(self.commits)           # their commits not yet taken (one per partition at most)
        self.held = HeldBatches()                         # batches awaiting their DP rows, joined with the next
        self._last_metric = 0.0
        self.highwater: dict[int, int] = {}               # partition -> end offset last seen

    # ---- lifecycle --------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            self._setup()
            threading.Thread(target=self.watch.run, name="broker-watchdog", daemon=True).start()
            while not self.stopping.is_set():
                self.lineage.topic.raise_fatal()
                self._step()
        except BaseException as exc:       # the app reports it and exits non-zero (70); nothing was committed
            self.error = loop_error(exc)
        except:  # noqa: E722 - confluent-kafka raises a client's fatal error without error_cb as a KafkaError object
            self.error = loop_error(sys.exc_info()[1])
        finally:
            try:
                if self.error is not None:
                    self.held.clear()           # not committed after a failure: the next owner processes them
                self._settle_in_flight(self._unsettled(), leaving=True)   # commits as any other
            except Exception:  # noqa: BLE001 - reported; the consumer and producers are closed all the same
                log.exception("settling the transactions in flight failed")
            self._shutdown()
            self.stopped.set()

    def _setup(self) -> None:
        admin = AdminClient({**self.cfg, "logger": client_log})  # type: ignore[dict-item]  # hint omits logger
        prepare_topics(admin, self.core, self.state_topic, self.state_part_bytes)
        self.lineage.topic.ensure(admin)
        self._admin = admin
        self.metrics.start(self.cfg, self.compression)
        self.retention = guard_raw_retention(admin, self.input, self.core.config.stream, self.metrics.alert)
        self._consumer = Consumer(input_consumer_config(self.cfg, self.core.app_id, self.group_timeouts,
                                                        self.watch.on_error))
        self._consumer.subscribe([self.input], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)

    def _shutdown(self) -> None:
        # nothing is in flight any more: every transaction was committed or aborted
        try:
            if self._consumer is not None:
                self._consumer.close()          # leaves the group: the partitions move at once
        except Exception:  # pragma: no cover - best effort on the way out
            log.debug("consumer close failed", exc_info=True)
        self.commits.shutdown()
        for p, prod in self.producers.items():
            flush_leaving(prod, p, "on the way out", 5.0)
        self.metrics.close()
        self.core.close()

    # ---- one step ---------------------------------------------------------------------------------------------
    def _step(self) -> None:
        wait = self.watch.input_wait(self.core.idle_due_at(not_before=self.watch.outage_ended_at), self.batch_within_s)
        # held batches do not wait for input: what is at hand, then their transactions
        msgs = _made(self._consumer).consume(num_messages=self.batch_max, timeout=0 if self.held else wait)
        arrived = time.time()
        by_part = by_partition(msgs, self.core.parts, self.halted)
        # every partition's batch first, then their transactions: with the DP aggregates in their own process
        # (aggregates_process.py), a partition's aggregates are released there while the next one's engine runs
        # here, and a batch whose rows are under way is held for its partition's next batch (HeldBatches). A batch
        # is processed on top of its partition's held ones, or once its transaction in flight committed (the state
        # it builds on and fails back to); a partition whose did not is recovered and sought back.
        done = []
        for p, batch in by_part.items():
            held = self.held.take(p)
            if batch is not None and (held is not None or self._settle_in_flight([p])[p]) and p in self.core.parts:
                ps = self.core.parts[p]
                done.append(joined(held, ps, batch, self.core.process(ps, batch), arrived))
            elif held is not None:
                self._start_output(held)
        self._settle_in_flight([p for p in self.in_flight.partitions() if by_part.get(p) is None])
        for held in self.held.take_all():        # held at the last step: their releases ran meanwhile
            self._start_output(held)
        for h in done:
            if (give := self.held.hold_or_give(h)) is not None:
                self._start_output(give)
        # Idle means the stream is quiet, not that the broker is: the partitions must have been without input since
        # a broker that was answering (a probe sent at least flush_when_idle_s after the last input and after the
        # end of the last outage answered); a flush during a broker pause would make the pause's backlog late.
        self.watch.probe_by(self.core.idle_due_at(not_before=self.watch.outage_ended_at))
        idle = self.core.idle_partitions(answered_at=self.watch.answered_at, not_before=self.watch.outage_ended_at)
        waiting = unread_input(_made(self._consumer), self.input, self.core.parts,
                               [ps.partition for ps in idle if ps.partition not in self.halted])
        for ps in idle:
            if ps.partition not in self.halted and ps.partition not in waiting:
                self._flush(ps)
        if (now := time.monotonic()) - self._last_metric >= self.metrics_interval_s:
            self._last_metric = now
            self._publish_metrics()

    # ---- transactions -----------------------------------------------------------------------------------------
    def _commit(self, ps: PartitionState, messages: list, offset: int, flush_pending: bool = False) -> bool:
        """Output, state and offsets of one partition batch in one transaction, waited for (none of the partition's
        may be in flight). False: not committed (see :meth:`_failed`)."""
        txn = self._start_commit(ps, messages, offset, flush_pending)
        return self._outcome(txn, self.commits.settle([txn])[0])

    def _unsettled(self) -> list[int]:
        return [*self.held.partitions(), *self.in_flight.partitions()]

    def _start_output(self, h: Held) -> None:
        """The transaction of held or processed batches (their DP rows waited for), unless the partition moved."""
        if self.core.parts.get(h.ps.partition) is h.ps:
            out = self.core.complete(h.ps, h.out, h.msgs)
            if out.last_offset != h.ps.offset or out.messages:
                self.in_flight.add(self._start_commit(h.ps, out.messages, out.last_offset), out, h.arrived)

    def _settle_in_flight(self, parts: list[int], leaving: bool = False) -> dict[int, bool]:
        """Take the outcome of the transactions of ``parts`` (held batches' transactions started first; a failed
        one: :meth:`_failed`; ``leaving``: the partitions go, one that did not commit is aborted and not
        recovered): per partition, True when it committed or had none."""
        for p in parts:
            if (held := self.held.take(p)) is not None:
                self._start_output(held)
        outcome = dict.fromkeys(parts, True)
        for txn, out, arrived, failure in self.in_flight.take(parts):
            outcome[txn.ps.partition] = self._outcome(txn, failure, leaving)
            if failure is None:
                self.core.stats.note_commit(out.releases, arrived, txn.ended_at)
        return outcome

    def _start_commit(self, ps, messages: list, offset: int, flush_pending: bool = False) -> OpenTransaction:
        """Write a partition batch's transaction (output, state record in parts, tombstones) and start its commit
        (offsets, then commit: it waits for the broker) in a thread of its own; its outcome is taken later."""
        p = ps.partition
        txn = OpenTransaction(ps, self.producers[p], self.core.state_record(ps, ps.seq + 1, offset, flush_pending))
        txn.write(messages, self.state_topic, self.core.stream, self.state_part_bytes)
        offsets = [TopicPartition(self.input, p, offset + 1), TopicPartition(self.state_topic, p, txn.rec.seq)]
        # the group's metadata read here, on the consumer's thread: a commit thread asking the consumer would wait
        # for consume() to return, and a commit inside a rebalance callback (_on_assign's flush) never would
        self.commits.start(txn, self._end_transaction, offsets, _made(self._consumer).consumer_group_metadata())
        return txn

    def _outcome(self, txn: OpenTransaction, failure: KafkaException | None, leaving: bool = False) -> bool:
        if failure is not None:
            self._failed(txn.ps, txn.prod, failure, leaving)
            return False
        txn.ps.note_committed(txn.rec, txn.parts)
        self.counters["transactions"] += 1
        self.counters["full_state_records"] += txn.rec.full
        self.counters["state_bytes"] += len(txn.state_value)
        self.watch.restored()
        self.cache.write(txn.ps)
        return True

    def _end_transaction(self, prod: Producer, offsets: list, group) -> None:
        """Offsets (input position and state marker) into the transaction, then commit it (in a commit thread:
        ``group`` is the consumer's group metadata)."""
        prod.send_offsets_to_transaction(offsets, group, TXN_TIMEOUT_S)
        prod.commit_transaction(TXN_TIMEOUT_S)

    def _failed(self, ps: PartitionState, prod: Producer, exc: KafkaException, leaving: bool = False) -> None:
        err = exc.args[0]
        self.counters["aborted"] += 1
        p = ps.partition
        fenced = abort_or_fenced(prod, err)
        if leaving:            # the partition goes (revoked, lost, the worker stopping): nothing to recover
            log.warning("partition %s: transaction not committed (%s%s) as the partition leaves", p, err,
                        "; fenced" if fenced else "")
            return
        if not fenced and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:   # the batch would fail again
            self._halt(p, st.HALT_MESSAGE_TOO_LARGE, f"a message of the batch after input offset {ps.offset} is over "
                       f"the producer's message.max.bytes ({st.MESSAGE_MAX_BYTES}): {err.str()}")
            _made(self._consumer).pause([TopicPartition(self.input, p)])
            return
        if fenced:
            # another worker initialized this partition's transactional id: it owns the partition now
            log.warning("partition %s: producer fenced (%s): another worker owns it; dropped", p, err)
            self._drop(p)
            return
        log.warning("partition %s: transaction aborted (%s): recovering its state from Kafka", p, err)
        if err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                          KafkaError._MSG_TIMED_OUT):
            self.watch.lost(str(err))
        self._recover_and_seek(p)

    def _flush(self, ps: PartitionState) -> None:
        """Idle flush in two transactions: the decision (state with flush_pending), then its output."""
        if not self._settle_in_flight([ps.partition])[ps.partition] or self.core.parts.get(ps.partition) is not ps:
            return
        if not ps.flush_pending and not self._commit(ps, [], ps.offset, flush_pending=True):
            return
        out = self.core.complete(ps, self.core.flush(ps))
        if self._commit(ps, out.messages, ps.offset, flush_pending=False):
            self.core.stats.note_commit(out.releases)
            log.info("partition %s idle: flushed (%d releases)", ps.partition, out.counts["releases"])

    # ---- assignment and recovery ------------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions) -> None:
        self.ready = False
        self._settle_in_flight(self._unsettled(), leaving=True)    # none after an eager revocation
        mine = [tp.partition for tp in partitions if tp.topic == self.input]
        self.assigned.update(mine)
        starts = recover_partitions(self, mine, consumer, self._admin, self._fence, self._halt)
        positions = [TopicPartition(self.input, p, OFFSET_BEGINNING if start is None else start)
                     for p, start in starts.items()]
        consumer.assign(positions)
        halted = [TopicPartition(self.input, p) for p in self.halted if p in self.assigned]
        if halted:
            consumer.pause(halted)
        # a flush decided before a restart is carried out before any new input
        for p, ps in list(self.core.parts.items()):
            if ps.flush_pending and p not in self.halted:
                self._flush(ps)
        self.ready = True
        log.info("partitions assigned: %s (now %s; halted: %s)", sorted(mine), sorted(self.assigned),
                 sorted(self.halted))
        log.info("ready: %d partition(s) recovered, consuming %s", len(self.assigned) - len(self.halted), self.input)

    def _on_revoke(self, consumer: Consumer, partitions) -> None:
        log.info("partitions revoked: %s", sorted(tp.partition for tp in partitions if tp.topic == self.input))
        self._settle_in_flight([tp.partition for tp in partitions if tp.topic == self.input], leaving=True)
        for tp in partitions:
            if tp.topic == self.input:
                self._drop(tp.partition)
        consumer.unassign()

    def _drop(self, p: int) -> None:
        self.assigned.discard(p)
        self.core.close_partition(p)
        self.halted.pop(p, None)
        prod = self.producers.pop(p, None)
        if prod is not None:
            flush_leaving(prod, p, "as the partition leaves")

    def _recover_and_seek(self, p: int) -> None:
        start = recover_partitions(self, [p], _made(self._consumer), self._admin, self._fence, self._halt)[p]
        if p in self.halted:
            _made(self._consumer).pause([TopicPartition(self.input, p)])
            return
        _made(self._consumer).seek(TopicPartition(self.input, p, OFFSET_BEGINNING if start is None else start))

    def _fence(self, p: int) -> bytes:
        """A new producer of the partition's transactional id, initialized (fencing any other), and the nonce of
        the barrier it committed to the state partition."""
        old = self.producers.pop(p, None)
        if old is not None:     # a producer is initialized once; recovery starts a new one (same id)
            flush_leaving(old, p, "as a new one takes its transactional id")
        prod = self.producers[p] = transactional_producer(self.cfg, self.core.app_id, p, self.compression)
        return fence_and_barrier(prod, self.state_topic, self.core.stream, p)

    def _halt(self, p: int, reason: str, detail: str) -> None:
        self.counters["halts"] += 1
        self.halted[p] = {"reason": reason, "detail": detail, "since": time.time()}
        log.error("partition %s HALTED (%s): %s. It stays paused until an operator decides (docs/operations.md, "
                  "Faults and what the worker does).", p, reason, detail)
        self.metrics.alert("partition_halted", p, reason=reason, detail=detail)

    def _publish_metrics(self) -> None:
        highwaters = end_offsets(_made(self._consumer), self.input, self.core.parts)
        self.highwater = {p: h for p, h in highwaters.items() if h is not None}
        self.metrics.send(throughput_metric(self, highwaters))


def recover_partitions(loop: KafkaLoop, parts: list[int], consumer: Consumer, admin: AdminClient, fence, halt
                       ) -> dict[int, int | None]:
    """Load each partition's state from the state topic; return per partition the input offset to resume from
    (None: the beginning), or halt the partition. The partitions are recovered together: one barrier each,
    one reader for all. ``fence(p)``: a new producer of the partition, fenced (its barrier's nonce); ``halt(p, reason,
    detail)``: halt a partition not resumed."""
    loop.counters["recoveries"] += len(parts)
    logs = read_state_logs(fence, {**loop.cfg, "logger": client_log}, f"{loop.core.app_id}-state-reader",
                           loop.state_topic, parts)
    committed = consumer.committed([TopicPartition(t, p) for p in parts for t in (loop.input, loop.state_topic)],
                                   timeout=30)
    offsets = {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in committed}
    topic_id = input_topic_id(admin, loop.input)
    recs = {p: st.choose_state(logs[p], offsets.get((loop.state_topic, p)), offsets.get((loop.input, p)),
                               loop.cache.read(p), topic_id, loop.accept_input_reset, kid=loop.core.kid,
                               settings=loop.core.settings, accept_config_change=loop.accept_config_change,
                               rotate_from=loop.rotate_from) for p in parts}
    loop.lineage.place(recs, loop.metrics.alert, loop.counters, {p for p in parts if not logs[p].values})
    starts = {}
    for p in parts:
        ps = resume_partition(loop.core, p, recs[p], loop.counters, loop.metrics.alert)
        if ps is None:
            halt(p, cast(str, recs[p].halt), recs[p].detail)      # not resumed: rec.halt says why
        else:
            ps.input_topic_id = topic_id or ps.input_topic_id
            ps.record_parts = dict(recs[p].record_parts)     # the keys its chain's tombstones must reach
        starts[p] = ps.offset + 1 if ps is not None and ps.offset >= 0 else None
    return starts
