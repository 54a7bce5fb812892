"""Input events -> one typed, validated record batch (columns), read once for the engine and the DP aggregates.

Every field the engine needs (event id, event type, privacy unit, event time, quasi-identifiers, sensitive
fields) and every field a window consumer asks for (``carried``: the DP aggregates' group-by, value and filter
fields) is extracted here, in one pass, and every reason to reject an event is found here: a rejected event
gets one short reason naming the field, ``duplicate_event`` (:class:`SeenEvents`) or ``future_event_time``
(``[stream] max_future_s``, :func:`arrival_checks`).

Reading never raises for a reason of one event: an exception while reading a batch makes the reader read the
events one by one, and the event whose reading raises is rejected with ``unreadable event: <exception class>``.
Sensitive values are checked against their declared domains (``[sensitive.domains]``) and only values inside
them are kept (a category outside its values may be mapped to the declared ``other``).
"""
from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from stream_anon import crypto
from stream_anon.config import SensitiveDomain
from stream_anon.events import UNIT_IDS
from stream_anon.engine.space import QISpace, _parse_iso, parse_time

log = logging.getLogger(__name__)


def get_path(event: dict, path: str):
    """Value at a dotted path of a nested event, or of a flat event whose keys are dotted paths.

    >>> get_path({"a": {"b": 1}}, "a.b"), get_path({"a.b": 2}, "a.b"), get_path({"a": 3}, "a.b")
    (1, 2, None)
    """
    if path in event:
        return event[path]
    value: Any = event
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
        if value is None:
            return None
    return value


DUPLICATE_EVENT = "duplicate_event"


class SeenEvents:
    """Duplicate event ids (``[limits] duplicate_horizon_s``), kept in the engine's ``seen_events`` keyed table:
    keyed 64-bit hash of the event id (the first 64 bits of its audit token, an HMAC-SHA256 keyed with the secret:
    no event id in state) -> event time of its accepted occurrence.

    Rule: an event whose id was accepted before is rejected as ``duplicate_event`` while that earlier occurrence's
    event time is at least ``W - horizon``, where W is the watermark (largest event time of the records accepted
    before it, within the batch too). Entries below ``watermark - horizon`` can never match again and are deleted at
    window closes (:meth:`expire`). The rule depends only on the order of the events, not on how they are cut into
    batches. A 64-bit collision (probability about n^2 / 2^65 for n ids within the horizon) would reject one
    event as a duplicate; it is never silent (it goes to the dead letters with the reason).
    """

    FIELDS = [("time", "<f8")]

    def __init__(self, table, horizon_s: float):
        self.table, self.horizon_s = table, float(horizon_s)

    def potential(self, keys: np.ndarray) -> tuple[np.ndarray, dict]:
        """(mask of the keys that may be duplicates: seen before or repeated in the batch, {key: time} of those
        seen before)."""
        found, rows = self.table.get(keys)
        _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        return found | (counts[inverse] > 1), dict(zip(keys[found].tolist(), rows["time"][found].tolist()))

    def record(self, keys: np.ndarray, times: np.ndarray) -> None:
        rec = np.zeros(len(keys), dtype=self.table.dtype)
        rec["time"] = times
        self.table.put(keys, rec)          # a key accepted twice (after its horizon): the last time wins

    def expire(self, watermark: float) -> int:
        if not np.isfinite(watermark):
            return 0
        return len(self.table.delete_where("time", watermark - self.horizon_s)[0])


FUTURE_EVENT_TIME = "future_event_time"


def arrival_checks(keys: np.ndarray | None, times: np.ndarray, seen: SeenEvents | None, max_future_s: float | None,
                   largest: float) -> tuple[np.ndarray, np.ndarray]:
    """(duplicate mask, future mask) of candidate records in arrival order; the accepted ones are recorded in
    ``seen``. ``largest``: the largest event time accepted before the batch (-inf: none yet). ``keys``: the
    records' event-id keys, given whenever ``seen`` is.

    Both rules read the running largest event time of the records accepted before each one (within the batch too),
    as the engine's watermark does: a record is ``future_event_time`` when its time is more than ``max_future_s``
    beyond it (the first record of a stream has no reference and is never one), else ``duplicate_event`` by
    :class:`SeenEvents`'s rule. A rejected record does not move it, so the outcome depends on the order of the
    events only, not on how they are cut into batches. Common case without any candidate: vectorized."""
    n = len(times)
    dup, future = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    if n == 0:
        return dup, future
    if seen is not None and keys is None:
        raise ValueError("arrival_checks: duplicate checks need the records' keys")
    potential, old = seen.potential(keys) if seen is not None and keys is not None else (dup, {})
    if max_future_s is not None:
        # with every record accepted, the running largest time is this prefix maximum; rejections only lower it,
        # so a batch without a candidate here and without a potential duplicate is decided
        before = np.maximum.accumulate(np.concatenate([[largest], times[:-1]]))
        maybe_future = np.isfinite(before) & (times > before + max_future_s)
    else:
        maybe_future = future
    if potential.any() or maybe_future.any():      # rare: walk the batch in order
        wm = largest
        horizon = seen.horizon_s if seen is not None else 0.0
        key_list = keys.tolist() if keys is not None else [None] * n
        for i, (k, t, p) in enumerate(zip(key_list, times.tolist(), potential.tolist())):
            if max_future_s is not None and math.isfinite(wm) and t > wm + max_future_s:
                future[i] = True
                continue
            if p:
                t_old = old.get(k)
                if t_old is not None and t_old >= wm - horizon:
                    dup[i] = True
                    continue
                old[k] = t
            if t > wm:
                wm = t
    if seen is not None and keys is not None:
        ok = ~(dup | future)
        seen.record(keys[ok], times[ok])
    return dup, future


@dataclass
class Records:
    """Accepted input records of one batch, column by column, in arrival order."""
    index: np.ndarray                      # position of each record in the input batch
    units: np.ndarray                      # keyed 64-bit ids of the privacy unit (never published)
    tokens: list[str]                      # audit tokens (HMAC of the event id)
    times: np.ndarray                      # event time, epoch seconds
    X: np.ndarray                          # (n, D) QI codes (stream_anon.engine.space)
    sensitive: list[tuple]                 # aligned with the config's sensitive fields
    # fields window consumers read (DP aggregates); the privacy unit's ids (UNIT_IDS) as an int64 array
    carried: dict[str, list | np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    def slice(self, start: int, stop: int) -> "Records":
        return Records(self.index[start:stop], self.units[start:stop], self.tokens[start:stop],
                       self.times[start:stop], self.X[start:stop], self.sensitive[start:stop],
                       {f: col[start:stop] for f, col in self.carried.items()})


class RecordReader:
    """Reads event dicts (or a DataFrame with dotted column names) into :class:`Records` and rejections."""

    def __init__(self, config, space: QISpace, secret: bytes, carried: tuple[str, ...] = (),
                 seen: SeenEvents | None = None):
        s = config.stream
        self.config, self.space = config, space
        self.event_types = frozenset(s.event_types)
        self.unit_field, self.time_field = s.privacy_unit, s.event_time
        self.qi_fields = tuple(dict.fromkeys(f for q in config.quasi_identifiers for f in q.fields))
        self.sensitive_fields = tuple(config.sensitive)
        self.domains = tuple(config.domains) or tuple(SensitiveDomain(f) for f in self.sensitive_fields)
        self.carried = tuple(carried)
        self.fields = tuple(dict.fromkeys(("event_id", "event_type", self.unit_field, self.time_field,
                                           *self.qi_fields, *self.sensitive_fields,
                                           *(f for f in self.carried if f != UNIT_IDS))))
        self._tokens = crypto.HmacTokens(secret, b"audit:")    # crypto.audit_token, batched
        self._unit_key = hashlib.sha256(b"unit-id:" + secret).digest()[:32]
        self.seen = seen                         # duplicate detection (None: off)
        self.max_future_s: float | None = s.max_future_s

    def unit_ids(self, units) -> np.ndarray:
        """Keyed 64-bit ids of privacy-unit values (as the records carry them)."""
        key, blake2b = self._unit_key, hashlib.blake2b
        if len(units) == 0:
            return np.empty(0, dtype=np.int64)
        text = units if set(map(type, units)) == {str} else [u if type(u) is str else str(u) for u in units]
        uniq = dict.fromkeys(text)           # a unit's events share one hash
        digests = dict(zip(uniq, [blake2b(u.encode(), key=key, digest_size=8).digest() for u in uniq]))
        return np.frombuffer(b"".join([digests[u] for u in text]), dtype="<i8").astype(np.int64)

    @staticmethod
    def event_keys(tokens: list[str]) -> np.ndarray:
        """Keys of the ``seen_events`` table: the first 64 bits of the events' audit tokens (HMAC-SHA256 of the
        event id keyed with the secret), as signed int64."""
        if not tokens:
            return np.empty(0, dtype=np.int64)
        return np.frombuffer(bytes.fromhex("".join([t[:16] for t in tokens])), dtype=">i8").astype(np.int64)

    def columns(self, events, given: dict | None = None) -> tuple[dict[str, list], int]:
        """The needed fields of a batch as columns (a missing field is None). ``given``: columns of top-level
        fields already read from the same events (the worker's input checks read them), taken as they are."""
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
                continue
            if given is not None and f in given:
                cols[f] = list(given[f])
                continue
            try:    # hot path: every event has the top-level field -> a C-level loop
                cols[f] = list(map(itemgetter(f), events))
            except (KeyError, TypeError):
                cols[f] = [e.get(f) for e in events]
        return cols, n

    def read(self, events, largest: float = -np.inf, columns: dict | None = None
             ) -> tuple[Records, list[tuple[int, str]]]:
        """(accepted records, [(input position, reason)] for the rejected ones). ``largest``: the largest event
        time accepted before the batch (the reference of ``max_future_s`` and of duplicates); ``columns``: as
        :meth:`columns` takes them. Never raises for an event's content: see the module docstring."""
        try:
            return self._read(events, largest, columns)
        except Exception as exc:   # noqa: BLE001 - isolate the event(s) that raised
            # said, not silent (a defect here would only show as slowness); the class name only: an exception's
            # text may quote a raw value of the event
            log.warning("reader: a batch of %d events raised %s; reading them one by one", len(events),
                        type(exc).__name__)
        n = len(events)
        parts, rejected = [], []
        for i in range(n):
            one = events.iloc[i:i + 1] if hasattr(events, "iloc") else events[i:i + 1]
            try:
                rec, rej = self._read(one, largest)
            except Exception as exc:   # noqa: BLE001
                rejected.append((i, f"unreadable event: {type(exc).__name__}"))
                continue
            if len(rec):
                largest = max(largest, float(rec.times.max()))
            rejected += [(i, r) for _, r in rej]
            if len(rec):
                rec.index = np.array([i], dtype=rec.index.dtype)
                parts.append(rec)
        return self._concat(parts), rejected

    def _concat(self, parts: list[Records]) -> Records:
        if not parts:
            return Records(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), [], np.empty(0),
                           np.empty((0, self.space.dims)), [],
                           {f: np.empty(0, dtype=np.int64) if f == UNIT_IDS else [] for f in self.carried})
        units = np.concatenate([p.units for p in parts])
        return Records(np.concatenate([p.index for p in parts]), units,
                       [t for p in parts for t in p.tokens], np.concatenate([p.times for p in parts]),
                       np.concatenate([p.X for p in parts]), [s for p in parts for s in p.sensitive],
                       {f: units if f == UNIT_IDS else [v for p in parts for v in p.carried[f]]
                        for f in self.carried})

    def _bulk_checks(self, cols: dict[str, list], n: int) -> tuple[list, list] | None:
        """(reasons, times) of the identity and time checks for a batch whose ids, types and units all pass
        (checked a column at a time), times parsed once per distinct value; None when any of them may fail, and
        :meth:`_read` checks event by event (same reasons: only the time check is left to give one)."""
        eids, etypes, units, ts = cols["event_id"], cols["event_type"], cols[self.unit_field], cols[self.time_field]
        try:
            if not (set(map(type, eids)) == {str} and all(eids) and "".join(eids).isascii()
                    and set(etypes) <= self.event_types):
                return None
            unit_types = set(map(type, units))
            if unit_types == {str}:
                if not (all(units) and "".join(units).isascii()):
                    return None
            elif unit_types != {int}:
                return None
        except TypeError:                       # an unhashable event type
            return None
        reasons: list[str | None] = [None] * n
        if set(map(type, ts)) == {str}:         # str keys: no cross-type equality (1 == 1.0 == True)
            parsed = {v: _parse_iso(v) for v in dict.fromkeys(ts)}
            tl = list(map(parsed.__getitem__, ts))
        else:
            tl = [_parse_iso(v) if type(v) is str else parse_time(v) for v in ts]
        if None in tl:
            for i, t in enumerate(tl):
                if t is None:
                    reasons[i] = f"{self.time_field}: not an ISO-8601 time with UTC offset"
                    tl[i] = 0.0
        return reasons, tl

    def _event_checks(self, cols: dict[str, list], n: int) -> tuple[list, list]:
        """(reasons, times) of the identity and time checks, event by event."""
        reasons: list[str | None] = [None] * n
        tl = [0.0] * n
        allowed = self.event_types
        tf = self.time_field
        for i, (eid, etype, unit, ts) in enumerate(zip(cols["event_id"], cols["event_type"], cols[self.unit_field],
                                                      cols[tf])):
            if not isinstance(eid, str) or not eid:
                reasons[i] = "event_id: missing or not a string"
            elif not (eid.isascii() or _utf8(eid)):
                reasons[i] = "event_id: not valid Unicode text"
            elif not isinstance(etype, str) or etype not in allowed:
                reasons[i] = f"unknown event type: event_type is not one of {sorted(allowed)} (stream " \
                             f"{self.config.stream.name})"
            elif unit is None or unit == "":
                reasons[i] = f"{self.unit_field}: privacy unit missing"
            elif isinstance(unit, bool) or not isinstance(unit, (str, int, float)):
                # an object, list or boolean names nobody: its text form would count as an individual of its own
                reasons[i] = f"{self.unit_field}: privacy unit must be text or a number, got {type(unit).__name__}"
            elif not (isinstance(unit, str) and unit.isascii()) and not _utf8(str(unit)):
                reasons[i] = f"{self.unit_field}: not valid Unicode text"
            else:
                t = _parse_iso(ts) if type(ts) is str else parse_time(ts)
                if t is None:
                    reasons[i] = f"{tf}: not an ISO-8601 time with UTC offset"
                else:
                    tl[i] = t
        return reasons, tl

    def _read(self, events, largest: float, given: dict | None = None) -> tuple[Records, list[tuple[int, str]]]:
        cols, n = self.columns(events, given)
        bulk = self._bulk_checks(cols, n)
        if bulk is not None:
            reasons, tl = bulk
        else:
            reasons, tl = self._event_checks(cols, n)
        times = np.array(tl, dtype=float)
        X, qi_reasons = self.space.encode({f: cols[f] for f in self.qi_fields})
        if qi_reasons.count(None) < n:
            for i, r in enumerate(qi_reasons):
                if r is not None and reasons[i] is None:
                    reasons[i] = r
        sens_cols = []
        for dom in self.domains:   # sensitive values: only values inside the declared domain are kept
            col = cols[dom.field]
            published = _published_in_domain(dom, col)
            if published is not None:
                sens_cols.append(published)
                continue
            col = list(col)
            verdicts: dict = {}    # a batch repeats few values: each distinct (type, value) is checked once
            for i, v in enumerate(col):
                if reasons[i] is None:
                    try:
                        verdict = verdicts.get((type(v), v))
                    except TypeError:                     # unhashable (object, list): checked as it is
                        verdict = dom.check(v)
                    else:
                        if verdict is None:
                            verdict = verdicts[(type(v), v)] = dom.check(v)
                    col[i], why = verdict
                    if why is not None:
                        reasons[i] = f"sensitive {why}"
            sens_cols.append(col)
        if reasons.count(None) == n:       # every event accepted (the usual batch): the columns as read
            idx = np.arange(n)

            def take(col):
                return col
        else:
            idx = np.flatnonzero(np.fromiter((r is None for r in reasons), dtype=bool, count=n))
            il = idx.tolist()

            def take(col):
                return [col[i] for i in il]
        tokens = self._tokens(take(cols["event_id"]))
        # keyed 64-bit hashes: a collision can only merge two people, which makes the k check stricter
        units = self.unit_ids(take(cols[self.unit_field]))
        sensitive = list(zip(*map(take, sens_cols))) if sens_cols else [()] * len(idx)
        carried = {f: take(cols[f]) for f in self.carried if f != UNIT_IDS}
        if len(idx) and (self.seen is not None or self.max_future_s is not None):
            # last: the table of seen events changes only for a batch that was read in full
            keys = self.event_keys(tokens) if self.seen is not None else None
            dup, future = arrival_checks(keys, times[idx], self.seen, self.max_future_s, largest)
            drop = dup | future
            if drop.any():
                for i in idx[dup].tolist():
                    reasons[i] = DUPLICATE_EVENT
                for i in idx[future].tolist():
                    reasons[i] = f"{FUTURE_EVENT_TIME}: {self.time_field} more than {self.max_future_s:g} s beyond the " \
                                 "largest event time accepted (stream.max_future_s)"
                keep = ~drop
                kl = keep.tolist()
                idx, units = idx[keep], units[keep]
                tokens = [t for t, k in zip(tokens, kl) if k]
                sensitive = [s for s, k in zip(sensitive, kl) if k]
                carried = {f: [v for v, k in zip(col, kl) if k] for f, col in carried.items()}
        if UNIT_IDS in self.carried:
            carried[UNIT_IDS] = units
        rejected = [(i, r) for i, r in enumerate(reasons) if r is not None]
        return Records(idx, units, tokens, times[idx], X[idx], sensitive, carried), rejected


_SCALAR_TYPES = frozenset({str, type(None), int, float, bool})
_NUMBER_TYPES = frozenset({int, float, bool})


def _published_in_domain(domain: SensitiveDomain, values: list) -> list | None:
    """The published values of a column whose every value is inside ``domain`` (each distinct value checked once);
    None if a value may be rejected or cannot be a dict key on its own (1 == 1.0 == True), and the caller checks
    value by value."""
    types = set(map(type, values))
    if not types <= _SCALAR_TYPES or len(types & _NUMBER_TYPES) > 1:
        return None
    published = {}
    for v in dict.fromkeys(values):
        shown, why = domain.check(v)
        if why is not None:
            return None
        published[v] = shown
    return list(map(published.__getitem__, values))


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:     # lone surrogates: no token or key can be made from them
        return False
    return True



