"""The incremental anonymization engine: plain Python and numpy, no Kafka, no faust.

The engine is a **window core** with a pluggable **former** (``stream_anon.formers``):

- The core owns the buffer of deferred records, the event-time watermark, the release sequence, the random
  generator of each release, the registry of published classes and the release builder. Records are buffered per
  event-time window of ``window_s``. When the watermark (the largest event time seen) enters a new window, the
  open window closes: the core emits a :class:`ClosedWindow` (the records that arrived in it, for window
  consumers such as the DP aggregates) and makes one **release**.
- At a close the former forms classes over the whole buffer: k-anonymous classes with a strategy
  (:class:`~stream_anon.formers.kanon.KAnonymousFormer`), or m-invariant ones with counterfeits
  (:class:`~stream_anon.formers.minvariant.MInvariantFormer`). A record left over stays deferred while its deadline
  (event time + ``max_delay_s``) is after the next close. When it is due, the former may place it in a **randomly
  chosen** earlier published class that covers it (choosing the lowest-loss one would leak the true value: CASTLE,
  Cao et al., ICDE 2008, Example 4); otherwise the core suppresses it with a reason.

Output does not depend on how the input is cut into batches: a batch is split at the events whose time moves
the watermark into a new window, and the randomness of a release comes from (seed, partition, sequence number).

State (docs/contracts.md, "Engine state"): a bounded **core** (:meth:`Engine.state_core`, JSON) and **keyed
tables** (:mod:`stream_anon.engine.state`): ``seen_events`` (duplicate detection) and, with m-invariance,
``signatures``. :meth:`Engine.state_changes` gives what changed in the tables since its previous call, so a
checkpoint costs what changed; :meth:`Engine.restore` rebuilds an engine from a core and full tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stream_anon import crypto
from stream_anon.config import StreamConfig
from stream_anon.engine.records import RecordReader, Records, SeenEvents
from stream_anon.engine.registry import PublishedClasses
from stream_anon.engine.release import ClassInfo, Rejection, Release, StepResult
from stream_anon.engine.space import QISpace
from stream_anon.engine.state import KeyedTable, compose_state, split_state
from stream_anon.formers.base import (SUPPRESSED_END, SUPPRESSED_LOSS, SUPPRESSED_NO_CLASS, NewClass,
                                      WindowView, distinct_per_group)
from stream_anon.formers.counterfeits import counterfeit_token
from stream_anon.formers.kanon import KAnonymousFormer
from stream_anon.formers.minvariant import SIGNATURE_FIELDS, MInvariantFormer, MInvariantParams
from stream_anon.strategies import make_strategy

STATE_VERSION = 3


@dataclass
class ClosedWindow:
    """A window the core closed: its index and the carried fields of the records that arrived while it was open
    (in arrival order). The DP aggregates consume these; nothing else derives windows."""
    index: int
    start: float
    end: float
    carried: dict[str, list] = field(default_factory=dict)


def arrival_windows(times: np.ndarray, window_s: float, watermark: float = -np.inf) -> np.ndarray:
    """Window index of each record in arrival order: the window of the event-time watermark (largest event time
    seen so far, starting from ``watermark``) when it arrives. The one definition of a record's window.

    >>> arrival_windows(np.array([5.0, 65.0, 30.0, 130.0]), 60.0).tolist()
    [0, 1, 1, 2]
    """
    return np.floor(np.maximum.accumulate(np.maximum(times, watermark)) / window_s).astype(np.int64)


class _Buffer:
    """Deferred records, column by column."""

    def __init__(self, dims: int):
        self.X = np.empty((0, dims))
        self.units = np.empty(0, dtype=np.int64)
        self.times = np.empty(0)
        self.tokens: list[str] = []
        self.sensitive: list = []

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, rec: Records) -> None:
        self.X = np.concatenate([self.X, rec.X])
        self.units = np.concatenate([self.units, rec.units])
        self.times = np.concatenate([self.times, rec.times])
        self.tokens += rec.tokens
        self.sensitive += rec.sensitive

    def drop(self, mask: np.ndarray) -> None:
        """Forget the rows in mask (resolved) and keep the rest."""
        keep = np.flatnonzero(~mask)
        self.X, self.units, self.times = self.X[keep], self.units[keep], self.times[keep]
        self.tokens = [self.tokens[i] for i in keep]
        self.sensitive = [self.sensitive[i] for i in keep]

    def to_state(self) -> dict:
        return {"X": self.X.tolist(), "units": self.units.tolist(), "times": self.times.tolist(),
                "tokens": self.tokens, "sensitive": [list(s) for s in self.sensitive]}

    @classmethod
    def from_state(cls, state: dict, dims: int) -> "_Buffer":
        b = cls(dims)
        if state["tokens"]:
            b.X = np.array(state["X"], dtype=float).reshape(-1, dims)
        b.units = np.array(state["units"], dtype=np.int64)
        b.times = np.array(state["times"], dtype=float)
        b.tokens = list(state["tokens"])
        b.sensitive = [tuple(s) for s in state["sensitive"]]
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
                            config.sensitive)


class Engine:
    """Anonymizes one partition of one stream.

    ``carried``: fields of accepted events handed to window consumers with each :class:`ClosedWindow`
    (the worker passes the DP aggregates' fields). ``former``: defaults to :func:`make_former`.

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
        self.space = QISpace(config)
        self.reader = RecordReader(config, self.space, self.secret, carried)
        self.former = former if former is not None else make_former(config)
        a = config.anonymization
        self.k, self.window_s, self.max_delay_s = a.k, a.window_s, a.max_delay_s
        self.buffer = _Buffer(self.space.dims)
        self.registry = PublishedClasses(self.space, a.reuse_horizon_s, a.reuse_max_classes)
        self.seq = 0
        self.watermark = -np.inf
        self.open_window: int | None = None     # index of the open window (floor(t / window_s))
        self.window_carried = {f: [] for f in self.reader.carried}   # open window's carried fields
        self.seen_events = KeyedTable(SeenEvents.FIELDS)
        horizon = config.limits.duplicate_horizon_s
        if horizon > 0:
            self.reader.seen = SeenEvents(self.seen_events, horizon, lambda: self.watermark)

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
        """Feed records read by ``self.reader`` (the worker reads them itself to keep input positions)."""
        result = StepResult()
        if len(rec) == 0:
            return result
        t = rec.times
        # Split the batch where the watermark enters a new window, so batch boundaries do not matter.
        marks = arrival_windows(t, self.window_s, self.watermark)
        if self.open_window is None:
            self.open_window = int(marks[0])
        cuts = np.flatnonzero(marks > np.concatenate([[self.open_window], marks[:-1]]))
        start = 0
        for cut in list(cuts) + [len(rec)]:
            if cut > start:
                self._add(rec.slice(start, cut))
            if cut < len(rec):
                self._close_window(result, window_end=marks[cut] * self.window_s)
                self.open_window = int(marks[cut])
            start = cut
        return result

    def flush(self) -> StepResult:
        """End of stream: close the open window and resolve every deferred record now."""
        result = StepResult()
        if self.open_window is not None and (len(self.buffer) or self.seq == 0):
            self._close_window(result, (self.open_window + 1) * self.window_s, final=True)
            self.open_window += 1
        return result

    @property
    def deferred(self) -> int:
        return len(self.buffer)

    @property
    def deferred_tokens(self) -> list[str]:
        """Audit tokens of the records still waiting for a class."""
        return list(self.buffer.tokens)

    # -- state ------------------------------------------------------------------------------------------------
    def _tables(self) -> dict[str, KeyedTable]:
        tables = {"seen_events": self.seen_events}
        tables.update(getattr(self.former, "state_tables", dict)())
        return tables

    def state_core(self) -> dict:
        """The bounded part of the state, JSON-serializable (no secret in it): window position, buffer, published
        classes, former core (signature list, value dictionary, counterfeit pool, statistics) and the record layout
        of each keyed table (``tables``: name -> numpy dtype description)."""
        former = getattr(self.former, "state_core", self.former.state_dict)()
        return {"version": STATE_VERSION, "stream": self.config.stream.name, "partition": self.partition,
                "seq": self.seq, "watermark": None if not np.isfinite(self.watermark) else float(self.watermark),
                "open_window": self.open_window, "buffer": self.buffer.to_state(),
                "window_carried": self.window_carried, "published": self.registry.state_dict(),
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

    def state_dict(self) -> dict:
        """Core and full tables in one JSON document (tests, the audit harness, small checkpoints)."""
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
        engine.watermark = -np.inf if core["watermark"] is None else core["watermark"]
        engine.open_window = core["open_window"]
        engine.buffer = _Buffer.from_state(core["buffer"], engine.space.dims)
        engine.registry.load_state(core["published"])
        saved = core.get("window_carried", {})
        engine.window_carried = {f: list(saved.get(f, [])) for f in engine.reader.carried}
        return engine

    # -- internals --------------------------------------------------------------------------------------------
    def _add(self, rec: Records) -> None:
        self.buffer.append(rec)
        for f, col in rec.carried.items():
            self.window_carried[f].extend(col)
        self.watermark = max(self.watermark, float(rec.times.max()))

    def _close_window(self, result: StepResult, window_end: float, final: bool = False) -> None:
        start = (self.open_window if self.open_window is not None else 0) * self.window_s
        result.windows.append(ClosedWindow(self.open_window, start, start + self.window_s, self.window_carried))
        self.window_carried = {f: [] for f in self.reader.carried}
        result.releases.append(self._release(window_end, final))

    def _release(self, window_end: float, final: bool) -> Release:
        a = self.config.anonymization
        rng = np.random.default_rng([a.seed, self.partition, self.seq])
        release_id = f"{self.config.stream.name}-p{self.partition}-{self.seq:06d}"
        window_start = (self.open_window if self.open_window is not None else 0) * self.window_s
        buf, former = self.buffer, self.former
        self.registry.expire(window_end)
        former.expire(window_end)
        if self.reader.seen is not None:
            self.reader.seen.expire(self.watermark)
        due = (buf.times + self.max_delay_s < window_end + self.window_s) | final
        view = WindowView(buf.X, buf.units, buf.times, buf.sensitive, due, final, window_end, self.space, rng,
                          self.registry)
        plan = former.form(view)
        placed = np.zeros(len(buf), dtype=bool)
        for nc in plan.new_classes:
            placed[nc.rows] = True
        reused = plan.reused
        for rows in reused.values():
            placed[rows] = True
        suppressed_rows = {reason: list(rows) for reason, rows in plan.suppressed.items()}
        resolved = np.zeros(len(buf), dtype=bool)
        for rows in suppressed_rows.values():
            resolved[rows] = True
        # due leftovers: an earlier class chosen by the former, else suppressed
        for c, rows in former.reuse(view, np.flatnonzero(due & ~placed & ~resolved), plan).items():
            reused.setdefault(c, []).extend(rows)
            placed[rows] = True
        loss = plan.loss_rejected
        for i in np.flatnonzero(due & ~placed & ~resolved).tolist():
            reason = SUPPRESSED_LOSS if loss is not None and loss[i] else (SUPPRESSED_END if final
                                                                           else SUPPRESSED_NO_CLASS)
            suppressed_rows.setdefault(reason, []).append(i)
            resolved[i] = True
        release = self._build_release(view, release_id, window_start, plan.new_classes, reused, suppressed_rows)
        buf.drop(placed | resolved)     # everything resolved leaves the buffer; the rest stays deferred
        release.deferred_tokens = list(buf.tokens)
        self.seq += 1
        return release

    def _build_release(self, view: WindowView, release_id: str, window_start: float, new_classes: list[NewClass],
                       reused: dict[int, list[int]], suppressed_rows: dict[str, list[int]]) -> Release:
        buf, reg, former = self.buffer, self.registry, self.former
        groups = []     # (class id, generalization, ncp, reused, tag, rows) in release order
        if new_classes:
            sizes = np.array([len(nc.rows) for nc in new_classes])
            Xc = buf.X[np.concatenate([nc.rows for nc in new_classes])]
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            lo, hi = np.minimum.reduceat(Xc, starts, axis=0), np.maximum.reduceat(Xc, starts, axis=0)
            lo, hi, labels = self.space.snap(lo, hi)
            ncp = self.space.ncp(lo, hi)
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
                rec_tok += [counterfeit_token(self.secret, release_id, cid, n) for n in range(n_cf_rec)]
                rec_ncp += [ncp_c] * n_cf_rec
                rec_cf += [True] * n_cf_rec
            classes.append(ClassInfo(cid, gen, n_real, len(rl) + n_cf_rec, ncp_c, is_reused,
                                     counterfeit_individuals=n_cf_ind, counterfeit_records=n_cf_rec))
        m = getattr(former, "m", None)
        order = view.rng.permutation(len(rec_tok)) if former.shuffle_records else np.arange(len(rec_tok))
        return Release(
            release_id=release_id, stream=self.config.stream.name, partition=self.partition, seq=self.seq,
            window_start=window_start, window_end=view.window_end, watermark=self.watermark, k=self.k,
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
