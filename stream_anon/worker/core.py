"""The worker's core, without faust or a Kafka client: a partition's batch of input messages in, the output
messages and the partition's new state out (:mod:`stream_anon.kafka.loop` moves them through Kafka in one
transaction; tests and benchmarks drive the core directly).

One :class:`~stream_anon.engine.Engine` per input partition (a release is one window's output of one partition).
Per batch of one partition, in offset order: offsets at or below the partition's state are skipped (already
processed); size, JSON, kind and schema checks, then the engine's reader (event type, privacy unit, time,
quasi-identifiers) -> dead letters with a reason; the records go to the engine; the output is every release's
records (``anon.<stream>.records``, key release_id), its manifest (``anon.releases``), a release metric and alerts
(``anon.metrics``), the dead letters (``anon.deadletter``) and, for streams with DP aggregates, the rows of the
windows the engine closed (``anon.aggregates``). The output is a function of the partition's state and its input
messages only (not of how they were cut into batches), so re-processing after a failure reproduces it exactly.
"""
from __future__ import annotations

import logging
import math
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from stream_anon.inputs import Decoder
from stream_anon import guarantees
from stream_anon.worker import aggregates, placement
from stream_anon.worker import state as st
from stream_anon.worker.input_checks import InputBatch
from stream_anon.worker.isolation import isolate
from stream_anon.worker.partition import PartitionState, open_partition
from stream_anon.render import TOPICS, Renderer, json_bytes
from stream_anon.worker.stats import WorkerStats, batch_counts

log = logging.getLogger("stream_anon.worker")

@dataclass
class BatchOutput:
    """What one partition batch produces: messages, the new last input offset, counters."""
    messages: list
    last_offset: int
    counts: dict
    engine_input: bool = False
    releases: list = field(default_factory=list)
    # DP rows still being released by the aggregates process: (position in messages, Pending), for
    # WorkerCore.complete
    pending: list = field(default_factory=list)

    def followed_by(self, later: BatchOutput) -> BatchOutput:
        """This output and the partition's ``later`` one as one batch's (one transaction of both)."""
        shift = len(self.messages)
        counts = {k: self.counts.get(k, 0) + later.counts.get(k, 0) for k in {**self.counts, **later.counts}}
        return BatchOutput(self.messages + later.messages, later.last_offset, counts,
                           self.engine_input or later.engine_input, self.releases + later.releases,
                           self.pending + [(at + shift, rows) for at, rows in later.pending])


def new_messages(msgs, last: int) -> tuple[list, int, int]:
    """(the ``(offset, value)`` messages above offset ``last``, in offset order; the last offset; how many were
    skipped as already processed)."""
    msgs = list(msgs)
    offsets = [m[0] for m in msgs]
    if offsets and offsets[0] > last and all(map(operator.lt, offsets, offsets[1:])):
        return msgs, offsets[-1], 0                 # the usual batch: new offsets, in order
    fresh = []
    for off, raw in sorted(msgs, key=lambda m: m[0]):
        if off > last:
            last = off
            fresh.append((off, raw))
    return fresh, last, len(msgs) - len(fresh)


class WorkerCore:
    """Everything the worker does between reading input and writing output, for the partitions it owns: each
    partition's pipeline (:class:`~stream_anon.worker.partition.PartitionState`), the batch's input decoding, its
    rendering (:class:`~stream_anon.render.Renderer`), failure isolation and the worker's counters."""

    def __init__(self, config, app_id: str, secret: bytes, flush_when_idle_s: float | None = None,
                 raw_deadletters: bool = False, aggregates_process: bool = False, aggregates_setup=None,
                 aggregates_serve=None):
        self.config, self.app_id, self.secret = config, app_id, secret
        self.render = Renderer(config, secret, raw_deadletters)
        self.settings = guarantees.settings(config)     # the guarantee settings in force (state and manifests)
        self.kid = self.render.kid
        self.flush_when_idle_s = flush_when_idle_s
        self.stream = config.stream.name
        self.topic = config.stream.input_topic
        self.parts: dict[int, PartitionState] = {}
        self.stats = WorkerStats()
        # the input topic's partition count, set by the Kafka loop: each event's unit must belong on the partition
        # it arrived on (None: not checked, the core used without Kafka)
        self.placement: placement.UnitPlacement | None = None
        # [input] mapping (stream_anon.inputs); None: the built-in JSON shape, checked by check_payloads
        self.decoder = None if config.input.legacy else Decoder(config.input, config.limits.max_event_bytes, secret)
        # the DP aggregates in a child process (stream_anon.worker.aggregates_process); their rows are then collected
        # by complete() before a batch's output is written
        self.aggregates_process = None
        if aggregates_process and config.dp is not None and config.dp.aggregates:
            from stream_anon.worker.aggregates_process import AggregatesProcess
            self.aggregates_process = AggregatesProcess(config, secret, json_bytes, setup=aggregates_setup,
                                                        serve=aggregates_serve)

    def check_placement(self, n_partitions: int) -> None:
        """From now on, check that each event's privacy unit belongs on the partition it arrives on, of an input
        topic of ``n_partitions`` (stream_anon.worker.placement). Refuses DP aggregates whose unit is not the
        stream's privacy unit on more than one partition: their units could span partitions, each partition's
        ledger charging them apart."""
        dp = self.config.dp
        unit = self.config.stream.privacy_unit
        if n_partitions > 1 and dp is not None and dp.aggregates and not (dp.clock is not None and dp.unit == "event") \
                and dp.privacy_unit != unit:
            raise RuntimeError(f"dp.unit_field {dp.privacy_unit!r} is not stream.privacy_unit {unit!r}: on an input "
                               f"topic of {n_partitions} partitions a unit could span partitions and be charged on "
                               f"each one's ledger (use one partition, or make the DP unit the privacy unit)")
        self.placement = placement.UnitPlacement(self.secret, unit, n_partitions)

    # ---- partitions
    def open_partition(self, partition: int, doc: dict | None = None, tables: dict | None = None,
                       base_seq: int | None = None, **options) -> PartitionState:
        """:func:`stream_anon.worker.partition.open_partition` of this worker's configuration, registered
        (``options``: its ``accepted_changes``, ``lineage``, ``notes``, ``rotated_from``)."""
        ps = open_partition(self.config, self.secret, partition, self._aggregates, doc, tables, base_seq, **options)
        self.parts[partition] = ps
        return ps

    def _aggregates(self, partition: int, core: dict | None, tables: dict | None = None, lineage: str | None = None):
        """The partition's DP aggregates (None without ``[dp]``): new, or from their core and their own tables."""
        if self.config.dp is None or not self.config.dp.aggregates:
            return None
        if self.aggregates_process is not None:
            return self.aggregates_process.open(self.config, partition, core, tables, lineage)
        dp = aggregates.PartitionAggregates(self.config, partition, self.secret, lineage)
        if core is not None:
            dp.load_state(core, tables or {})
        else:
            dp.open_new()
        return dp

    def close_partition(self, partition: int) -> None:
        ps = self.parts.pop(partition, None)
        if ps is not None and self.aggregates_process is not None and ps.dp is not None:
            ps.dp.close()

    def close(self) -> None:
        """Stop the aggregates process, if any (the worker's end)."""
        if self.aggregates_process is not None:
            self.aggregates_process.close()

    def state_record(self, ps: PartitionState, seq: int, offset: int, flush_pending: bool = False
                     ) -> st.StateRecord:
        """The record of the partition's state for state transaction ``seq`` (:meth:`PartitionState.record`);
        commit it, then :meth:`PartitionState.note_committed`. A flush decision records the DP clock it will
        release to, so that a worker redoing it releases the same windows."""
        if flush_pending and ps.flush_through is None:
            ps.flush_through = self.dp_clock_through()
        return ps.record(self.stream, self.topic, seq, offset, flush_pending)

    # ---- one batch of one partition
    def process(self, ps: PartitionState, msgs) -> BatchOutput:
        """``msgs``: (offset, value bytes) of one partition. Skips offsets already in the state."""
        out = BatchOutput([], ps.offset, batch_counts())
        fresh, last, out.counts["skipped"] = new_messages(msgs, ps.offset)
        batch = InputBatch(fresh, self.config, self.decoder, self.topic, ps.partition)
        out.counts["events_in"] += batch.n
        for source, reason, raw, event, opaque in batch.rejected:
            self.deadletter(out, reason, ps.partition, source, raw=raw, event=event, opaque=opaque)
        out.last_offset = last
        if batch.events and self.placement is not None:
            self._misplaced(ps, batch, out, self.placement)
        if batch.events:
            out.engine_input = True
            self._process_events(ps, batch.events, batch.sources, out, batch.columns)
        self._account(ps, out)
        self._prefetch(ps)
        return out

    def flush(self, ps: PartitionState) -> BatchOutput:
        """Close the open window and resolve every deferred record (end of a replay / idle input); the DP
        aggregates release every window through the end of the period the worker's clock stands in
        (:meth:`dp_clock_through`, or the one the committed flush decision holds), the partition's own data or not."""
        out = BatchOutput([], ps.offset, batch_counts())
        through = ps.flush_through if ps.flush_through is not None else self.dp_clock_through()
        self._emit(ps, ps.engine.flush(), out, through)
        ps.flush_through = None
        self._account(ps, out)
        ps.dirty_since_flush = False
        self._prefetch(ps)
        return out

    def _prefetch(self, ps: PartitionState) -> None:
        """Ask the aggregates process now for what the partition's next state record needs of the aggregates:
        its reply follows the batch's releases, where a request made when the record is written would wait behind
        the releases of the partitions processed since."""
        if self.aggregates_process is not None and ps.dp is not None:
            ps.dp.prefetch_record_state()

    def _misplaced(self, ps: PartitionState, batch: InputBatch, out: BatchOutput,
                   units: placement.UnitPlacement) -> None:
        """Dead-letter the events whose privacy unit belongs on another partition (``units``: where each belongs),
        before the engine and the aggregates see them (:mod:`stream_anon.worker.placement`); one alert per batch
        that had any."""
        wrong = units.take_misplaced(batch, ps.partition)
        for source, event, reason in wrong:
            self.deadletter(out, reason, ps.partition, source, event=event)
        if wrong:
            topic, key, alert = self.render.alert(placement.WRONG_PARTITION, ps.partition, events=len(wrong),
                                                  partitions=units.n_partitions)
            out.messages.append((topic, key, json_bytes(alert)))
            self.stats.raised(placement.WRONG_PARTITION)

    def _process_events(self, ps: PartitionState, events: Sequence, offsets: list, out: BatchOutput,
                        columns: dict | None = None) -> None:
        """Reader, engine and output of a batch's checked events (``columns``: their fields as the input checks
        read them, or None). If this raises, no event is lost and the partition does not stop: see
        :func:`stream_anon.worker.isolation.isolate`."""
        first, counts = len(out.messages), dict(out.counts)
        try:
            self.attempt(ps, events, offsets, range(len(events)), out, columns)
        except Exception as exc:   # noqa: BLE001 - one event never stops the partition
            del out.messages[first:]          # the failed attempt leaves neither messages nor counts behind
            out.counts.update(counts)
            out.releases.clear()
            isolate(self, ps, events, offsets, out, exc)

    def attempt(self, ps: PartitionState, events: Sequence, offsets: list, idx, out: BatchOutput,
                columns: dict | None = None) -> None:
        """``columns``: of all ``events``, given only when ``idx`` is all of them."""
        idx = list(idx)
        part = events if len(idx) == len(events) else [events[i] for i in idx]
        records, rejected = ps.engine.read(part, columns)
        for j, reason in rejected:
            self.deadletter(out, reason, ps.partition, offsets[idx[j]], event=part[j])
        self._emit(ps, ps.engine.process_records(records), out, aggregates.closed_through(ps.engine))

    def restore(self, ps: PartitionState, doc: dict | None, tables: dict) -> None:
        """Put the partition back into the state of ``doc`` and ``tables`` (None: a new partition), keeping its
        bookkeeping (committed chain, offsets)."""
        fresh = self.open_partition(ps.partition, doc, tables)
        self.parts[ps.partition] = ps
        ps.engine, ps.dp = fresh.engine, fresh.dp
        ps.next_full = True          # a restored engine's changes start from an empty base

    def _emit(self, ps: PartitionState, result, out: BatchOutput, through: int | None = None) -> None:
        """The releases' messages, then the DP rows of the closed windows and of every window up to ``through``
        (the schedule's clock)."""
        for rel in result.releases:
            docs, c, alerts = self.render.release(rel, ps.settings_changes, ps.notes)
            ps.settings_changes, ps.notes = [], {}   # published: the state committed with this batch no longer holds them
            out.messages.extend(docs)
            out.releases.append(rel)
            for k, v in c.items():
                out.counts[k] += v
            self.stats.release(rel, alerts)
        if ps.dp is not None and (result.windows or aggregates.behind(ps.dp, through)):
            released = ps.dp.messages(result.windows, json_bytes, TOPICS.metrics, through)
            if not (released.done or ps.wait_for_aggregates):
                out.pending.append((len(out.messages), released))      # collected by complete()
                return
            msgs_dp, n = released.result()
            out.messages.extend(msgs_dp)
            out.counts["aggregate_rows"] += n

    def complete(self, ps: PartitionState, out: BatchOutput, msgs=None) -> BatchOutput:
        """``out`` (of ``process(ps, msgs)``, or of ``flush(ps)`` when ``msgs`` is None) with the DP rows the
        aggregates process released for it, in place (the output as without the process). A release that failed
        there is the batch's failure: the partition goes back to its committed state and the batch (or the flush)
        runs again with every release waited for, so that the failure is caught where an engine failure is
        (isolation, dead letters). Without the process: ``out``."""
        if not out.pending:
            return out
        try:
            results = [(at, released.result()) for at, released in out.pending]
        except Exception as exc:   # noqa: BLE001 - one event never stops the partition
            log.error("partition %s: the aggregates process failed on the batch (%s); processing it again, "
                      "waiting for each release", ps.partition, type(exc).__name__)
            self.restore(ps, *ps.committed_state())
            self.stats.batch(out.counts, sign=-1)    # the batch is accounted again when it runs again
            ps.events_in -= out.counts["events_in"]
            ps.wait_for_aggregates = True
            try:
                return self.flush(ps) if msgs is None else self.process(ps, msgs)
            finally:
                ps.wait_for_aggregates = False
        out.pending = []
        for at, (msgs_dp, n) in reversed(results):
            out.messages[at:at] = msgs_dp
            out.counts["aggregate_rows"] += n
            self.stats.totals["aggregate_rows"] += n
        return out

    def deadletter(self, out: BatchOutput, reason: str, partition: int, source, raw=None, event=None,
                   opaque: bool = False) -> None:
        """``source``: the input offset, or (offset, index) of one event of a multi-event message."""
        offset, index = source if isinstance(source, tuple) else (source, None)
        ps = self.parts.get(partition)
        out.messages.append(self.render.deadletter(reason, partition, offset, raw=raw, event=event, index=index,
                                                   opaque=opaque, lineage=ps.lineage if ps is not None else None))
        out.counts["dead_letters"] += 1
        self.stats.deadletter(reason)

    def _account(self, ps: PartitionState, out: BatchOutput) -> None:
        self.stats.batch(out.counts)
        ps.events_in += out.counts["events_in"]
        if out.last_offset != ps.offset:
            ps.last_input = time.monotonic()
            ps.dirty_since_flush = ps.dirty_since_flush or out.engine_input

    # ---- without Kafka (tests, benchmarks, library use)
    def handle(self, messages) -> list:
        """``(partition, offset, value)`` messages in consumption order -> output messages, every partition
        batch's new state taken as committed (what the loop does with a transaction)."""
        by_part: dict[int, list] = {}
        for p, off, raw in messages:
            by_part.setdefault(p, []).append((off, raw))
        out = []
        for p, msgs in by_part.items():
            ps = self.parts.get(p) or self.open_partition(p)
            batch = self.complete(ps, self.process(ps, msgs), msgs)
            out.extend(batch.messages)
            self.committed(ps, batch.last_offset)
        return out

    def flush_all(self) -> list:
        """Flush every partition holding records (end of input), each flush taken as committed."""
        out = []
        through = self.dp_clock_through()
        for ps in list(self.parts.values()):
            if ps.dirty_since_flush or aggregates.behind(ps.dp, through):
                out.extend(self.complete(ps, self.flush(ps)).messages)
                self.committed(ps, ps.offset)
        return out

    def committed(self, ps: PartitionState, offset: int) -> st.StateRecord:
        """Record a commit of the partition's current state at ``offset`` (what the loop does with a
        transaction): its state record."""
        rec = self.state_record(ps, ps.seq + 1, offset)
        ps.note_committed(rec)
        return rec

    def dp_clock_through(self) -> int | None:
        """:func:`stream_anon.worker.aggregates.clock_through` of this worker's partitions."""
        return aggregates.clock_through(self.config.dp, [ps.engine for ps in self.parts.values()])

    def idle_due_at(self, not_before: float = -math.inf) -> float:
        """When the partitions will have been without input for ``flush_when_idle_s`` (counted from ``not_before``
        at the earliest), so that an idle flush may follow (:meth:`idle_partitions`); inf when there is nothing
        to flush."""
        through = self.dp_clock_through()
        if not self.flush_when_idle_s or not any(ps.dirty_since_flush or aggregates.behind(ps.dp, through)
                                                 for ps in self.parts.values()):
            return math.inf
        return max(max(ps.last_input for ps in self.parts.values()), not_before) + self.flush_when_idle_s

    def idle_partitions(self, answered_at: float = math.inf, not_before: float = -math.inf) -> list[PartitionState]:
        """Partitions to flush: every partition of this worker has had no input for ``flush_when_idle_s``
        (judged over all partitions: one may wait in the fetch buffer while another is served, and flushing it
        early would change its releases), and this one holds records or an open window.

        With a broker (the Kafka loop): the quiet time counts from ``not_before`` at the earliest (the end of the
        last outage: a backlog is still to come) and must have been confirmed by the broker, i.e. a request sent
        at ``answered_at`` at least ``flush_when_idle_s`` after it was answered."""
        if min(time.monotonic(), answered_at) < self.idle_due_at(not_before):
            return []
        through = self.dp_clock_through()
        return [ps for ps in self.parts.values() if ps.dirty_since_flush or aggregates.behind(ps.dp, through)]
