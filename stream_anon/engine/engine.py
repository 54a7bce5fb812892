"""The incremental anonymization engine: plain Python and numpy, no Kafka, no faust.

Model (after CASTLE, Cao et al., ICDE 2008 / TDSC 2011, with Mondrian as the class former):
- Records are buffered per event-time window of ``window_s``. When the event-time watermark (the largest event
  time seen) enters a new window, the open window closes and one **release** is made.
- At a close, the strategy forms classes over the whole buffer; a class is published only if it holds records
  of at least k **distinct individuals** (checked here again, whatever the strategy did).
- A record left over stays deferred while its deadline (event time + ``max_delay_s``) is after the next close.
  When it is due, it is released under a **randomly chosen** earlier published class whose box covers it
  (choosing the lowest-loss one would leak the true value: CASTLE's Example 4), or else suppressed with a reason.
- ``reuse = "immediate"`` releases any buffered record covered by an earlier class at the next close instead.

Output does not depend on how the input is cut into batches: a batch is split at the events whose time moves
the watermark into a new window, and the randomness of a release comes from (seed, partition, sequence number).
"""
from __future__ import annotations

import hashlib
import numpy as np

from stream_anon import crypto
from stream_anon.config import StreamConfig
from stream_anon.engine.minvariance import MInvariantFormer
from stream_anon.engine.release import ClassInfo, Rejection, Release, StepResult
from stream_anon.engine.space import QISpace, parse_time
from stream_anon.strategies import make_strategy

SUPPRESSED_NO_CLASS = "fewer_than_k_individuals_by_deadline"
SUPPRESSED_LOSS = "class_loss_above_limit"
SUPPRESSED_END = "end_of_stream"


def get_path(event: dict, path: str):
    """Value at a dotted path of a nested event, or of a flat event whose keys are dotted paths."""
    if path in event:
        return event[path]
    value = event
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
        if value is None:
            return None
    return value


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

    def append(self, X, units, times, tokens, sensitive) -> None:
        self.X = np.concatenate([self.X, X])
        self.units = np.concatenate([self.units, units])
        self.times = np.concatenate([self.times, times])
        self.tokens += tokens
        self.sensitive += sensitive

    def take(self, mask: np.ndarray) -> "_Buffer":
        """Split off the rows in mask (returned) and keep the rest."""
        out = _Buffer(self.X.shape[1])
        idx = np.flatnonzero(mask)
        keep = np.flatnonzero(~mask)
        out.X, out.units, out.times = self.X[idx], self.units[idx], self.times[idx]
        out.tokens = [self.tokens[i] for i in idx]
        out.sensitive = [self.sensitive[i] for i in idx]
        self.X, self.units, self.times = self.X[keep], self.units[keep], self.times[keep]
        self.tokens = [self.tokens[i] for i in keep]
        self.sensitive = [self.sensitive[i] for i in keep]
        return out

    def to_state(self) -> dict:
        return {"X": self.X.tolist(), "units": self.units.tolist(), "times": self.times.tolist(),
                "tokens": self.tokens,
                "sensitive": [list(s) for s in self.sensitive]}

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


class Engine:
    """Anonymizes one partition of one stream.

    >>> from stream_anon.engine import Engine, demo_config
    >>> engine = Engine(demo_config(k=2), secret=b"0123456789abcdef")
    >>> events = [{"event_id": f"e{i}", "event_type": "reading", "unit": f"u{i % 4}",
    ...            "time": 10.0 * i, "value": float(i)} for i in range(8)]
    >>> result = engine.process(events + [{"event_id": "e9", "event_type": "reading", "unit": "u1",
    ...                                    "time": 100.0, "value": 1.0}])
    >>> [r.published for r in result.releases]
    [6]
    >>> min(c.individuals for c in result.releases[0].classes) >= 2
    True
    """

    def __init__(self, config: StreamConfig, partition: int = 0, secret: bytes | None = None):
        self.config = config
        self.partition = int(partition)
        self.secret = secret if secret is not None else crypto.throwaway_secret()
        self.space = QISpace(config)
        self.strategy = make_strategy(config.anonymization.strategy, config.anonymization.strategy_params)
        self.buffer = _Buffer(self.space.dims)
        a = config.anonymization
        self.k, self.window_s, self.max_delay_s = a.k, a.window_s, a.max_delay_s
        self.seq = 0
        self.watermark = -np.inf
        self.open_window: int | None = None     # index of the open window (floor(t / window_s))
        # Published classes that may be reused: snapped boxes, ids, generalizations, creation time.
        self.pub_lo = np.empty((0, self.space.dims))
        self.pub_hi = np.empty((0, self.space.dims))
        self.pub_ids: list[str] = []
        self.pub_gen: list[dict] = []
        self.pub_ncp = np.empty(0)
        self.pub_time = np.empty(0)
        self._tokenize = crypto.AuditTokenizer(self.secret)
        self._mac_key = hashlib.sha256(b"unit-id:" + self.secret).digest()[:32]
        s = config.stream
        self._fields = (s.privacy_unit, s.event_time, *[f for q in config.quasi_identifiers for f in q.fields],
                        *config.sensitive)
        # m-invariance (anonymization.m): releases are formed by the signature-aware former instead
        self.minv = MInvariantFormer(self) if a.m is not None else None

    # -- public API -------------------------------------------------------------------------------------------
    def process(self, events) -> StepResult:
        """Feed a batch (list of event dicts, or a DataFrame with dotted column names) in arrival order."""
        columns, n = self._columns(events)
        result = StepResult()
        if n == 0:
            return result
        good, times, reasons, X_all = self._validate(columns, n)
        originals = events if isinstance(events, list) else None
        for i in np.flatnonzero(~good):
            event = originals[i] if originals is not None else {c: columns[c][i] for c in columns}
            result.rejected.append(Rejection(event, reasons[i]))
        rows = np.flatnonzero(good)
        if len(rows) == 0:
            return result
        X = X_all[rows]
        units, tokens = self._identify(columns, rows)
        t = times[rows]
        # Split the batch where the watermark enters a new window, so batch boundaries do not matter.
        marks = np.floor(np.maximum.accumulate(np.maximum(t, self.watermark)) / self.window_s).astype(np.int64)
        if self.open_window is None:
            self.open_window = int(marks[0])
        cuts = np.flatnonzero(marks > np.concatenate([[self.open_window], marks[:-1]]))
        start = 0
        for cut in list(cuts) + [len(rows)]:
            if cut > start:
                self._add(columns, rows[start:cut], X[start:cut], units[start:cut], t[start:cut],
                          tokens[start:cut])
            if cut < len(rows):
                result.releases.append(self._close(window_end=marks[cut] * self.window_s))
                self.open_window = int(marks[cut])
            start = cut
        return result

    def flush(self) -> StepResult:
        """End of stream: close the open window and resolve every deferred record now."""
        result = StepResult()
        if self.open_window is not None and (len(self.buffer) or self.seq == 0):
            result.releases.append(self._close((self.open_window + 1) * self.window_s, final=True))
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
    def state_dict(self) -> dict:
        """JSON-serializable checkpoint (no secret in it)."""
        return {"version": 1, "stream": self.config.stream.name, "partition": self.partition, "seq": self.seq,
                "watermark": None if not np.isfinite(self.watermark) else float(self.watermark),
                "open_window": self.open_window, "buffer": self.buffer.to_state(),
                "published": {"lo": self.pub_lo.tolist(), "hi": self.pub_hi.tolist(), "ids": self.pub_ids,
                              "gen": self.pub_gen, "ncp": self.pub_ncp.tolist(), "time": self.pub_time.tolist()},
                **({"minvariance": self.minv.state_dict()} if self.minv is not None else {})}

    @classmethod
    def from_state(cls, config: StreamConfig, state: dict, secret: bytes | None = None) -> "Engine":
        engine = cls(config, state["partition"], secret)
        if state["stream"] != config.stream.name:
            raise ValueError(f"checkpoint is for stream {state['stream']!r}, not {config.stream.name!r}")
        engine.seq = state["seq"]
        engine.watermark = -np.inf if state["watermark"] is None else state["watermark"]
        engine.open_window = state["open_window"]
        engine.buffer = _Buffer.from_state(state["buffer"], engine.space.dims)
        p = state["published"]
        d = engine.space.dims
        engine.pub_lo = np.array(p["lo"], dtype=float).reshape(-1, d)
        engine.pub_hi = np.array(p["hi"], dtype=float).reshape(-1, d)
        engine.pub_ids, engine.pub_gen = list(p["ids"]), list(p["gen"])
        engine.pub_ncp, engine.pub_time = np.array(p["ncp"], dtype=float), np.array(p["time"], dtype=float)
        if "minvariance" in state:
            if engine.minv is None:
                raise ValueError("checkpoint holds m-invariance signatures but the config has no anonymization.m: "
                                 "dropping them would let individuals change signature")
            engine.minv.load_state(state["minvariance"])
        return engine

    # -- internals --------------------------------------------------------------------------------------------
    def _columns(self, events) -> tuple[dict, int]:
        needed = ("event_id", "event_type", *self._fields)
        if hasattr(events, "columns"):   # pandas DataFrame: dotted column names
            n = len(events)
            cols = {}
            for f in dict.fromkeys(needed):
                if f in events.columns:
                    col = events[f].astype(object)
                    cols[f] = col.where(col.notna(), None).tolist()
                else:
                    cols[f] = [None] * n
            return cols, n
        n = len(events)
        cols = {}
        for f in dict.fromkeys(needed):
            if "." in f:
                cols[f] = [get_path(e, f) for e in events]
            else:   # top-level field: a plain dict lookup (hot path)
                cols[f] = [e.get(f) for e in events]
        return cols, n

    def _validate(self, columns: dict, n: int) -> tuple[np.ndarray, np.ndarray, list]:
        s = self.config.stream
        reasons: list[str | None] = [None] * n
        times = np.zeros(n)
        allowed = set(s.event_types)
        for i, (eid, etype, unit, ts) in enumerate(zip(columns["event_id"], columns["event_type"],
                                                      columns[s.privacy_unit], columns[s.event_time])):
            if not isinstance(eid, str) or not eid:
                reasons[i] = "event_id: missing or not a string"
            elif etype not in allowed:
                reasons[i] = f"event_type: {etype!r} is not one of {sorted(allowed)}"
            elif unit is None or unit == "":
                reasons[i] = f"{s.privacy_unit}: privacy unit missing"
            else:
                t = parse_time(ts)
                if t is None:
                    reasons[i] = f"{s.event_time}: not an ISO-8601 time with UTC offset: {ts!r}"
                else:
                    times[i] = t
        X, qi_reasons = self.space.encode({f: columns[f] for q in self.config.quasi_identifiers for f in q.fields})
        for i, r in enumerate(qi_reasons):
            if r is not None and reasons[i] is None:
                reasons[i] = r
        good = np.fromiter((r is None for r in reasons), dtype=bool, count=n)
        return good, times, reasons, X

    def _identify(self, columns: dict, rows: np.ndarray):
        """Per-record unit ids (keyed 64-bit hashes: a collision can only merge two people, which makes the
        k check stricter, never weaker) and audit tokens."""
        key = self._mac_key
        unit_col = columns[self.config.stream.privacy_unit]
        rows = rows.tolist()
        blake2b = hashlib.blake2b
        units = np.fromiter(
            (int.from_bytes(blake2b(str(unit_col[i]).encode(), key=key, digest_size=8).digest(),
                            "little", signed=True) for i in rows), dtype=np.int64, count=len(rows))
        eid = columns["event_id"]
        tokenize = self._tokenize
        tokens = [tokenize(eid[i]) for i in rows]
        return units, tokens

    def _add(self, columns, rows, X, units, times, tokens) -> None:
        rows = rows.tolist()
        sens = [[col[i] for i in rows] for col in (columns[f] for f in self.config.sensitive)]
        self.buffer.append(X, units, times, tokens, list(zip(*sens)) if sens else [()] * len(rows))
        self.watermark = max(self.watermark, float(times.max()))

    def _close(self, window_end: float, final: bool = False) -> Release:
        if self.minv is not None:
            return self.minv.close(window_end, final)
        a = self.config.anonymization
        rng = np.random.default_rng([a.seed, self.partition, self.seq])
        release_id = f"{self.config.stream.name}-p{self.partition}-{self.seq:06d}"
        window_start = (self.open_window if self.open_window is not None else 0) * self.window_s
        buf = self.buffer
        self._expire_published(window_end)

        reused_rows: dict[int, list[int]] = {}   # published class index -> buffer rows
        assigned = np.zeros(len(buf), dtype=bool)
        if a.reuse == "immediate":
            self._reuse(np.arange(len(buf)), rng, reused_rows, assigned)

        # Form new classes over what is left.
        pending = np.flatnonzero(~assigned)
        new_classes, loss_rejected = self._form(pending, rng)
        for rows in new_classes:
            assigned[rows] = True

        # Due leftovers: reuse at random, else suppress.
        due = (buf.times + self.max_delay_s < window_end + self.window_s) | final
        leftover_due = np.flatnonzero(due & ~assigned)
        if a.reuse != "never":
            self._reuse(leftover_due, rng, reused_rows, assigned)
        suppressed: dict[str, list] = {}
        for i in np.flatnonzero(due & ~assigned):
            reason = SUPPRESSED_LOSS if loss_rejected[i] else (SUPPRESSED_END if final else SUPPRESSED_NO_CLASS)
            suppressed.setdefault(reason, []).append(buf.tokens[i])
            assigned[i] = True

        release = self._make_release(release_id, window_start, window_end, new_classes, reused_rows, suppressed)
        self.buffer.take(assigned)     # drop everything resolved; the rest stays deferred
        release.deferred_tokens = list(self.buffer.tokens)
        self.seq += 1
        return release

    def _form(self, pending: np.ndarray, rng) -> tuple[list[np.ndarray], np.ndarray]:
        buf = self.buffer
        loss_rejected = np.zeros(len(buf), dtype=bool)
        if len(pending) == 0:
            return [], loss_rejected
        extra = {}
        if getattr(self.strategy, "uses_sensitive", False):
            # Strategies with a diversity or severity rule (seeds 002, 003) see the sensitive columns too.
            extra["sensitive"] = {f: [buf.sensitive[i][j] for i in pending]
                                  for j, f in enumerate(self.config.sensitive)}
        raw = self.strategy.form_classes(buf.X[pending], buf.units[pending], self.k, self.space, rng, **extra)
        seen = np.zeros(len(pending), dtype=bool)
        classes = []
        for local in raw:
            local = np.asarray(local, dtype=np.int64)
            if len(local) == 0 or seen[local].any():
                raise RuntimeError(f"strategy {self.strategy.name!r} returned overlapping or empty classes")
            seen[local] = True
            rows = pending[local]
            # Enforcement, independent of the strategy: k distinct individuals.
            if len(np.unique(buf.units[rows])) < self.k:
                continue
            lo, hi, _ = self.space.snap(buf.X[rows].min(axis=0, keepdims=True), buf.X[rows].max(axis=0,
                                                                                               keepdims=True))
            if self.space.ncp(lo, hi)[0] > self.config.anonymization.max_class_ncp:
                loss_rejected[rows] = True
                continue
            classes.append(rows)
        return classes, loss_rejected

    def _reuse(self, rows: np.ndarray, rng, reused_rows: dict, assigned: np.ndarray) -> None:
        if len(rows) == 0 or len(self.pub_ids) == 0:
            return
        clo, chi = self.space.coverage_box(self.pub_lo, self.pub_hi)
        x = self.buffer.X[rows]
        cover = ((x[:, None, :] >= clo[None]) & (x[:, None, :] <= chi[None])).all(axis=2)
        ok = cover.any(axis=1)
        if not ok.any():
            return
        # Uniform choice among the covering classes (CASTLE Example 4: never the best-fitting one).
        choice = np.argmax(rng.random(cover.shape) * cover, axis=1)
        for r, c in zip(rows[ok], choice[ok]):
            reused_rows.setdefault(int(c), []).append(int(r))
            assigned[r] = True

    def _expire_published(self, now: float) -> None:
        a = self.config.anonymization
        keep = self.pub_time >= now - a.reuse_horizon_s
        keep &= np.arange(len(keep)) >= len(keep) - a.reuse_max_classes
        if not keep.all():
            self.pub_lo, self.pub_hi = self.pub_lo[keep], self.pub_hi[keep]
            self.pub_ncp, self.pub_time = self.pub_ncp[keep], self.pub_time[keep]
            idx = np.flatnonzero(keep)
            self.pub_ids = [self.pub_ids[i] for i in idx]
            self.pub_gen = [self.pub_gen[i] for i in idx]

    def _make_release(self, release_id, window_start, window_end, new_classes, reused_rows, suppressed):
        buf = self.buffer
        classes: list[ClassInfo] = []
        rec_rows, rec_class, rec_ncp = [], [], []
        if new_classes:
            lo = np.stack([buf.X[r].min(axis=0) for r in new_classes])
            hi = np.stack([buf.X[r].max(axis=0) for r in new_classes])
            lo, hi, labels = self.space.snap(lo, hi)
            ncp = self.space.ncp(lo, hi)
            for j, rows in enumerate(new_classes):
                cid = f"{release_id}-c{j:04d}"
                gen = self.space.describe(lo[j], hi[j], labels[j])
                classes.append(ClassInfo(cid, gen, len(np.unique(buf.units[rows])), len(rows), float(ncp[j]), False))
                rec_rows.append(rows)
                rec_class.append(np.full(len(rows), len(classes) - 1))
                rec_ncp.append(np.full(len(rows), ncp[j]))
            cw = np.full(len(new_classes), window_end)
            self.pub_lo = np.concatenate([self.pub_lo, lo])
            self.pub_hi = np.concatenate([self.pub_hi, hi])
            self.pub_ncp = np.concatenate([self.pub_ncp, ncp])
            self.pub_time = np.concatenate([self.pub_time, cw])
            self.pub_ids += [c.class_id for c in classes]
            self.pub_gen += [c.generalization for c in classes]
        for c, rows in sorted(reused_rows.items()):
            rows = np.array(rows, dtype=np.int64)
            classes.append(ClassInfo(self.pub_ids[c], self.pub_gen[c], len(np.unique(buf.units[rows])), len(rows),
                                     float(self.pub_ncp[c]), True))
            rec_rows.append(rows)
            rec_class.append(np.full(len(rows), len(classes) - 1))
            rec_ncp.append(np.full(len(rows), self.pub_ncp[c]))
        rows = np.concatenate(rec_rows) if rec_rows else np.empty(0, dtype=np.int64)
        return Release(
            release_id=release_id, stream=self.config.stream.name, partition=self.partition, seq=self.seq,
            window_start=window_start, window_end=window_end, watermark=self.watermark, k=self.k,
            classes=classes,
            record_class=np.concatenate(rec_class) if rec_class else np.empty(0, dtype=np.int64),
            record_sensitive=[buf.sensitive[i] for i in rows],
            record_token=[buf.tokens[i] for i in rows],
            record_ncp=np.concatenate(rec_ncp) if rec_ncp else np.empty(0),
            sensitive_fields=self.config.sensitive,
            suppressed_tokens=suppressed,
            max_suppression_ratio=self.config.anonymization.max_suppression_ratio,
        )
