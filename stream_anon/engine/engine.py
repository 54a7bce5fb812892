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

State: the engine is a :class:`~stream_anon.checkpoint.Checkpointable`: a bounded **core**
(:meth:`Engine.state_core`: positions, counters, the former's core) and **keyed tables** (:meth:`Engine.state_tables`):
``seen_events`` (duplicate detection), ``buffer`` and ``windows`` (the buffered records and the open windows'
carried fields, in chunks: :mod:`stream_anon.engine.buffer`), ``published`` (the classes that may be reused) and
the former's (``former/signatures`` with m-invariance). A state record carries what changed in them
(:func:`stream_anon.checkpoint.changes`); :meth:`Engine.restore` rebuilds an engine from a core and full tables.
"""
from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np

from stream_anon import checkpoint, crypto
from stream_anon.config import StreamConfig
from stream_anon.engine.assemble import assemble_release
from stream_anon.engine.buffer import Buffer, OpenWindows
from stream_anon.engine.carried import CarriedWindow
from stream_anon.engine.decide import decide_close
from stream_anon.engine.records import Records, RecordReader, SeenEvents
from stream_anon.engine.registry import PublishedClasses
from stream_anon.engine.release import Rejection, Release, StepResult
from stream_anon.engine.space import QISpace
from stream_anon.formers.base import Former, WindowView
from stream_anon.formers.counterfeits import CounterfeitTokens
from stream_anon.formers.kanon import KAnonymousFormer
from stream_anon.formers.minvariant import MInvariantFormer, MInvariantParams
from stream_anon.formers.signatures import SIGNATURE_FIELDS
from stream_anon.keyed_table import KeyedTable
from stream_anon.strategies import make_strategy

STATE_VERSION = 5       # 5: buffer, open windows and published classes as keyed tables of chunks
FORMER_TABLES = "former/"      # prefix of the former's tables among the engine's


class ClosedWindow:
    """A window the core closed: its index and the carried fields of the records whose event time falls in it
    (in the buffer's canonical order, see the module docstring). The DP aggregates consume these; nothing else
    derives windows. ``late``: late events that arrived since the previous closed window (they enter none).

    ``carried`` is decoded from the window's :class:`~stream_anon.engine.carried.CarriedWindow` (``source``: it
    and the canonical order, None when that is the arrival order) when first read: a window handed to another
    process (:mod:`stream_anon.worker.aggregates_process`) travels as its compact chunks and is decoded there."""

    __slots__ = ("index", "start", "end", "late", "_carried", "_source")

    def __init__(self, index: int, start: float, end: float, carried: dict | None = None, late: int = 0,
                 source: tuple | None = None):
        self.index, self.start, self.end, self.late = index, start, end, late
        self._carried = carried if carried is not None or source is not None else {}
        self._source = source

    @property
    def carried(self) -> dict:
        if self._carried is None:
            assert self._source is not None        # set whenever carried is not (__init__)
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


def make_former(config: StreamConfig, invariance: bool = True) -> Former:
    """The former the configuration asks for (``anonymization.m`` set: m-invariant, else k-anonymous).
    ``invariance=False`` only measures what m-invariance costs (benchmarks); no configuration key reaches it."""
    a = config.anonymization
    if a.m is not None:
        if config.invariant_sensitive is None:      # the configuration requires it with m (sensitive.invariant)
            raise ValueError("anonymization.m needs sensitive.invariant")
        return MInvariantFormer(a.m, a.k, MInvariantParams(**a.m_params), config.sensitive,
                                config.invariant_sensitive, a.m_horizon_s, a.max_class_ncp, a.reuse, invariance,
                                units_table=KeyedTable(SIGNATURE_FIELDS))
    return KAnonymousFormer(make_strategy(a.strategy, a.strategy_params), a.k, a.max_class_ncp, a.reuse,
                            config.sensitive, a.criteria)


class Engine:
    """Anonymizes one partition of one stream (the window core; module docstring).

    ``carried``: fields of accepted events handed to window consumers with each :class:`ClosedWindow`
    (the worker passes the DP aggregates' fields); :data:`~stream_anon.events.UNIT_IDS` among them
    carries the records' keyed 64-bit unit ids (int64 array; the ids the engine counts individuals by).
    ``former``: defaults to :func:`make_former`.

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
                 carried: tuple[str, ...] = (), former: Former | None = None, lineage: str | None = None):
        self.config = config
        self.partition = int(partition)
        # the stream's lineage (stream_anon.kafka.lineage): part of every release id, so that ids never repeat
        # across lineages (None: a stream of no lineage, e.g. a file run: <stream>-p<p>-<seq>)
        self.lineage = lineage
        self.secret = secret if secret is not None else crypto.throwaway_secret()
        self.kid = crypto.key_id(self.secret)
        self.counterfeit_tokens = CounterfeitTokens(self.secret)   # the counterfeit records' tokens (assemble.py)
        self.space = QISpace(config)
        a = config.anonymization
        self.seen_events = KeyedTable(SeenEvents.FIELDS)
        horizon = config.limits.duplicate_horizon_s
        # duplicates are judged against the largest event time seen (not the watermark)
        self.seen = SeenEvents(self.seen_events, horizon) if horizon > 0 else None
        self.reader = RecordReader(config, self.space, self.secret, carried, seen=self.seen)
        self.former: Former = former if former is not None else make_former(config)
        self.k, self.window_s, self.max_delay_s = a.k, a.window_s, a.max_delay_s
        self.lateness = float(config.stream.allowed_lateness_s)
        self.late_policy = config.stream.late_policy
        self.buffer = Buffer(self.space.dims, by_token=self.lateness > 0)
        self.windows = OpenWindows(self.reader.carried)      # windows with records not released yet
        self.registry = PublishedClasses(self.space, a.reuse_horizon_s, a.reuse_max_classes)
        self.seq = 0
        self.max_event_time = -np.inf     # largest event time seen
        self.closed_until = -np.inf       # end of the last release: an event time below it is late
        self.late_unreported = 0          # late events since the last ClosedWindow
        self.late_total = 0               # late events ever (metrics)
        self.next_rid = 0                 # arrival serial of the next buffered record
        self.next_chunk = 0               # serial of the next state chunk (buffer and windows)

    @property
    def watermark(self) -> float:
        """Largest event time seen minus the allowed lateness."""
        return self.max_event_time - self.lateness

    def _watermark_window(self) -> float:
        """Index of the window holding the watermark (-inf before any event)."""
        wm = self.watermark
        return math.floor(wm / self.window_s) if np.isfinite(wm) else -np.inf

    # -- public API -------------------------------------------------------------------------------------------
    def read(self, events, columns: dict | None = None) -> tuple[Records, list[tuple[int, str]]]:
        """The reader's records and rejections of a batch, judged against this engine's event time (duplicates,
        ``max_future_s``); hand the records to :meth:`process_records`. ``columns``: fields already read from the
        same events (:meth:`RecordReader.columns`)."""
        return self.reader.read(events, self.max_event_time, columns)

    def process(self, events) -> StepResult:
        """Feed a batch (list of event dicts, or a DataFrame with dotted column names) in arrival order."""
        records, rejected = self.read(events)
        result = self.process_records(records)
        if rejected:
            if isinstance(events, list):
                result.rejected = [Rejection(events[i], reason) for i, reason in rejected]
            else:
                cols, _ = self.reader.columns(events)
                result.rejected = [Rejection({c: cols[c][i] for c in cols}, reason) for i, reason in rejected]
        return result

    def process_records(self, rec: Records) -> StepResult:
        """Feed records read by :meth:`read` (the worker reads them itself to keep input positions).

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
        keys = self.windows.keys()
        opened: set[int] = set()
        start = 0
        c = self._watermark_window()
        for i in range(n):
            t = times[i]
            if t < self.closed_until:
                late[i] = True
                continue
            w = wins[i]
            if w not in self.windows and w not in opened:
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
        keys = self.windows.keys()
        for j, w in enumerate(keys):
            end = keys[j + 1] * self.window_s if j + 1 < len(keys) else (w + 1) * self.window_s
            self._close(result, w, end, final=j + 1 == len(keys))
        if not keys and len(self.buffer):       # only deferred or late records left (a flush after a flush)
            w = int(np.floor(self.closed_until / self.window_s))
            self._close(result, w, (w + 1) * self.window_s, final=True)
        result.releases = [dataclasses.replace(rel, flushed=True) for rel in result.releases]
        return result

    @property
    def deferred(self) -> int:
        return len(self.buffer)

    @property
    def deferred_tokens(self) -> list[str]:
        """Audit tokens of the records still waiting for a class (late ones included)."""
        return list(self.buffer.tokens)

    # -- state (stream_anon.checkpoint) -----------------------------------------------------------------------
    def state_core(self) -> dict:
        """The bounded part of the state, JSON-serializable (no secret in it): event-time position, counters,
        serials, the published classes' and the former's cores. Not a copy: serialize it before processing
        more."""
        return {"version": STATE_VERSION, "stream": self.config.stream.name, "partition": self.partition,
                "seq": self.seq, "max_event_time": _finite_or_none(self.max_event_time),
                "closed_until": _finite_or_none(self.closed_until), "late_unreported": self.late_unreported,
                "late_total": self.late_total, "next_rid": self.next_rid, "next_chunk": self.next_chunk,
                "published": self.registry.state_core(),
                "former": {"kind": type(self.former).__name__, **self.former.state_core()}}

    def state_tables(self) -> dict:
        """The engine's keyed tables by name (live; the chunked ones brought up to date): see the module
        docstring."""
        tables = {"seen_events": self.seen_events, **self.buffer.state_tables(), **self.windows.state_tables(),
                  **self.registry.state_tables()}
        tables.update({FORMER_TABLES + name: t for name, t in self.former.state_tables().items()})
        return tables

    def load_state(self, core: dict, tables: checkpoint.Tables) -> None:
        """On an engine just built from the configuration: the state of :meth:`state_core` and the tables in full
        (name -> (keys, rows)). Refuses a state of another version, stream, partition or former."""
        if core.get("version") != STATE_VERSION:
            raise ValueError(f"engine state version {core.get('version')!r} is not {STATE_VERSION}")
        if core["stream"] != self.config.stream.name:
            raise ValueError(f"checkpoint is for stream {core['stream']!r}, not {self.config.stream.name!r}")
        if int(core["partition"]) != self.partition:
            raise ValueError(f"checkpoint is for partition {core['partition']}, not {self.partition}")
        former = dict(core["former"])
        kind = former.pop("kind")
        if kind != type(self.former).__name__:
            raise ValueError(f"checkpoint was made by the {kind} former, the config asks for "
                             f"{type(self.former).__name__}: switching would drop or invent m-invariance "
                             "signatures")
        own = {"seen_events", "buffer", "windows", "published"}
        unknown = sorted(n for n in tables if n not in own and not n.startswith(FORMER_TABLES))
        if unknown:
            raise ValueError(f"engine state holds unknown table(s) {unknown}")
        self.former.load_state(former, {n[len(FORMER_TABLES):]: t for n, t in tables.items()
                                        if n.startswith(FORMER_TABLES)})
        keys, rows = tables.get("seen_events", (np.empty(0, dtype=np.int64), np.empty(0, self.seen_events.dtype)))
        self.seen_events.load(keys, np.asarray(rows, dtype=self.seen_events.dtype))
        self.buffer.load_state(tables)
        self.windows.load_state(tables)
        self.registry.load_state(core["published"], tables)
        self.seq = int(core["seq"])
        self.max_event_time = -np.inf if core["max_event_time"] is None else float(core["max_event_time"])
        self.closed_until = -np.inf if core["closed_until"] is None else float(core["closed_until"])
        self.late_unreported, self.late_total = int(core["late_unreported"]), int(core["late_total"])
        self.next_rid, self.next_chunk = int(core["next_rid"]), int(core["next_chunk"])

    @classmethod
    def restore(cls, config: StreamConfig, partition: int, secret: bytes | None, core: dict, tables: dict,
                carried: tuple[str, ...] = (), lineage: str | None = None) -> "Engine":
        """An engine from :meth:`state_core` and the tables in full (a missing table is empty)."""
        engine = cls(config, partition, secret, carried, lineage=lineage)
        engine.load_state(core, tables)
        return engine

    # -- internals --------------------------------------------------------------------------------------------
    def _add(self, rec: Records, late: np.ndarray, wins: list[int]) -> None:
        """Buffer records (in canonical order) and file the carried fields of the on-time ones by window."""
        self.buffer.append(rec, late, self.next_rid, self.next_chunk)
        self.next_rid += len(rec)
        n_late = int(late.sum())
        self.late_unreported += n_late
        self.late_total += n_late
        self.next_chunk = self.windows.add(rec, late, wins, self.next_chunk + 1)

    def _close(self, result: StepResult, w: int, window_end: float, final: bool) -> None:
        """Release window ``w`` (records before ``window_end``) and hand its carried fields on."""
        p = self.windows.pop(w) or {"times": [], "tokens": [], "carried": CarriedWindow(self.reader.carried)}
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
        release_id = release_name(self.config.stream.name, self.lineage, self.partition, self.seq)
        buf, former = self.buffer, self.former
        eligible = ~buf.late & (buf.times < window_end)
        form_idx, late_idx = np.flatnonzero(eligible), np.flatnonzero(buf.late)
        rest_idx = np.flatnonzero(~eligible & ~buf.late)       # later windows' records: they wait
        work_idx = np.concatenate([form_idx, late_idx])
        work = buf.take(work_idx)
        nf, nl = len(form_idx), len(late_idx)
        # with m-invariance a late record goes through the former's close as a due record (its signature can only
        # be checked there); otherwise the former never sees it when forming (handled below)
        in_view = nl if self.late_policy == "next_release" and former.m is not None else 0
        nv = nf + in_view
        self.registry.expire(window_end)
        former.expire(window_end)
        if self.seen is not None:
            self.seen.expire(self.max_event_time)
        due = np.concatenate([(work.times[:nf] + self.max_delay_s < window_end + self.window_s) | final,
                              np.ones(in_view, dtype=bool)])
        view = WindowView(work.X[:nv], work.units[:nv], work.times[:nv], work.sensitive[:nv], due, final,
                          window_end, self.space, rng, self.registry)
        d = decide_close(former, self.registry, view, work, nf, nl, in_view, self.late_policy, self.k)
        # deferred: records a close has seen and left waiting (late ones never stay; the records of open windows
        # are in no manifest yet)
        waiting = np.flatnonzero(~(d.placed | d.resolved))
        release = assemble_release(self, work, view, release_id, window_start, d.plan.new_classes, d.reused,
                                   d.suppressed, deferred_tokens=[work.tokens[i] for i in waiting.tolist()],
                                   late=nl)
        self.buffer.keep(np.concatenate([work_idx[waiting], rest_idx]))
        self.seq += 1
        return release


def release_name(stream: str, lineage: str | None, partition: int, seq: int) -> str:
    """A release's id: ``<stream>-<lineage>-p<partition>-<seq>`` (``<stream>-p<partition>-<seq>`` without a lineage).

    >>> release_name("fares", "L0a1b2c3d", 2, 7), release_name("fares", None, 2, 7)
    ('fares-L0a1b2c3d-p2-000007', 'fares-p2-000007')
    """
    return f"{stream}-{lineage + '-' if lineage else ''}p{partition}-{seq:06d}"


def _finite_or_none(x: float):
    return float(x) if np.isfinite(x) else None
