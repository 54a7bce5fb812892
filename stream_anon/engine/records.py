"""Input events -> one typed, validated record batch (columns), read once for the engine and the DP aggregates.

Every field the engine needs (event id, event type, privacy unit, event time, quasi-identifiers, sensitive
fields) and every field a window consumer asks for (``carried``: the DP aggregates' group-by, value and filter
fields) is extracted here, in one pass, and every reason to reject an event is found here: a rejected event
gets one short reason naming the field.

Reading never raises for a reason of one event: an exception while reading a batch makes the reader read the
events one by one, and the event whose reading raises is rejected with ``unreadable event: <exception class>``.
Sensitive values are checked against their declared domains (``[sensitive.domains]``) and only values inside
them are kept (a category outside its values may be mapped to the declared ``other``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from stream_anon import crypto
from stream_anon.config import SensitiveDomain
from stream_anon.engine.space import QISpace, parse_time


def get_path(event: dict, path: str):
    """Value at a dotted path of a nested event, or of a flat event whose keys are dotted paths.

    >>> get_path({"a": {"b": 1}}, "a.b"), get_path({"a.b": 2}, "a.b"), get_path({"a": 3}, "a.b")
    (1, 2, None)
    """
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


@dataclass
class Records:
    """Accepted input records of one batch, column by column, in arrival order."""
    index: np.ndarray                      # position of each record in the input batch
    units: np.ndarray                      # keyed 64-bit ids of the privacy unit (never published)
    tokens: list[str]                      # audit tokens (HMAC of the event id)
    times: np.ndarray                      # event time, epoch seconds
    X: np.ndarray                          # (n, D) QI codes (stream_anon.engine.space)
    sensitive: list[tuple]                 # aligned with the config's sensitive fields
    carried: dict[str, list] = field(default_factory=dict)   # fields window consumers read (DP aggregates)

    def __len__(self) -> int:
        return len(self.tokens)

    def slice(self, start: int, stop: int) -> "Records":
        return Records(self.index[start:stop], self.units[start:stop], self.tokens[start:stop],
                       self.times[start:stop], self.X[start:stop], self.sensitive[start:stop],
                       {f: col[start:stop] for f, col in self.carried.items()})


class RecordReader:
    """Reads event dicts (or a DataFrame with dotted column names) into :class:`Records` and rejections."""

    def __init__(self, config, space: QISpace, secret: bytes, carried: tuple[str, ...] = ()):
        s = config.stream
        self.config, self.space = config, space
        self.event_types = frozenset(s.event_types)
        self.unit_field, self.time_field = s.privacy_unit, s.event_time
        self.qi_fields = tuple(dict.fromkeys(f for q in config.quasi_identifiers for f in q.fields))
        self.sensitive_fields = tuple(config.sensitive)
        self.domains = tuple(config.domains) or tuple(SensitiveDomain(f) for f in self.sensitive_fields)
        self.carried = tuple(carried)
        self.fields = tuple(dict.fromkeys(("event_id", "event_type", self.unit_field, self.time_field,
                                           *self.qi_fields, *self.sensitive_fields, *self.carried)))
        self._tokenize = crypto.AuditTokenizer(secret)
        self._unit_key = hashlib.sha256(b"unit-id:" + secret).digest()[:32]

    def columns(self, events) -> tuple[dict[str, list], int]:
        """The needed fields of a batch as columns (a missing field is None)."""
        if hasattr(events, "columns"):   # pandas DataFrame: dotted column names
            n = len(events)
            cols = {}
            for f in self.fields:
                if f in events.columns:
                    col = events[f].astype(object)
                    cols[f] = col.where(col.notna(), None).tolist()
                else:
                    cols[f] = [None] * n
            return cols, n
        n = len(events)
        cols = {}
        for f in self.fields:
            if "." in f:
                cols[f] = [get_path(e, f) for e in events]
            else:   # top-level field: a plain dict lookup (hot path)
                cols[f] = [e.get(f) for e in events]
        return cols, n

    def read(self, events) -> tuple[Records, list[tuple[int, str]]]:
        """(accepted records, [(input position, reason)] for the rejected ones). Never raises for an event's
        content: see the module docstring."""
        try:
            return self._read(events)
        except Exception:   # noqa: BLE001 - isolate the event(s) that raised
            pass
        n = len(events)
        parts, rejected = [], []
        for i in range(n):
            one = events.iloc[i:i + 1] if hasattr(events, "iloc") else events[i:i + 1]
            try:
                rec, rej = self._read(one)
            except Exception as exc:   # noqa: BLE001
                rejected.append((i, f"unreadable event: {type(exc).__name__}"))
                continue
            rejected += [(i, r) for _, r in rej]
            if len(rec):
                rec.index = np.array([i], dtype=rec.index.dtype)
                parts.append(rec)
        return self._concat(parts), rejected

    def _concat(self, parts: list[Records]) -> Records:
        if not parts:
            return Records(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), [], np.empty(0),
                           np.empty((0, self.space.dims)), [], {f: [] for f in self.carried})
        return Records(np.concatenate([p.index for p in parts]), np.concatenate([p.units for p in parts]),
                       [t for p in parts for t in p.tokens], np.concatenate([p.times for p in parts]),
                       np.concatenate([p.X for p in parts]), [s for p in parts for s in p.sensitive],
                       {f: [v for p in parts for v in p.carried[f]] for f in self.carried})

    def _read(self, events) -> tuple[Records, list[tuple[int, str]]]:
        cols, n = self.columns(events)
        reasons: list[str | None] = [None] * n
        times = np.zeros(n)
        allowed = self.event_types
        tf = self.time_field
        for i, (eid, etype, unit, ts) in enumerate(zip(cols["event_id"], cols["event_type"], cols[self.unit_field],
                                                      cols[tf])):
            if not isinstance(eid, str) or not eid:
                reasons[i] = "event_id: missing or not a string"
            elif not _utf8(eid):
                reasons[i] = "event_id: not valid Unicode text"
            elif not isinstance(etype, str) or etype not in allowed:
                reasons[i] = f"unknown event type: {_short(etype)} (stream {self.config.stream.name} accepts " \
                             f"{sorted(allowed)})"
            elif unit is None or unit == "":
                reasons[i] = f"{self.unit_field}: privacy unit missing"
            elif not _utf8(str(unit)):
                reasons[i] = f"{self.unit_field}: not valid Unicode text"
            else:
                t = parse_time(ts)
                if t is None:
                    reasons[i] = f"{tf}: not an ISO-8601 time with UTC offset: {_short(ts)}"
                else:
                    times[i] = t
        X, qi_reasons = self.space.encode({f: cols[f] for f in self.qi_fields})
        for i, r in enumerate(qi_reasons):
            if r is not None and reasons[i] is None:
                reasons[i] = r
        sens_cols = []
        for dom in self.domains:   # sensitive values: only values inside the declared domain are kept
            col = list(cols[dom.field])
            for i, v in enumerate(col):
                if reasons[i] is None:
                    col[i], why = dom.check(v)
                    if why is not None:
                        reasons[i] = f"sensitive {why}"
            sens_cols.append(col)
        rejected = [(i, r) for i, r in enumerate(reasons) if r is not None]
        rows = np.fromiter((r is None for r in reasons), dtype=bool, count=n)
        idx = np.flatnonzero(rows)
        il = idx.tolist()
        key, blake2b = self._unit_key, hashlib.blake2b
        # keyed 64-bit hashes: a collision can only merge two people, which makes the k check stricter
        unit_col = cols[self.unit_field]
        units = np.fromiter((int.from_bytes(blake2b(str(unit_col[i]).encode(), key=key, digest_size=8).digest(),
                                            "little", signed=True) for i in il), dtype=np.int64, count=len(il))
        tokenize, eid = self._tokenize, cols["event_id"]
        sensitive = [tuple(c[i] for c in sens_cols) for i in il] if sens_cols else [()] * len(il)
        records = Records(idx, units, [tokenize(eid[i]) for i in il], times[idx], X[idx], sensitive,
                          {f: [cols[f][i] for i in il] for f in self.carried})
        return records, rejected


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:     # lone surrogates: no token or key can be made from them
        return False
    return True


def _short(v, limit: int = 40) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."
