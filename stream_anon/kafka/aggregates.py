"""Differentially private aggregates in the worker: the per-partition glue between the Kafka worker and
:class:`stream_anon.dp.DPAggregator` (issue 4). No noise, accounting, bounding or windowing logic lives here.

Per input partition (one individual -> one partition, so the partitions hold disjoint sets of individuals and
their budgets compose in parallel: McSherry, PINQ, SIGMOD 2009, Theorem 4):

- **Windows** are the engine's: every window the engine closes (:class:`stream_anon.engine.ClosedWindow`, with the
  fields of the accepted events that arrived while it was open) is handed to the aggregator, which releases it
  (and every skipped window, empty: publication never depends on data). The engine carries the fields listed by
  :func:`needed_fields` and keeps the open window's in its checkpointed state.
- **Ledger**: kept in the partition's state (:meth:`PartitionAggregates.state_core`), written in the same Kafka
  transaction as the rows that spend it (stream_anon.kafka.state); the aggregator's counters and the per-unit
  window counts (the ``dp:unit.windows`` table) go there too.
- **Restarts**: the worker re-processes input after its committed state. The re-closed windows find their
  reservations in the ledger (idempotent: nothing is spent twice) and get the same noise, because the noise
  seed is ``HMAC(stream secret, stream, partition)`` and each window's generator ``HMAC(seed, aggregate,
  component, output, window)`` (:func:`stream_anon.crypto.dp_noise_seed`). A re-produced row is identical to the
  first copy (same ``row_id``); consumers dedupe by ``row_id``.

Outputs: rows for ``anon.aggregates`` (see :meth:`PartitionAggregates.aggregate_row`), and for ``anon.metrics``
one ``dp_window`` event per closed window (contribution cuts, out-of-domain and missing events, epsilon spent)
plus a ``budget_exhausted`` event when the ledger stops an aggregate.
"""
from __future__ import annotations

from datetime import datetime, timezone
import numpy as np

from stream_anon import crypto
from stream_anon.events import UNIT_IDS
from stream_anon.contract import topics


def unit_ids_carried(config) -> bool:
    """Whether the aggregates tell units apart by the engine's unit ids (``UNIT_IDS``): their unit is the
    stream's privacy unit (not ``unit = "event"``, not another ``dp.unit_field``)."""
    dp = config.dp
    return dp.privacy_unit == config.stream.privacy_unit and not (dp.clock is not None and dp.unit == "event")


def needed_fields(config, unit_field: bool = False) -> tuple[str, ...]:
    """Every field the aggregates read: the engine carries only these to the closed windows. The unit's ids in
    place of its field where :func:`unit_ids_carried`, the field too when ``unit_field`` (a restored period keyed
    by hashes of it: ``DPAggregator.needs_unit_field``)."""
    dp = config.dp
    ids = unit_ids_carried(config)
    fields = [UNIT_IDS] if ids else [dp.privacy_unit]
    if ids and unit_field:
        fields.append(dp.privacy_unit)
    fields.append(config.stream.event_time)
    for s in dp.aggregates:
        for g in s.group_by:
            fields.extend(g.fields)
        if s.value_field:
            fields.append(s.value_field)
        fields.extend(k for k, _ in s.where)
    return tuple(dict.fromkeys(fields))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


AGGREGATES_TOPIC = topics().aggregates
TABLE_PREFIX = "dp:"     # the aggregates' keyed tables beside the engine's (seen_events, signatures)


class _IsoCache(dict):
    """Window index -> ISO-8601 UTC time of the window's start, computed once."""

    def __init__(self, window_s: float):
        super().__init__()
        self.window_s = window_s

    def __missing__(self, w: int) -> str:
        self[w] = value = _iso(w * self.window_s)
        return value


class PartitionAggregates:
    """The DP aggregates of one input partition (see the module docstring).

    Parameters
    ----------
    config : StreamConfig
        With a ``dp`` section (``config.dp``).
    partition : int
    secret : bytes
        The stream secret; the noise seed is derived from it and never stored.
    ledger_file : str or Path or None
        The partition's budget ledger (``None``: in memory, tests only).
    state : dict, optional
        ``state_dict()`` of a checkpoint to resume from, or its ``state_core()`` when ``tables`` is given.
    tables : dict, optional
        ``state_tables()`` of the checkpoint (name -> (keys, records)); names without the ``dp:`` prefix (the
        engine's tables, when the caller holds them all) are ignored. A missing table is empty.

    State: like the engine's (:meth:`stream_anon.engine.Engine.state_core` / ``state_tables`` /
    ``state_changes``), a bounded JSON **core** (the aggregator's counters, metrics, period and partial releases;
    the ledger) and a **keyed table** that grows with the units seen, in period mode ``dp:unit.windows``: the
    unit's keyed 64-bit hash -> windows it used in the period, one column per aggregate (a new period deletes
    them all), so a checkpoint can carry what changed since the previous one.
    """

    def __init__(self, config, partition: int, secret: bytes, ledger_file, state: dict | None = None,
                 tables: dict | None = None):
        if config.dp is None:
            raise ValueError("config.dp: the stream configuration has no [dp] / [[aggregates]] tables")
        if not secret:
            raise ValueError("secret: required (the noise seed is derived from it)")
        self.dp = config.dp
        self.stream = config.stream.name
        self.partition = int(partition)
        self.window_s = float(config.anonymization.window_s)
        # imported here: diffprivlib (with scikit-learn) loads only in a worker whose stream has DP aggregates,
        # ~0.6 s of every other worker's start
        from stream_anon.dp import BudgetLedger, DPAggregator
        self.ledger = BudgetLedger(ledger_file, self.dp.epsilon_budget)
        if state is not None and "ledger" in state:       # the worker keeps the ledger in its state (Kafka)
            self.ledger.merge_state(state["ledger"])
        seed = crypto.dp_noise_seed(secret, self.stream, self.partition)
        kwargs = {"stream": self.stream, "unit_ids": unit_ids_carried(config)}
        if state is None:
            self.aggregator = DPAggregator(self.dp, self.ledger, seed, **kwargs)
        elif tables is None:
            self.aggregator = DPAggregator.from_state(self.dp, self.ledger, seed, state["aggregator"], **kwargs)
        else:
            own = {name[len(TABLE_PREFIX):]: t for name, t in tables.items() if name.startswith(TABLE_PREFIX)}
            self.aggregator = DPAggregator.restore(self.dp, self.ledger, seed, state["aggregator"], own, **kwargs)
        self.carried = needed_fields(config, self.aggregator.needs_unit_field)   # what the engine must carry

    @classmethod
    def restore(cls, config, partition: int, secret: bytes, ledger_file, core: dict,
                tables: dict[str, tuple]) -> "PartitionAggregates":
        """The partition's aggregates from :meth:`state_core` and :meth:`state_tables`."""
        return cls(config, partition, secret, ledger_file, core, tables)

    def close_windows(self, windows) -> tuple[list[dict], list[dict]]:
        """(aggregate rows, metric events) of the windows the engine closed (``ClosedWindow`` objects, in
        order). The ledger is on disk before this returns."""
        rows: list[dict] = []
        metrics: list[dict] = []
        for w in windows:
            released, spent, iso = self._close(w, metrics)
            rows.extend(self.aggregate_row(r, spent[r["window"]], iso) for block in released for r in block.rows())
        return rows, metrics

    def messages(self, windows, dumps, metrics_topic: str) -> tuple[list, int]:
        """The worker's entry point for one partition batch: ``(topic, key, value)`` messages of the closed
        ``windows`` and the number of aggregate rows. The values are :meth:`close_windows`' rows serialized; a
        release's fields common to its rows are serialized once (the rows of a window are ~1 KB each, one per
        cell of the domain; ~300 per window of a partition of the Oyster stream)."""
        if not windows:
            return [], 0
        key = self.stream.encode()
        out: list = []
        metrics: list[dict] = []
        n = 0
        for w in windows:
            released, spent, iso = self._close(w, metrics)
            values = self._row_values(released, spent, iso, dumps)
            n += len(values)
            out.extend([(AGGREGATES_TOPIC, key, value) for value in values])
        out.extend((metrics_topic, key, dumps(m)) for m in metrics)
        return out, n

    def _close(self, window, metrics: list) -> tuple[list, dict, "_IsoCache"]:
        """Release one closed window: the aggregator's releases (``ReleasedCells``), the ledger's total through
        each window they cover, and the window start times; appends the metric events to ``metrics``."""
        from stream_anon.dp.aggregator import ReleasedCells
        from stream_anon.dp.columns import WindowColumns
        w = window.index
        out = self.aggregator.release_columns(w, WindowColumns(window.carried))   # reserves (writes) the ledger
        now = _now_iso()
        spent = {}                 # window -> ledger total through it (gap windows are released here too)
        released = []
        for r in out:
            if isinstance(r, ReleasedCells):
                rw = r.common["window"]
                if rw not in spent:
                    spent[rw] = self.ledger.spent_through(rw)
                released.append(r)
            else:                                              # budget_exhausted
                metrics.append({**r, "partition": self.partition, "ts": now})
        wm = self.aggregator.window_metrics
        metrics.append({**wm, "partition": self.partition, "ts": now,
                        "window_start": _iso(w * self.window_s), "window_end": _iso((w + 1) * self.window_s),
                        "epsilon_spent": self.ledger.spent, "epsilon_budget": self.ledger.epsilon_budget})
        return released, spent, _IsoCache(self.window_s)

    def _row_fields(self, r: dict, spent_through: float, iso: _IsoCache) -> dict:
        """The fields this layer adds to an aggregator row (all but ``row_id`` are the release's)."""
        return {"partition": self.partition, "window_start": iso[r.get("span_start_window", r["window"])],
                "window_end": iso[r["window"] + 1], "ledger_epsilon_spent": spent_through,
                "ledger_epsilon_budget": self.ledger.epsilon_budget}

    def _row_id_prefix(self, r: dict) -> str:
        # release: "<window>", or "<window>~<n>" for a paid re-release of a window re-closed with other content
        return f"{self.stream}/p{self.partition}/{r['aggregate']}/{r['output']}/w{r['release']}/"

    def aggregate_row(self, r: dict, spent_through: float, iso=None) -> dict:
        """One ``anon.aggregates`` value: the aggregator's row plus partition, window bounds, the ledger's total
        through this window, and ``row_id`` (dedupe key: a re-produced row is identical). ``iso``: window index ->
        ISO time of its start (a window's rows share a few)."""
        iso = _IsoCache(self.window_s) if iso is None else iso
        row = {**r, **self._row_fields(r, spent_through, iso)}
        row["row_id"] = self._row_id_prefix(r) + r["group_key"]
        return row

    def _row_values(self, released: list, spent: dict, iso: _IsoCache, dumps) -> list[bytes]:
        """:meth:`aggregate_row` of each row of the releases, serialized: per release its fields once, then
        each cell's (``ReleasedCells.cell_fragments``) and ``row_id``."""
        values = []
        for block in released:
            common = block.common
            head = dumps({**common, **self._row_fields(common, spent[common["window"]], iso)})[:-1] + b","
            id_head = b',"row_id":' + dumps(self._row_id_prefix(common))[:-1]     # a JSON string, still open
            values.extend([head + cell + id_head + key + b"}"
                           for cell, key in zip(block.cell_fragments(dumps), block.labels.key_tails)])
        return values

    # -- checkpoint --------------------------------------------------------------------------------------------
    def state_core(self, with_ledger: bool = True) -> dict:
        """The bounded part of the state, JSON: the aggregator's counters, metrics, period and partial releases,
        and the ledger (written in the same transaction as the rows that spend it)."""
        doc = {"aggregator": self.aggregator.state_core()}
        if with_ledger:
            doc["ledger"] = self.ledger.state_dict()
        return doc

    def state_tables(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every keyed table in full, ``dp:unit.windows`` -> (int64 keys sorted ascending, structured records):
        copies; does not reset what :meth:`state_changes` reports. None without a period."""
        return {TABLE_PREFIX + name: t for name, t in self.aggregator.state_tables().items()}

    def state_changes(self) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """What changed in :meth:`state_tables` since the previous call: ``dp:unit.windows`` -> (keys put, their
        records) and ``dp:unit.windows:deleted`` -> (keys deleted, None), the contract of
        :meth:`stream_anon.engine.Engine.state_changes` (the first call returns every row as put)."""
        return {TABLE_PREFIX + name: t for name, t in self.aggregator.state_changes().items()}

    def table_rows(self) -> int:
        """Rows held by the keyed tables (what a full state record carries of them)."""
        return len(self.aggregator.unit_windows) if self.aggregator.clock else 0

    def record_state(self) -> tuple[dict, dict, int]:
        """What a state record takes of the aggregates: (:meth:`state_core`, :meth:`state_changes`,
        :meth:`table_rows`)."""
        return self.state_core(), self.state_changes(), self.table_rows()

    def state_dict(self, with_ledger: bool = True) -> dict:
        """Core and tables in one JSON document (the unit window counts packed as base64 under
        ``aggregator.unit_windows``): the worker's state record, local checkpoints and tests."""
        doc = {"aggregator": self.aggregator.state_dict()}
        if with_ledger:
            doc["ledger"] = self.ledger.state_dict()
        return doc


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


