"""Differentially private aggregates in the worker: the per-partition glue between the Kafka worker and
:class:`stream_anon.dp.DPAggregator`. No noise, accounting, bounding or windowing logic lives here.

Per input partition (one individual -> one partition, so the partitions hold disjoint sets of individuals and
their budgets compose in parallel: McSherry, PINQ, SIGMOD 2009, Theorem 4):

- **Windows** are the engine's: every window the engine closes (:class:`stream_anon.engine.ClosedWindow`, with the
  fields of the accepted events that arrived while it was open) is handed to the aggregator, which releases it.
  Which windows are released follows the stream's clock, never the data (docs/privacy.md, Which DP rows exist):
  from the schedule's start (``dp.start``) on, after every batch every window the engine's clock closed
  (:func:`closed_through`), and at an idle flush every window to the end of the period of the worker's clock
  (:func:`clock_through`), empty or not; a window released is never released again. The engine carries the fields
  listed by :func:`needed_fields` and keeps the open window's in its checkpointed state.
- **State**: :class:`PartitionAggregates` is a :class:`~stream_anon.checkpoint.Checkpointable` of two parts, the
  aggregator and its ledger (core ``{"aggregator": ..., "ledger": ...}``, the keyed table
  ``aggregator/unit_windows`` in period mode), written in the same Kafka transaction as the rows that spend the
  ledger (stream_anon.worker.state).
- **Restarts**: the worker re-processes input after its committed state. The re-closed windows find their
  reservations in the ledger (idempotent: nothing is spent twice) and get the same noise, because the noise
  seed is ``HMAC(stream secret, stream, partition)`` and each window's generator ``HMAC(seed, aggregate,
  component, output, window)`` (:func:`stream_anon.crypto.dp_noise_seed`). A re-produced row is identical to the
  first copy (same ``row_id``); consumers dedupe by ``row_id``.

Outputs: rows for ``anon.aggregates`` (written by :class:`stream_anon.dp.release.RowWriter`), and for ``anon.metrics``
one ``dp_window`` event per closed window (contribution cuts, out-of-domain and missing events, epsilon spent)
plus a ``budget_exhausted`` event when the ledger stops an aggregate.
"""
from __future__ import annotations

import math

from stream_anon import checkpoint, crypto
from stream_anon.events import UNIT_IDS
from stream_anon.contract import topics
from stream_anon.metric_rows import event_row, metric_row


def unit_ids_carried(config) -> bool:
    """Whether the aggregates tell units apart by the engine's unit ids (``UNIT_IDS``): their unit is the
    stream's privacy unit (not ``unit = "event"``, not another ``dp.unit_field``)."""
    dp = config.dp
    return dp.privacy_unit == config.stream.privacy_unit and not (dp.clock is not None and dp.unit == "event")


def needed_fields(config) -> tuple[str, ...]:
    """Every field the aggregates read: the engine carries only these to the closed windows (the unit's ids in
    place of its field where :func:`unit_ids_carried`)."""
    dp = config.dp
    fields = [UNIT_IDS] if unit_ids_carried(config) else [dp.privacy_unit]
    fields.append(config.stream.event_time)
    for s in dp.aggregates:
        for g in s.group_by:
            fields.extend(g.fields)
        if s.value_field:
            fields.append(s.value_field)
        fields.extend(k for k, _ in s.where)
    return tuple(dict.fromkeys(fields))


def closed_through(engine) -> int | None:
    """The last window the engine's clock has closed (an event in it or before it is late): the DP schedule
    releases every window up to it after each batch."""
    end = engine.closed_until
    return round(end / engine.window_s) - 1 if math.isfinite(end) else None


def clock_through(dp, engines) -> int | None:
    """The last window of the DP schedule an idle flush releases: the end of the period (without one: the window)
    holding the latest event time of the worker's partitions (``engines``). Every partition of the worker is
    released that far, whether or not it held events (a partition whose only unit is one individual must not
    publish fewer rows without it); None without DP or before any event."""
    if dp is None or not dp.aggregates or dp.window_s is None:
        return None
    latest = max((e.max_event_time for e in engines), default=-math.inf)
    if not math.isfinite(latest):
        return None
    return dp.schedule_end(math.floor(latest / dp.window_s))


def behind(dp, through: int | None) -> bool:
    """Whether a partition's aggregates (``dp``, None without) have windows up to ``through`` still to release."""
    if dp is None or through is None:
        return False
    last = dp.released_through
    return last is not None and through > last


AGGREGATES_TOPIC = topics().aggregates


class Pending:
    """What a partition batch's DP release gives, ``(messages, aggregate rows)``, on both paths: ready at once in
    the worker's process (:meth:`ready`), or filled in when the aggregates process replies
    (:mod:`stream_anon.worker.aggregates_process`; :meth:`result` waits for it)."""

    __slots__ = ("_owner", "done", "value", "error")

    def __init__(self, owner=None):
        self._owner, self.done, self.value, self.error = owner, False, None, None

    @classmethod
    def ready(cls, value) -> "Pending":
        out = cls()
        out.done, out.value = True, value
        return out

    def result(self):
        if not self.done:
            self._owner.wait(self)
        if self.error is not None:
            raise self.error
        return self.value


class PartitionAggregates:
    """The DP aggregates of one input partition (see the module docstring).

    Parameters
    ----------
    config : StreamConfig
        With a ``dp`` section (``config.dp``).
    partition : int
    secret : bytes
        The stream secret; the noise seed is derived from it and never stored.
    lineage : str or None
        The stream's lineage (:mod:`stream_anon.kafka.lineage`): in every row (``lineage``, ``row_id``) and in the
        noise seed, so a new lineage never repeats a row id nor reuses noise on other data.

    State (:class:`~stream_anon.checkpoint.Checkpointable`): :meth:`state_core` is ``{"aggregator": its core (counters,
    metrics, period, partial releases), "ledger": the ledger's}``; :meth:`state_tables`, in period mode,
    ``aggregator/unit_windows``: the unit's keyed 64-bit id or hash -> windows it used in the period, one column per
    aggregate (a new period deletes them all); :meth:`load_state` on aggregates just built. For the worker's state
    records, :meth:`record_state` and :meth:`full_tables` give the same as copies (the aggregates may live in
    another process: :mod:`stream_anon.worker.aggregates_process`).
    """

    def __init__(self, config, partition: int, secret: bytes, lineage: str | None = None):
        if config.dp is None:
            raise ValueError("config.dp: the stream configuration has no [dp] / [[aggregates]] tables")
        if not secret:
            raise ValueError("secret: required (the noise seed is derived from it)")
        self.dp = config.dp
        self.stream = config.stream.name
        self.partition = int(partition)
        self.lineage = lineage
        self.window_s = float(config.anonymization.window_s)
        # imported here: diffprivlib (with scikit-learn) loads only in a worker whose stream has DP aggregates,
        # ~0.6 s of every other worker's start
        from stream_anon.dp import BudgetLedger, DPAggregator
        from stream_anon.dp.release import RowWriter
        self.ledger = BudgetLedger(None, self.dp.epsilon_budget)
        seed = crypto.dp_noise_seed(secret, self.stream, self.partition, lineage)
        self.aggregator = DPAggregator(self.dp, self.ledger, seed, stream=self.stream,
                                       unit_ids=unit_ids_carried(config))
        self._parts = checkpoint.Composite({"aggregator": self.aggregator, "ledger": self.ledger})
        self.rows = RowWriter(self.stream, self.partition, lineage, self.window_s, self.ledger)
        self.carried = needed_fields(config)          # what the engine must carry

    def close_windows(self, windows, through: int | None = None) -> tuple[list[dict], list[dict]]:
        """(aggregate rows, metric events) of the windows the engine closed (``ClosedWindow`` objects, in
        order), then of every window up to ``through`` not released yet (the clock has passed it: :meth:`messages`).
        The ledger is on disk before this returns."""
        rows: list[dict] = []
        metrics: list[dict] = []
        for released, spent, iso in self._releases(windows, through, metrics):
            rows.extend(self.rows.row(r, spent[r["window"]], iso) for block in released for r in block.rows())
        return rows, metrics

    def messages(self, windows, dumps, metrics_topic: str, through: int | None = None) -> Pending:
        """The worker's entry point for one partition batch: ``(topic, key, value)`` messages of the closed
        ``windows`` and the number of aggregate rows, ready (:class:`Pending`). ``through``: the schedule's
        clock, the last window that can hold no more events; every window up to it that no closed window brought
        is released empty, so that which rows exist follows the clock, not the data
        (:meth:`stream_anon.dp.DPAggregator.advance_through`). The values are :meth:`close_windows`' rows
        serialized; a release's fields common to its rows are serialized once (the rows of a window are ~1 KB
        each, one per cell of the domain; ~300 per window of a partition of the Oyster stream)."""
        key = self.stream.encode()
        out: list = []
        metrics: list[dict] = []
        n = 0
        for released, spent, iso in self._releases(windows, through, metrics):
            values = self.rows.values(released, spent, iso, dumps)
            n += len(values)
            out.extend([(AGGREGATES_TOPIC, key, value) for value in values])
        out.extend((metrics_topic, key, dumps(m)) for m in metrics)
        return Pending.ready((out, n))

    @property
    def released_through(self) -> int | None:
        """The last window released (:attr:`stream_anon.dp.DPAggregator.released_through`)."""
        return self.aggregator.released_through

    def _releases(self, windows, through: int | None, metrics: list):
        """Each closed window's releases, then the empty windows' up to ``through`` (see :meth:`_close`)."""
        for w in windows:
            yield self._close(w.index, w.carried, metrics)
        last = self.aggregator.released_through
        if through is not None and last is not None and through > last:
            yield self._close(None, through, metrics)

    def _close(self, index: int | None, carried, metrics: list) -> tuple[list, dict, dict]:
        """Release window ``index`` with its carried fields (``index`` None: every window through ``carried``,
        empty): the aggregator's releases (``ReleasedCells``), the ledger's total through each window they cover,
        and the window start times; appends the metric events to ``metrics``. A window the clock already released
        (an idle flush released its period) is not released again: its events are counted as ``after_release``."""
        from stream_anon.dp.columns import WindowColumns
        from stream_anon.dp.release import ReleasedCells, iso_time
        last, start = self.aggregator.released_through, self.dp.start_window
        if index is not None and last is not None and index <= last and (start is None or index >= start):
            n = len(next(iter(carried.values()), ())) if carried else 0
            self.aggregator.metrics["after_release"] += n
            metrics.append(metric_row("dp_window", self.stream, self.partition, window=index, events=n,
                                      after_release=n))
            return [], {}, self.rows.window_starts()
        if index is None:
            out = self.aggregator.advance_through(carried)
        else:
            out = self.aggregator.release_columns(index, WindowColumns(carried))   # reserves (writes) the ledger
        released = []
        for r in out:
            if isinstance(r, ReleasedCells):
                released.append(r)
            else:                                              # budget_exhausted
                metrics.append(event_row(r, self.stream, self.partition))
        # window -> ledger total through it (gap windows are released here too)
        spent = self.ledger.spent_through(sorted({r.common["window"] for r in released}))
        wm = self.aggregator.window_metrics
        if wm:
            metrics.append(event_row(wm, self.stream, self.partition,
                                     window_start=iso_time(wm["window"] * self.window_s),
                                     window_end=iso_time((wm["window"] + 1) * self.window_s),
                                     epsilon_spent=self.ledger.spent, epsilon_budget=self.ledger.epsilon_budget))
        self.aggregator.window_metrics = {}
        return released, spent, self.rows.window_starts()

    def budget_view(self):
        """(the ledger, the aggregator's :class:`~stream_anon.dp.outlook.AggregatorPosition`): what
        :func:`~stream_anon.dp.outlook.budget_outlook` reads, here live (the metrics endpoint)."""
        from stream_anon.dp.outlook import AggregatorPosition
        st = self.aggregator.state
        return self.ledger, AggregatorPosition(st.period, st.last_window, st.carry)

    # -- checkpoint --------------------------------------------------------------------------------------------
    def state_core(self) -> dict:
        return self._parts.state_core()

    def state_tables(self) -> dict:
        return self._parts.state_tables()

    def load_state(self, core: dict, tables) -> None:
        self._parts.load_state(core, tables)

    def open_new(self) -> None:
        """Aggregates of a partition new in its lineage: their ledger is charged what a lost lineage spent
        (``dp.carried``, :mod:`stream_anon.dp.carry`); restored ones hold it in their state."""
        if self.dp.carried:
            from stream_anon.dp.carry import carry_into
            carry_into(self.ledger, self.dp.clock, {label: (w, eps) for label, w, eps in self.dp.carried})

    def prefetch_record_state(self) -> None:
        """Nothing to ask ahead: the state is in this process (WindowConsumer)."""

    def close(self) -> None:
        """Nothing to stop: the state is in this process (WindowConsumer)."""

    def record_state(self) -> tuple[dict, dict | None, int]:
        """What a state record takes of the aggregates: (:meth:`state_core`, the tables' changes since the previous
        call (:func:`stream_anon.checkpoint.changes`), the rows the tables hold)."""
        return self.state_core(), checkpoint.changes(self), checkpoint.table_rows(self)

    def full_tables(self) -> dict:
        """Every table in full, as copies (name -> (keys, records)); does not reset what :meth:`record_state`
        reports."""
        return checkpoint.full_state(self)[1]


