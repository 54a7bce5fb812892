"""The incremental anonymization engine: plain Python and numpy, no Kafka, no faust.

The engine is a **window core** with a pluggable **former** (``stream_anon.formers``):

- **Event time.** A record belongs to the window of its event time, ``floor(t / window_s)``. The **watermark**
  is the largest event time seen minus ``[stream] allowed_lateness_s``. A window with records closes when the
  watermark has passed its end and the next window holding records is known (its start is at or below the
  watermark); the close makes one **release** whose ``window_end`` is that next window's start (empty windows in
  between make no release, as before), and emits a :class:`ClosedWindow` (the carried fields of the window's
  records, for window consumers such as the DP aggregates). With ``allowed_lateness_s = 0`` and events in time
  order this is exactly the earlier rule (a window closes when the first event of a later window arrives).
- At a close the former forms classes over the buffered records whose event time is before ``window_end``:
  the closing window's and the deferred ones (records of later windows wait for theirs). k-anonymous classes
  with a strategy (:class:`~stream_anon.formers.kanon.KAnonymousFormer`), or m-invariant ones with counterfeits
  (:class:`~stream_anon.formers.minvariant.MInvariantFormer`). A record left over stays deferred while its deadline
  (event time + ``max_delay_s``) is after the next close. When it is due, the former may place it in a **randomly
  chosen** earlier published class that covers it (choosing the lowest-loss one would leak the true value: CASTLE,
  Cao et al., ICDE 2008, Example 4); otherwise the core suppresses it with a reason.
- **Late events**: an event whose time is below the end of the last release (its window is released) is late.
  It never joins a window or a new class: it waits in the buffer (listed as deferred) and the next release
  handles it by ``[stream] late_policy``: ``"suppress"`` (suppressed with reason ``late``) or ``"next_release"``
  (published under a randomly chosen earlier class whose box covers it, as deadline reuse does; else suppressed
  as ``late``). With m-invariance a signature can only be checked in the former's close, so under
  ``next_release`` a late record enters the next close as a due record (a class of that release, or a random
  earlier class of its signature completed with counterfeits; else suppressed as ``late``). A late event's
  carried fields enter no closed window; :attr:`ClosedWindow.late` and ``Release.late`` count them.

Output does not depend on how the input is cut into batches, and, within the allowed lateness (every event at or
above the watermark when it arrives), not on the arrival order either: the buffer is kept in a canonical order
(event time, then audit token when ``allowed_lateness_s > 0``; event time, then arrival, when it is 0 so that
time-ordered input keeps today's releases), and the randomness of a release comes from (seed, partition,
sequence number).

State (docs/contracts.md, "Engine state"): a bounded **core** (:meth:`Engine.state_core`, JSON) and **keyed
tables** (:mod:`stream_anon.engine.state`): ``seen_events`` (duplicate detection) and, with m-invariance,
``signatures``. :meth:`Engine.state_changes` gives what changed in the tables since its previous call, so a
checkpoint costs what changed; :meth:`Engine.restore` rebuilds an engine from a core and full tables.
"""
from __future__ import annotations

import bisect
import math

import numpy as np

from stream_anon import crypto
from stream_anon.config import StreamConfig
from stream_anon.engine.carried import CarriedWindow, plain_values
from stream_anon.events import UNIT_IDS
from stream_anon.engine.records import RecordReader, Records, SeenEvents
from stream_anon.engine.registry import PublishedClasses
from stream_anon.engine.release import ClassInfo, Rejection, Release, StepResult
from stream_anon.engine.space import QISpace
from stream_anon.engine.state import KeyedTable, compose_state, split_state
from stream_anon.formers.base import (SUPPRESSED_END, SUPPRESSED_LOSS, SUPPRESSED_NO_CLASS, NewClass, Plan,
                                      WindowView, distinct_per_group)
from stream_anon.formers.counterfeits import CounterfeitTokens
from stream_anon.formers.kanon import KAnonymousFormer
from stream_anon.formers.minvariant import SIGNATURE_FIELDS, MInvariantFormer, MInvariantParams
from stream_anon.strategies import make_strategy

STATE_VERSION = 4       # 3: event-time windows (lateness) or keyed tables; 4: both
LATE = "late"      # suppression reason of a late event (an event for a window already released)


class ClosedWindow:
    """A window the core closed: its index and the carried fields of the records whose event time falls in it
    (in the buffer's canonical order, see the module docstring). The DP aggregates consume these; nothing else
    derives windows. ``late``: late events that arrived since the previous closed window (they enter none).

    ``carried`` is decoded from the window's :class:`~stream_anon.engine.carried.CarriedWindow` (``source``: it
    and the canonical order, None when that is the arrival order) when first read: a window handed to another
    process (:mod:`stream_anon.kafka.aggregates_process`) travels as its compact chunks and is decoded there."""

    __slots__ = ("index", "start", "end", "late", "_carried", "_source")

    def __init__(self, index: int, start: float, end: float, carried: dict | None = None, late: int = 0,
                 source: tuple | None = None):
        self.index, self.start, self.end, self.late = index, start, end, late
        self._carried = carried if carried is not None or source is not None else {}
        self._source = source

    @property
    def carried(self) -> dict:
        if self._carried is None:
            window, order = self._source
            self._carried, self._source = window.columns(order), None
        return self._carried

    def __getstate__(self):
        return (self.index, self.start, self.end, self.late, self._carried, self._source)

    def __setstate__(self, state):
        self.index, self.start, self.end, self.late, self._carried, self._source = state

    def __repr__(self) -> str:
        return f"ClosedWindow(index={self.index}, start={self.start}, end={self.end}, late={self.late})"


def event_windows(times: np.ndarray, window_s: float) -> np.ndarray:
    """The engine's window of each record: the window of its event time.

    >>> event_windows(np.array([5.0, 65.0, 30.0, 130.0]), 60.0).tolist()
    [0, 1, 0, 2]
    """
    return np.floor(np.asarray(times, dtype=float) / window_s).astype(np.int64)


class _Buffer:
    """Deferred records, column by column (``late``: arrived for a window already released)."""

    def __init__(self, dims: int):
        self.X = np.empty((0, dims))
        self.units = np.empty(0, dtype=np.int64)
        self.times = np.empty(0)
        self.tokens: list[str] = []
        self.sensitive: list = []
        self.late = np.empty(0, dtype=bool)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, rec: Records, late: np.ndarray) -> None:
        self.X = np.concatenate([self.X, rec.X])
        self.units = np.concatenate([self.units, rec.units])
        self.times = np.concatenate([self.times, rec.times])
        self.tokens += rec.tokens
        self.sensitive += rec.sensitive
        self.late = np.concatenate([self.late, late])

    def take(self, rows: np.ndarray) -> "_Buffer":
        """The rows ``rows`` (in that order) as a new buffer."""
        rows = np.asarray(rows, dtype=np.int64)
        b = _Buffer(self.X.shape[1])
        b.X, b.units, b.times, b.late = self.X[rows], self.units[rows], self.times[rows], self.late[rows]
        b.tokens = [self.tokens[i] for i in rows]
        b.sensitive = [self.sensitive[i] for i in rows]
        return b

    def canonical_order(self, by_token: bool) -> np.ndarray:
        """Rows in the buffer's canonical order: event time, then audit token (``by_token``) or current order."""
        if by_token and len(self):
            return np.lexsort((np.array(self.tokens), self.times))
        return np.argsort(self.times, kind="stable")

    def to_state(self) -> dict:
        return {"X": self.X.tolist(), "units": self.units.tolist(), "times": self.times.tolist(),
                "tokens": self.tokens, "sensitive": [list(s) for s in self.sensitive], "late": self.late.tolist()}

    @classmethod
    def from_state(cls, state: dict, dims: int) -> "_Buffer":
        b = cls(dims)
        if state["tokens"]:
            b.X = np.array(state["X"], dtype=float).reshape(-1, dims)
        b.units = np.array(state["units"], dtype=np.int64)
        b.times = np.array(state["times"], dtype=float)
        b.tokens = list(state["tokens"])
        b.sensitive = [tuple(s) for s in state["sensitive"]]
        b.late = np.array(state.get("late", [False] * len(b.tokens)), dtype=bool)
        return b


def make_former(config: StreamConfig, invariance: bool = True):
    """The former the configuration asks for (``anonymization.m`` set: m-invariant, else k-anonymous).
    ``invariance=False`` only measures what m-invariance costs (benchmarks); no configuration key reaches it."""
    a = config.anonymization
    if a.m is not None:
        return MInvariantFormer(a.m, a.k, MInvariantParams(**a.m_params), config.sensitive,
                                config.invariant_sensitive, a.m_horizon_s, a.max_class_ncp, a.reuse, invariance,
                                units_table=KeyedTable(SIGNATURE_FIELDS))
    return KAnonymousFormer(make_strategy(a.strategy, a.strategy_params), a.k, a.max_class_ncp, a.reuse,
                            config.sensitive, a.criteria)


class Engine:
    """Anonymizes one partition of one stream.

    ``carried``: fields of accepted events handed to window consumers with each :class:`ClosedWindow`
    (the worker passes the DP aggregates' fields); :data:`~stream_anon.events.UNIT_IDS` among them
    carries the records' keyed 64-bit unit ids (int64 array; the ids the engine counts individuals by). ``former``: defaults to :func:`make_former`.

    >>> from stream_anon.engine import Engine, demo_config
    >>> engine = Engine(demo_config(k=2), secret=b"0123456789abcdef")
    >>> events = [{"event_id": f"e{i}", "event_type": "reading", "unit": f"u{i % 4}",
    ...            "time": 10.0 * i, "value": float(i)} for i in range(8)]
    >>> result = engine.process(events + [{"event_id": "e9", "event_type": "reading", "unit": "u1",
    ...                                    "time": 100.0, "value": 1.0}])
    >>> [r.published for r in result.releases], [w.index for w in result.windows]
    ([6], [0])
    >>> min(c.individuals for c in result.releases[0].classes) >= 2
    True
    """

    def __init__(self, config: StreamConfig, partition: int = 0, secret: bytes | None = None,
                 carried: tuple[str, ...] = (), former=None):
        self.config = config
        self.partition = int(partition)
        self.secret = secret if secret is not None else crypto.throwaway_secret()
        self._counterfeit_tokens = CounterfeitTokens(self.secret)
        self.space = QISpace(config)
        self.reader = RecordReader(config, self.space, self.secret, carried)
        self.former = former if former is not None else make_former(config)
        a = config.anonymization
        self.k, self.window_s, self.max_delay_s = a.k, a.window_s, a.max_delay_s
        self.lateness = float(config.stream.allowed_lateness_s)
        self.late_policy = config.stream.late_policy
        self.buffer = _Buffer(self.space.dims)
        self.registry = PublishedClasses(self.space, a.reuse_horizon_s, a.reuse_max_classes)
        self.seq = 0
        self.max_event_time = -np.inf     # largest event time seen
        self.closed_until = -np.inf       # end of the last release: an event time below it is late
        # windows with records not released yet: index -> {"times", "tokens", "carried": CarriedWindow}
        self.pending: dict[int, dict] = {}
        self.late_unreported = 0          # late events since the last ClosedWindow
        self.late_total = 0               # late events ever (metrics)
        self.seen_events = KeyedTable(SeenEvents.FIELDS)
        self.reader.largest_time = lambda: self.max_event_time     # reference of max_future_s and duplicates
        horizon = config.limits.duplicate_horizon_s
        if horizon > 0:     # duplicates are judged against the largest event time seen (not the watermark)
            self.reader.seen = SeenEvents(self.seen_events, horizon, lambda: self.max_event_time)

    @property
    def watermark(self) -> float:
        """Largest event time seen minus the allowed lateness."""
        return self.max_event_time - self.lateness

    def _watermark_window(self) -> float:
        """Index of the window holding the watermark (-inf before any event)."""
        wm = self.watermark
        return math.floor(wm / self.window_s) if np.isfinite(wm) else -np.inf

    # -- public API -------------------------------------------------------------------------------------------
    def process(self, events) -> StepResult:
        """Feed a batch (list of event dicts, or a DataFrame with dotted column names) in arrival order."""
        records, rejected = self.reader.read(events)
        result = self.process_records(records)
        if rejected:
            if isinstance(events, list):
                result.rejected = [Rejection(events[i], reason) for i, reason in rejected]
            else:
                cols, _ = self.reader.columns(events)
                result.rejected = [Rejection({c: cols[c][i] for c in cols}, reason) for i, reason in rejected]
        return result

    def process_records(self, rec: Records) -> StepResult:
        """Feed records read by ``self.reader`` (the worker reads them itself to keep input positions).

        Records are taken one by one in arrival order (a batch is cut where a release becomes possible, so
        batch boundaries do not matter): a record below ``closed_until`` is late, any other joins the window of
        its event time; after it, every window that can close closes (module docstring)."""
        result = StepResult()
        n = len(rec)
        if n == 0:
            return result
        ws = self.window_s
        times = rec.times.tolist()
        wins = event_windows(rec.times, ws).tolist()
        late = np.zeros(n, dtype=bool)
        keys = sorted(self.pending)
        opened: set[int] = set()
        start = 0
        c = self._watermark_window()
        for i in range(n):
            t = times[i]
            if t < self.closed_until:
                late[i] = True
                continue
            w = wins[i]
            if w not in self.pending and w not in opened:
                bisect.insort(keys, w)
                opened.add(w)
            if t > self.max_event_time:
                self.max_event_time = t
                c = self._watermark_window()
            if len(keys) >= 2 and keys[1] <= c:
                self._add(rec.slice(start, i + 1), late[start:i + 1], wins[start:i + 1])
                opened.clear()
                start = i + 1
                while len(keys) >= 2 and keys[1] <= c:
                    self._close(result, keys.pop(0), keys[0] * ws, final=False)
        if start < n:
            self._add(rec.slice(start, n), late[start:n], wins[start:n])
        return result

    def flush(self) -> StepResult:
        """End of stream: close every window with records and resolve every deferred (and late) record now."""
        result = StepResult()
        keys = sorted(self.pending)
        for j, w in enumerate(keys):
            end = keys[j + 1] * self.window_s if j + 1 < len(keys) else (w + 1) * self.window_s
            self._close(result, w, end, final=j + 1 == len(keys))
        if not keys and len(self.buffer):       # only deferred or late records left (a flush after a flush)
            w = int(np.floor(self.closed_until / self.window_s))
            self._close(result, w, (w + 1) * self.window_s, final=True)
        return result

    @property
    def deferred(self) -> int:
        return len(self.buffer)

    @property
    def deferred_tokens(self) -> list[str]:
        """Audit tokens of the records still waiting for a class (late ones included)."""
        return list(self.buffer.tokens)

    # -- state ------------------------------------------------------------------------------------------------
    def _tables(self) -> dict[str, KeyedTable]:
        tables = {"seen_events": self.seen_events}
        tables.update(getattr(self.former, "state_tables", dict)())
        return tables

    def state_core(self, raw_json: bool = False) -> dict:
        """The bounded part of the state, JSON-serializable (no secret in it): event-time position, buffer,
        windows pending release, published classes, former core (signature list, value dictionary, counterfeit
        pool, statistics) and the record layout of each keyed table (``tables``: name -> numpy dtype).
        ``raw_json``: the pending windows' carried fields as ``orjson.Fragment`` where they are held as JSON
        (written as they are; the worker's state records, which orjson encodes), else as lists.

        Not a copy: the core shares lists and dicts with the engine (buffer, open windows, published registry,
        former) that grow in place as it goes on; serialize it before processing more (the worker keeps what it
        wrote, ``StateRecord.value``)."""
        former = getattr(self.former, "state_core", self.former.state_dict)()
        return {"version": STATE_VERSION, "stream": self.config.stream.name, "partition": self.partition,
                "seq": self.seq, "max_event_time": _finite_or_none(self.max_event_time),
                "closed_until": _finite_or_none(self.closed_until), "buffer": self.buffer.to_state(),
                "pending": {str(w): {**p, "carried": p["carried"].to_state(raw_json)}
                            for w, p in sorted(self.pending.items())},
                "late_unreported": self.late_unreported, "late_total": self.late_total,
                "published": self.registry.state_dict(),
                "former": {"kind": type(self.former).__name__, **former},
                "tables": {name: t.dtype.descr for name, t in self._tables().items()}}

    def state_tables(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every keyed table in full: name -> (int64 keys sorted ascending, structured records of the table's
        dtype). Copies; does not reset what :meth:`state_changes` reports."""
        return {name: t.snapshot() for name, t in self._tables().items()}

    def state_changes(self) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """What changed in the keyed tables since the previous call, per table ``name``:

        * ``name``: ``(keys, rows)``: keys put (inserted or overwritten), int64 sorted unique, with their current
          records (structured array of the table's dtype, aligned with keys);
        * ``name + ":deleted"``: ``(keys, None)``: keys deleted (expired) and not put again since; ``None`` in
          place of the records is a tombstone (a Kafka compacted topic's null value).

        A key appears in at most one of the two. The first call on an engine (new, or built by :meth:`restore` /
        :meth:`from_state`) returns every row as put and no deletion (its base is an empty table); until then no
        change log is kept. Applying every change set in order to the first one gives :meth:`state_tables`.
        """
        out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for name, table in self._tables().items():
            keys, rows, deleted = table.changes()
            out[name] = (keys, rows)
            out[name + ":deleted"] = (deleted, None)
        return out

    def table_rows(self) -> int:
        """Rows held by the keyed tables (what a full state record carries besides the core)."""
        return sum(len(t) for t in self._tables().values())

    def state_dict(self) -> dict:
        """Core and full tables in one JSON document (tests, the audit harness, the worker's state record)."""
        return compose_state(self.state_core(), self.state_tables())

    @classmethod
    def from_state(cls, config: StreamConfig, state: dict, secret: bytes | None = None,
                   carried: tuple[str, ...] = ()) -> "Engine":
        """Inverse of :meth:`state_dict`."""
        core, tables = split_state(state)
        return cls.restore(config, state["partition"], secret, core, tables, carried)

    @classmethod
    def restore(cls, config: StreamConfig, partition: int, secret: bytes | None, core: dict,
                tables: dict[str, tuple[np.ndarray, np.ndarray]], carried: tuple[str, ...] = ()) -> "Engine":
        """An engine from :meth:`state_core` and :meth:`state_tables` (a missing table is empty)."""
        if core.get("version") != STATE_VERSION:
            raise ValueError(f"engine state version {core.get('version')!r} is not {STATE_VERSION}")
        if core["stream"] != config.stream.name:
            raise ValueError(f"checkpoint is for stream {core['stream']!r}, not {config.stream.name!r}")
        if int(core["partition"]) != int(partition):
            raise ValueError(f"checkpoint is for partition {core['partition']}, not {partition}")
        engine = cls(config, partition, secret, carried)
        former = dict(core["former"])
        kind = former.pop("kind")
        if kind != type(engine.former).__name__:
            raise ValueError(f"checkpoint was made by the {kind} former, the config asks for "
                             f"{type(engine.former).__name__}: switching would drop or invent m-invariance "
                             "signatures")
        if hasattr(engine.former, "load_core"):
            engine.former.load_core(former)
            engine.former.load_tables(tables)
        else:
            engine.former.load_state(former)
        if "seen_events" in tables:
            keys, rows = tables["seen_events"]
            engine.seen_events.load(keys, np.asarray(rows, dtype=engine.seen_events.dtype))
        engine.seq = core["seq"]
        engine.max_event_time = -np.inf if core["max_event_time"] is None else float(core["max_event_time"])
        engine.closed_until = -np.inf if core["closed_until"] is None else float(core["closed_until"])
        engine.buffer = _Buffer.from_state(core["buffer"], engine.space.dims)
        engine.registry.load_state(core["published"])
        engine.pending = {}
        for w, p in core["pending"].items():
            saved = p.get("carried", {})
            if UNIT_IDS in engine.reader.carried and UNIT_IDS not in saved and engine.reader.unit_field in saved:
                # written before the unit ids were carried: the same ids, from the units saved
                saved = {**saved, UNIT_IDS: engine.reader.unit_ids(plain_values(saved)[engine.reader.unit_field])}
            engine.pending[int(w)] = {"times": list(p["times"]), "tokens": list(p["tokens"]),
                                      "carried": CarriedWindow.from_state(engine.reader.carried, saved,
                                                                          len(p["times"]), {UNIT_IDS: np.int64})}
        engine.late_unreported = int(core.get("late_unreported", 0))
        engine.late_total = int(core.get("late_total", 0))
        return engine

    # -- internals --------------------------------------------------------------------------------------------
    def _add(self, rec: Records, late: np.ndarray, wins: list[int]) -> None:
        """Buffer records (in canonical order) and file the carried fields of the on-time ones by window."""
        n_old = len(self.buffer)
        self.buffer.append(rec, late)
        step = np.diff(self.buffer.times[max(n_old - 1, 0):])
        # already canonical when the new rows continue the time order (strictly, when ties are ordered by token)
        if not ((step > 0).all() if self.lateness > 0 else (step >= 0).all()):
            self.buffer = self.buffer.take(self.buffer.canonical_order(self.lateness > 0))
        n_late = int(late.sum())
        self.late_unreported += n_late
        self.late_total += n_late
        if not len(wins):
            return
        # column by column, one window at a time (a chunk's records are nearly always of one window)
        wins_a = np.asarray(wins, dtype=np.int64)
        on_time = ~np.asarray(late, dtype=bool)
        if on_time.all() and wins_a[0] == wins_a[-1] and (wins_a == wins_a[0]).all():
            groups = [(wins[0], None)]                       # None: every record, no copy by index
        else:
            groups = [(int(w), np.flatnonzero(on_time & (wins_a == w)).tolist())
                      for w in np.unique(wins_a[on_time])]
        times = rec.times.tolist()
        for w, idx in groups:
            p = self.pending.get(w)
            if p is None:
                p = self.pending[w] = {"times": [], "tokens": [], "carried": CarriedWindow(self.reader.carried)}
            if idx is None:
                p["times"] += times
                p["tokens"] += rec.tokens
                p["carried"].append(rec.carried)
            else:
                p["times"] += [times[i] for i in idx]
                p["tokens"] += [rec.tokens[i] for i in idx]
                p["carried"].append({f: col[idx] if type(col) is np.ndarray else [col[i] for i in idx]
                                     for f, col in rec.carried.items()})

    def _close(self, result: StepResult, w: int, window_end: float, final: bool) -> None:
        """Release window ``w`` (records before ``window_end``) and hand its carried fields on."""
        p = self.pending.pop(w, None) or {"times": [], "tokens": [], "carried": CarriedWindow(self.reader.carried)}
        if self.lateness > 0:
            order = np.lexsort((np.array(p["tokens"]), np.array(p["times"]))) if p["tokens"] else []
        else:
            order = np.argsort(np.array(p["times"]), kind="stable")
        in_arrival_order = not len(order) or (np.diff(order) == 1).all()
        start = w * self.window_s
        result.windows.append(ClosedWindow(w, start, start + self.window_s, late=self.late_unreported,
                                           source=(p["carried"], None if in_arrival_order else order)))
        self.late_unreported = 0
        result.releases.append(self._release(start, window_end, final))
        self.closed_until = max(self.closed_until, window_end)

    def _release(self, window_start: float, window_end: float, final: bool) -> Release:
        a = self.config.anonymization
        rng = np.random.default_rng([a.seed, self.partition, self.seq])
        release_id = f"{self.config.stream.name}-p{self.partition}-{self.seq:06d}"
        buf, former = self.buffer, self.former
        eligible = ~buf.late & (buf.times < window_end)
        form_idx, late_idx = np.flatnonzero(eligible), np.flatnonzero(buf.late)
        rest = buf.take(np.flatnonzero(~eligible & ~buf.late))      # later windows' records: they wait
        work = buf.take(np.concatenate([form_idx, late_idx])) if len(rest) or len(late_idx) else buf
        nf, nl = len(form_idx), len(late_idx)
        # with m-invariance a late record goes through the former's close as a due record (its signature can only
        # be checked there); otherwise the former never sees it when forming (handled below)
        in_view = nl if self.late_policy == "next_release" and getattr(former, "m", None) is not None else 0
        nv = nf + in_view
        self.registry.expire(window_end)
        former.expire(window_end)
        if self.reader.seen is not None:
            self.reader.seen.expire(self.max_event_time)
        due = np.concatenate([(work.times[:nf] + self.max_delay_s < window_end + self.window_s) | final,
                              np.ones(in_view, dtype=bool)])
        view = WindowView(work.X[:nv], work.units[:nv], work.times[:nv], work.sensitive[:nv], due, final,
                          window_end, self.space, rng, self.registry)
        plan = former.form(view)
        placed = np.zeros(len(work), dtype=bool)
        for nc in plan.new_classes:
            placed[nc.rows] = True
        reused = self._exact_cover(plan.reused, work.X)
        for rows in reused.values():
            placed[rows] = True
        suppressed_rows = {reason: list(rows) for reason, rows in plan.suppressed.items()}
        resolved = np.zeros(len(work), dtype=bool)
        for rows in suppressed_rows.values():
            resolved[rows] = True
        # due leftovers: an earlier class chosen by the former, else suppressed
        leftovers = np.flatnonzero(due & ~placed[:nv] & ~resolved[:nv])
        for c, rows in self._exact_cover(former.reuse(view, leftovers, plan), work.X).items():
            reused.setdefault(c, []).extend(rows)
            placed[rows] = True
        loss = plan.loss_rejected
        for i in np.flatnonzero(due & ~placed[:nv] & ~resolved[:nv]).tolist():
            reason = LATE if i >= nf else SUPPRESSED_LOSS if loss is not None and loss[i] else (
                SUPPRESSED_END if final else SUPPRESSED_NO_CLASS)
            suppressed_rows.setdefault(reason, []).append(i)
            resolved[i] = True
        if nl > in_view:
            # late records: never in a new class; a random earlier class covering them, or suppressed as late
            late_rows = np.arange(nf, nf + nl)
            if self.late_policy == "next_release":
                late_view = WindowView(work.X, work.units, work.times, work.sensitive, np.ones(len(work), bool),
                                       final, window_end, self.space, rng, self.registry)
                for c, rows in self._exact_cover(former.reuse(late_view, late_rows, Plan()), work.X).items():
                    reused.setdefault(c, []).extend(rows)
                    placed[rows] = True
            for i in late_rows[~placed[late_rows]].tolist():
                suppressed_rows.setdefault(LATE, []).append(i)
                resolved[i] = True
        release = self._build_release(work, view, release_id, window_start, plan.new_classes, reused,
                                      suppressed_rows)
        release.late = nl       # late events this release handled (published under next_release or suppressed)
        keep = work.take(np.flatnonzero(~(placed | resolved)))     # deferred (late ones never stay)
        self.buffer = _concat(keep, rest)
        # deferred: records a close has seen and left waiting (the records of open windows are in no manifest yet)
        release.deferred_tokens = list(keep.tokens)
        self.seq += 1
        return release

    def _exact_cover(self, reused: dict[int, list[int]], X: np.ndarray) -> dict[int, list[int]]:
        """Reuse decisions kept only where the earlier class's published H3 cells hold the record (the registry's
        boxes for H3 geopoints lie inside their cells; this is the exact test). Without H3 QIs: unchanged."""
        if not self.space.h3_qis:
            return reused
        out: dict[int, list[int]] = {}
        for c, rows in reused.items():
            ok = [r for r in rows if self.space.in_published_cells(X[r], self.registry.gen[c])]
            if ok:
                out[c] = ok
        return out

    def _build_release(self, buf: _Buffer, view: WindowView, release_id: str, window_start: float,
                       new_classes: list[NewClass], reused: dict[int, list[int]],
                       suppressed_rows: dict[str, list[int]]) -> Release:
        reg, former = self.registry, self.former
        groups = []     # (class id, generalization, ncp, reused, tag, rows) in release order
        if new_classes:
            sizes = np.array([len(nc.rows) for nc in new_classes])
            Xc = buf.X[np.concatenate([nc.rows for nc in new_classes])]
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            lo, hi = np.minimum.reduceat(Xc, starts, axis=0), np.maximum.reduceat(Xc, starts, axis=0)
            members = [buf.X[nc.rows] for nc in new_classes] if self.space.h3_qis else None
            lo, hi, labels = self.space.snap(lo, hi, members)
            ncp = self.space.ncp(lo, hi, labels)
            for j, nc in enumerate(new_classes):
                groups.append((f"{release_id}-c{j:04d}", self.space.describe(lo[j], hi[j], labels[j]),
                               float(ncp[j]), False, nc.tag, nc.rows))
            reg.register(lo, hi, [g[0] for g in groups], [g[1] for g in groups], ncp, view.window_end,
                         [nc.tag for nc in new_classes] if former.registry_tags else None)
        for c, rows in sorted(reused.items()):
            groups.append((reg.ids[c], reg.gen[c], float(reg.ncp[c]), True, int(reg.tag[c]),
                           np.array(rows, dtype=np.int64)))
        published_rows = [r for nc in new_classes for r in nc.rows.tolist()] + \
                         [r for rows in reused.values() for r in rows]
        extras = former.complete(view, [(g[0], g[5], g[4]) for g in groups], published_rows)
        classes: list[ClassInfo] = []
        rec_class, rec_sens, rec_tok, rec_ncp, rec_cf = [], [], [], [], []
        if groups:
            n_reals = distinct_per_group(buf.units[np.concatenate([g[5] for g in groups])],
                                         np.array([len(g[5]) for g in groups])).tolist()
        for ci, ((cid, gen, ncp_c, is_reused, _, rows), extra) in enumerate(zip(groups, extras)):
            rl = rows.tolist()
            n_real = n_reals[ci]
            rec_class += [ci] * len(rl)
            rec_sens += [buf.sensitive[r] for r in rl]
            rec_tok += [buf.tokens[r] for r in rl]
            rec_ncp += [ncp_c] * len(rl)
            rec_cf += [False] * len(rl)
            n_cf_ind, n_cf_rec = 0, 0
            if extra is not None:
                n_cf_ind, n_cf_rec = extra.individuals, len(extra.sensitive)
                rec_class += [ci] * n_cf_rec
                rec_sens += extra.sensitive
                rec_tok += self._counterfeit_tokens(release_id, cid, n_cf_rec)
                rec_ncp += [ncp_c] * n_cf_rec
                rec_cf += [True] * n_cf_rec
            classes.append(ClassInfo(cid, gen, n_real, len(rl) + n_cf_rec, ncp_c, is_reused,
                                     counterfeit_individuals=n_cf_ind, counterfeit_records=n_cf_rec))
        m = getattr(former, "m", None)
        order = view.rng.permutation(len(rec_tok)) if former.shuffle_records else np.arange(len(rec_tok))
        return Release(
            release_id=release_id, stream=self.config.stream.name, partition=self.partition, seq=self.seq,
            window_start=window_start, window_end=view.window_end,
            # the largest event time of the records the release closed over: with time-ordered input the
            # watermark at the close, and independent of the arrival order within the allowed lateness
            watermark=float(view.times.max()) if len(view) else self.watermark, k=self.k,
            classes=classes,
            record_class=np.array(rec_class, dtype=np.int64)[order] if rec_tok else np.empty(0, dtype=np.int64),
            record_sensitive=[rec_sens[i] for i in order],
            record_token=[rec_tok[i] for i in order],
            record_ncp=np.array(rec_ncp, dtype=float)[order] if rec_tok else np.empty(0),
            sensitive_fields=self.config.sensitive,
            suppressed_tokens={reason: [buf.tokens[i] for i in rows] for reason, rows in suppressed_rows.items()},
            max_suppression_ratio=self.config.anonymization.max_suppression_ratio,
            record_counterfeit=(np.array(rec_cf, dtype=bool)[order] if rec_tok else np.empty(0, dtype=bool))
            if m is not None else None,
            m=m,
        )


def _concat(a: _Buffer, b: _Buffer) -> _Buffer:
    if not len(b):
        return a
    if not len(a):
        return b
    out = _Buffer(a.X.shape[1])
    out.X, out.units = np.concatenate([a.X, b.X]), np.concatenate([a.units, b.units])
    out.times, out.late = np.concatenate([a.times, b.times]), np.concatenate([a.late, b.late])
    out.tokens, out.sensitive = a.tokens + b.tokens, a.sensitive + b.sensitive
    return out


def _finite_or_none(x: float):
    return float(x) if np.isfinite(x) else None
