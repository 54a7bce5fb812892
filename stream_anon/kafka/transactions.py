"""One partition's transactions: its transactional producer, what a partition batch's transaction holds (the output
messages, the partition's state record, in parts when long, and the tombstones of the records it makes obsolete),
and the commits under way.

Each partition has its own transactional producer (``<app_id>-p<partition>``), so the partitions' commits are
independent: :class:`CommitThreads` runs each commit (``send_offsets_to_transaction`` + commit, which wait for the
broker) in a thread of its own while the loop goes on, and hands the outcomes back in the order asked for. Every
transaction still holds one partition's output, state and offsets, and the loop takes each outcome before it uses
that partition's state again (kafka/loop.py)."""
from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Producer

from stream_anon.worker import state as st

if TYPE_CHECKING:
    from stream_anon.worker.core import BatchOutput
    from stream_anon.worker.partition import PartitionState

log = logging.getLogger("stream_anon.worker")
client_log = logging.getLogger("stream_anon.kafka.client")

TXN_TIMEOUT_S = 60.0
COMMIT_THREADS = 8                     # commits under way at once (one per partition in flight)


def transactional_producer(client_config: dict, app_id: str, partition: int, compression: str) -> Producer:
    """The producer of one partition's transactions (``<app_id>-p<partition>``: initializing it fences a zombie)."""
    return Producer({
        **client_config, "transactional.id": st.transactional_id(app_id, partition),
        "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000), "linger.ms": 5,
        "batch.num.messages": 10000, "queue.buffering.max.messages": 2000000,
        "queue.buffering.max.kbytes": 1048576, "message.max.bytes": st.MESSAGE_MAX_BYTES, "logger": client_log,
        "compression.type": compression})


def produce(prod: Producer, topic: str, value: bytes | None, key: bytes, partition: int | None = None) -> None:
    kw: dict[str, Any] = {"partition": partition} if partition is not None else {}
    while True:
        try:
            prod.produce(topic, value, key, **kw)
            return
        except BufferError:            # local queue full: let librdkafka send, then retry
            prod.poll(0.05)


def produce_all(prod: Producer, messages: list) -> None:
    """Every ``(topic, key, value)`` message, in order (a full local queue waits in :func:`produce`)."""
    send = prod.produce
    for topic, key, value in messages:
        try:
            send(topic, value, key)
        except BufferError:
            produce(prod, topic, value, key)


def fence_and_barrier(prod: Producer, state_topic: str, stream: str, partition: int) -> bytes:
    """Initialize the partition's transactional producer (fences a zombie, ends a transaction it left open) and
    commit a barrier with a fresh nonce to the state partition (worker/state.py: how far recovery reads)."""
    prod.init_transactions(TXN_TIMEOUT_S)
    nonce = uuid.uuid4().hex.encode()
    prod.begin_transaction()
    produce(prod, state_topic, st.encode_barrier(nonce), st.barrier_key(stream, partition), partition)
    prod.commit_transaction(TXN_TIMEOUT_S)
    return nonce


def produce_state(prod: Producer, topic: str, stream: str, partition: int, seq: int, value: bytes,
                  obsolete: dict[int, int], part_bytes: int = st.PART_MAX_BYTES) -> int:
    """Transaction ``seq``'s state record, in parts of at most ``part_bytes`` when longer, and tombstones for the
    records of ``obsolete`` (sequence number -> the values it was written as). Returns the values written."""
    values = st.split_value(value, part_bytes)
    for key, part in zip(st.record_keys(stream, partition, seq, len(values)), values):
        produce(prod, topic, part, key, partition)
    for old, parts in obsolete.items():
        for key in st.record_keys(stream, partition, old, parts):
            produce(prod, topic, None, key, partition)
    return len(values)


def flush_discarding(prod: Producer, timeout_s: float) -> KafkaException | None:
    """Flush the producer of a partition that leaves or is fenced; returns its fatal error (what it still holds
    belongs to a transaction never committed), raises anything else. confluent-kafka raises a producer's fatal
    error inside ``flush`` (these producers have no ``error_cb``), and when a log line follows in the same poll,
    CPython reports the logger's call as a SystemError caused by that KafkaException (seen on Apache Kafka)."""
    try:
        prod.flush(timeout_s)
    except KafkaException as exc:
        return exc
    except SystemError as exc:
        if isinstance(exc.__cause__, KafkaException):
            return exc.__cause__
        raise
    return None


def flush_leaving(prod: Producer, partition: int, why: str, timeout_s: float = 1.0) -> None:
    """:func:`flush_discarding` of a partition's producer left behind (``why``: when), a fatal error logged."""
    err = flush_discarding(prod, timeout_s)
    if err is not None:
        log.debug("partition %s: producer not flushed %s (%s)", partition, why, err)


def abort_or_fenced(prod: Producer, err: KafkaError) -> bool:
    """True when the producer was fenced (or failed fatally): another worker owns its partition; else the failed
    transaction is aborted (an abort that fails counts as fenced)."""
    if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH) or err.fatal():
        return True
    try:
        prod.abort_transaction(TXN_TIMEOUT_S)
    except KafkaException:
        return True
    return False


class OpenTransaction:
    """A partition batch's transaction from its writing (:meth:`write`) to its outcome (:meth:`CommitThreads.settle`):
    the partition's output messages, its state record ``rec`` (encoded: ``state_value``, written as ``parts``
    values) and tombstones, then the offsets and the commit."""

    __slots__ = ("ps", "prod", "rec", "state_value", "parts", "ending", "ended_at", "failure")

    def __init__(self, ps: PartitionState, prod: Producer, rec: st.StateRecord):
        self.ps, self.prod, self.rec, self.state_value = ps, prod, rec, st.encode_state(rec)
        self.parts = 0
        self.ending: Future | None = None             # the commit under way
        self.ended_at: float | None = None            # wall time its commit returned
        self.failure: KafkaException | None = None    # writing or committing the transaction failed

    def write(self, messages: list, state_topic: str, stream: str, part_bytes: int) -> None:
        """Begin the transaction and write into it the output ``messages``, the state record and, after a full
        record, tombstones for the chain before it (obsolete: compaction drops them). A failure is kept in
        ``failure`` (the transaction is then to be aborted)."""
        ps, rec = self.ps, self.rec
        obsolete = {old: ps.record_parts.get(old, 1) for old in range(ps.chain_start, rec.seq)} if rec.full else {}
        try:
            self.prod.begin_transaction()
            produce_all(self.prod, messages)
            self.parts = produce_state(self.prod, state_topic, stream, ps.partition, rec.seq, self.state_value,
                                       obsolete, part_bytes)
        except KafkaException as exc:
            self.failure = exc


class CommitThreads:
    """The transactions' commits, side by side: :meth:`start` runs ``end(prod, *args)`` (offsets into the
    transaction, then its commit) in a thread of its own; :meth:`settle` waits for the ones given and gives each
    transaction's failure (None: committed) in the order given. ``end`` touches no consumer: confluent-kafka
    serializes a consumer's calls, and the loop may be inside ``consume()`` (a rebalance callback) meanwhile."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def start(self, txn: OpenTransaction, end: Callable[..., None], *args: Any) -> None:
        if txn.failure is not None:                  # not written whole: nothing to commit
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=COMMIT_THREADS, thread_name_prefix="txn-commit")
        txn.ending = self._pool.submit(self._ended, txn, end, *args)

    @staticmethod
    def _ended(txn: OpenTransaction, end: Callable[..., None], *args: Any) -> None:
        end(txn.prod, *args)
        txn.ended_at = time.time()

    @staticmethod
    def settle(txns: list[OpenTransaction]) -> list[KafkaException | None]:
        """Each transaction's failure, once every commit has ended (an exception other than Kafka's is raised: the
        loop stops, as it would have committing one by one)."""
        wait([t.ending for t in txns if t.ending is not None])
        for txn in txns:
            if txn.failure is None and txn.ending is not None:
                try:
                    txn.ending.result()
                except KafkaException as exc:
                    txn.failure = exc
        return [txn.failure for txn in txns]

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class InFlight:
    """The transactions whose commit is under way and not yet taken, at most one per partition, each with what the
    loop notes once it committed (``out``: the batch output; ``arrived``: when its input arrived)."""

    def __init__(self, commits: CommitThreads) -> None:
        self.commits = commits
        self._txns: dict[int, tuple[OpenTransaction, BatchOutput, float | None]] = {}

    def __contains__(self, partition: int) -> bool:
        return partition in self._txns

    def partitions(self) -> list[int]:
        return list(self._txns)

    def add(self, txn: OpenTransaction, out: BatchOutput, arrived: float | None) -> None:
        assert txn.ps.partition not in self._txns, "a partition's transaction started before its last was taken"
        self._txns[txn.ps.partition] = (txn, out, arrived)

    def take(self, partitions: list[int]
             ) -> list[tuple[OpenTransaction, BatchOutput, float | None, KafkaException | None]]:
        """The transactions of ``partitions`` (those in flight), once their commits ended: ``(txn, out, arrived,
        failure)`` each (failure None: committed)."""
        taken = [self._txns.pop(p) for p in partitions if p in self._txns]
        failures = self.commits.settle([txn for txn, _, _ in taken])
        return [(txn, out, arrived, failure) for (txn, out, arrived), failure in zip(taken, failures)]


JOINED_BATCHES_MAX = 3     # batches of one partition in one transaction while their DP rows are under way


class Held(NamedTuple):
    """A partition's processed batches not yet in a transaction: the partition's state, their ``(offset, value)``
    messages, their joined output and when the first arrived."""
    ps: PartitionState
    msgs: list
    out: BatchOutput
    arrived: float
    batches: int


class HeldBatches:
    """Processed batches whose DP rows the aggregates process is still releasing (worker/aggregates_process.py),
    held for one transaction with the partition's next batches, up to :data:`JOINED_BATCHES_MAX`.

    Why: a consumed batch usually holds one or two partitions, and the partition's next batch follows at once; a
    transaction per batch made the loop wait for each batch's release before anything else. Held, the release runs
    while the loop consumes and processes the next batch, which then goes into the same transaction (its state
    record is the state after both: one transaction of a bigger batch). A partition has held batches or a
    transaction in flight, never both; the loop starts the held transaction at the next step (or when the
    partition is flushed, moves or the loop ends), and drops it uncommitted after a loop failure (nothing of it
    was committed: the next owner processes the batches again)."""

    def __init__(self) -> None:
        self._held: dict[int, Held] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def partitions(self) -> list[int]:
        return list(self._held)

    def take(self, partition: int) -> Held | None:
        return self._held.pop(partition, None)

    def take_all(self) -> list[Held]:
        taken, self._held = list(self._held.values()), {}
        return taken

    def hold_or_give(self, done: Held) -> Held | None:
        """Hold ``done`` while its rows are under way and it has room for another batch; else give it back (its
        transaction starts now)."""
        if done.out.pending and done.batches < JOINED_BATCHES_MAX:
            self._held[done.ps.partition] = done
            return None
        return done

    def clear(self) -> None:
        self._held.clear()


def joined(held: Held | None, ps: PartitionState, msgs: list, out: BatchOutput, arrived: float) -> Held:
    """A processed batch, after the partition's held ones when there are."""
    if held is None:
        return Held(ps, msgs, out, arrived, 1)
    return Held(ps, held.msgs + msgs, held.out.followed_by(out), held.arrived, held.batches + 1)
