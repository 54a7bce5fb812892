"""m-invariant release formation (Xiao & Tao, "m-Invariance: Towards Privacy Preserving Re-publication of Dynamic
Datasets", SIGMOD 2007), adapted to a stream of events counted in distinct individuals. No Kafka here.

Why
---
Each release can be k-anonymous and l-diverse and still leak once releases are combined: an individual who comes
back sits in a class of every release, each class narrows its invariant sensitive value (fare product category,
fleet segment) to the set of values published in that class, and intersecting those sets pins it (the thesis'
Figure 4.1; :mod:`stream_anon.attacks.intersection` measures it). m-invariance gives every individual one
**signature**, the set of invariant values of its class, in every release it appears in, so the intersection never
falls below m values.

Guarantee (checked independently by :mod:`stream_anon.audit.minvariance`)
-----------------------------------------------------------------------
For every release and every class in it (a reused class is judged by the records it holds in that release):

* **m-unique**: among the class's individuals (real ones, counted once each, plus counterfeit ones) there are at
  least m distinct invariant values and no value (null included) is held by more than 1/m of them
  (``count * m <= individuals``);
  the class also holds records of at least k distinct *real* individuals when it is created;
* **invariant**: the set of invariant values published in the class equals the signature of every real individual
  in it, and an individual's signature never changes while it is bound (``anonymization.m_horizon_s`` of event time
  after its last release; default: for the lifetime of the engine state, which survives restarts in checkpoints).

Counterfeits fill what the real individuals of a class cannot: a counterfeit individual has one of the missing (or
under-represented) values of the signature and one or more counterfeit records. A counterfeit record carries the
class's generalized quasi-identifiers like every record of the class (its QIs are inside the class by
construction), per-event sensitive values copied from a real record with the same invariant value published
earlier, and an audit token ``HMAC(secret, "counterfeit:" + release_id + "/" + class_id + "/" + n)`` that nobody
without the secret can tell from a real one. Records of a release are shuffled. The manifest publishes only the
number of counterfeit individuals and records per class (so aggregate queries can be corrected).

The four phases, per release (a documented variant of the paper's)
-------------------------------------------------------------------
The paper publishes balanced buckets (the same number of tuples for every value of a signature) and one tuple per
value per class. Here a class needs k distinct individuals, and balancing exactly costs far more counterfeits than
the 1/m rule needs, so the variant keeps the guarantee above and changes how it is reached:

1. **Division.** The buffered records are grouped by individual. An individual with a bound signature goes to the
   bucket of that signature (a bucket is the set of present individuals sharing a signature).
2. **Balancing and assignment.** An individual seen for the first time joins a signature that contains its value
   (rarest values first, so they seed the buckets). Among those whose population (all the individuals bound to
   it, present or not) stays below ``(1 - slack) / m`` per value with it, so that the bucket's future releases
   stay m-unique without counterfeits, it takes the one where it lowers the counterfeits this release needs (else
   raises them least). If every such signature would go over that cap, it opens a new signature from the current
   value frequencies, when that is a new value set: its value plus the m most frequent other values (m + 1
   values: the extra one is slack for the 1/m rule; with m values every class would have to be exactly
   balanced); otherwise it joins the signature least over the cap. The signature is bound only when the
   individual is actually published.
3. **Split.** Each bucket holding records of at least k real individuals is split like Mondrian (widest normalized
   dimension, cut nearest the median) but a cut is taken only if both halves keep k real individuals and together
   need no more counterfeit individuals than the whole (plus ``split_tolerance``). Each leaf is a class; the
   counterfeits it needs are computed exactly (:func:`counterfeit_need`) and spread over the signature's values so
   the class is as balanced as possible.
4. **Deferral and deadline.** A bucket below k real individuals, or one whose counterfeit need exceeds
   ``defer_counterfeit_share`` of its real individuals, waits while none of its records is due. Due records that
   remain are released under a randomly chosen earlier class **of the same signature** whose box covers them (a new
   individual: any signature containing its value), completed to an m-unique class of that release with
   counterfeits; otherwise they are suppressed with a reason.

Conservative choices (documented in docs/contracts.md)
------------------------------------------------------
* **Value changes.** An individual whose invariant value changes to another value *inside* its signature keeps its
  signature and is published (the adversary's candidate set is the signature either way). A value outside its
  signature would need a different signature: its records are suppressed (``invariant_value_changed``) for as long
  as the signature is bound. So are the records of an individual showing two values in one release (counted under
  both, as the checker does, it could make its class infeasible). The independent checker counts an individual
  under every value it ever had.
* **Null value.** An individual whose invariant value is null counts as an individual of its class; a null is
  visible in the class, so the nulls obey the 1/m rule like a value (as the checker counts them) but are no
  distinct value and no counterfeit gets one. The individual still gets a signature and keeps it.
* **Horizon.** After ``m_horizon_s`` without a release, an individual's signature is forgotten; the guarantee then
  covers each chain of releases separated by less than the horizon. Unset, signatures are kept as long as the state.
"""
from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from dataclasses import dataclass

import numpy as np

from stream_anon.engine.release import ClassInfo, Release
from stream_anon.strategies.partition import split_recursively

SUPPRESSED_NO_CLASS = "fewer_than_k_individuals_by_deadline"
SUPPRESSED_LOSS = "class_loss_above_limit"
SUPPRESSED_END = "end_of_stream"
SUPPRESSED_VALUE_CHANGED = "invariant_value_changed"
STATE_VERSION = 1
FREE = -1            # bucket of the measurement mode without invariance (MInvariantParams.invariance = False)


@dataclass(frozen=True)
class MInvariantParams:
    """Tuning of the m-invariant class former (``[anonymization.m_params]``); none of these weakens the guarantee.

    slack                    a signature's population share per value is kept below (1 - slack) / m when new
                             individuals are assigned (0 <= slack < 1)
    split_tolerance          extra counterfeit individuals a Mondrian cut may cost (trades counterfeits for loss)
    defer_counterfeit_share  a bucket that would need more counterfeit individuals than this share of its real
                             ones waits for the next release while none of its records is due
    pool_size                per invariant value, how many published sensitive tuples are kept to dress
                             counterfeit records
    invariance               False only to MEASURE what invariance costs: every release is m-unique on its own
                             (one bucket, each class's signature is whatever values it holds), no signature is kept,
                             and the intersection attack works again (the checker fails ``invariance``)
    """

    slack: float = 0.1
    split_tolerance: int = 0
    defer_counterfeit_share: float = 0.5
    pool_size: int = 32
    invariance: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.slack < 1:
            raise ValueError(f"slack: must be in [0, 1), got {self.slack}")
        if not isinstance(self.split_tolerance, int) or self.split_tolerance < 0:
            raise ValueError(f"split_tolerance: must be an integer >= 0, got {self.split_tolerance!r}")
        if self.defer_counterfeit_share < 0:
            raise ValueError(f"defer_counterfeit_share: must be >= 0, got {self.defer_counterfeit_share}")
        if not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise ValueError(f"pool_size: must be a positive integer, got {self.pool_size!r}")
        if not isinstance(self.invariance, bool):
            raise ValueError(f"invariance: must be true or false, got {self.invariance!r}")


# ------------------------------------------------------------------------------------------ counterfeit arithmetic
def counterfeit_need(counts: np.ndarray, n: np.ndarray, m: int, presence: bool = True,
                     nulls: np.ndarray | None = None) -> np.ndarray:
    """Fewest counterfeit individuals that make classes m-unique with exactly their signature's values.

    ``counts``: (C, s) real individuals per signature value (s >= m), ``n``: (C,) real individuals (an individual
    with a null value counts in ``n`` only). We need x_v >= 0 with every value present (counts + x >= 1) and
    ``(counts_v + x_v) * m <= n + X`` for X = sum x. With T = floor((n + X) / m) that is feasible iff
    ``max counts <= T``, ``zeros <= X <= sum(T - counts)``; the smallest X is at most m + s above
    ``max(zeros, m * max - n)``. With ``presence=False`` (no fixed signature: the columns are the value domain) a
    value may stay absent, but at least m values must be present: ``max(0, m - nonzero)`` counterfeits go to
    absent values. ``nulls`` (C,): individuals holding a null value; a null is visible in the class, so it obeys
    the 1/m rule too (``nulls <= T``) but is no distinct value and no counterfeit gets it.

    >>> counterfeit_need(np.array([[5, 5, 0], [3, 3, 3], [4, 3, 3]]), np.array([10, 9, 10]), 3).tolist()
    [5, 0, 2]
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    s = counts.shape[1]
    if s < m:
        raise ValueError(f"a signature needs at least m = {m} values, got {s}")
    zeros = (counts == 0).sum(axis=1)
    if not presence:
        zeros = np.maximum(m - (s - zeros), 0)
    top = counts.max(axis=1) if s else np.zeros(len(n), dtype=np.int64)
    if nulls is not None:
        top = np.maximum(top, np.asarray(nulls, dtype=np.int64).reshape(-1))
    x0 = np.maximum(np.maximum(zeros, m * top - n), 0)
    out = np.full(len(n), -1, dtype=np.int64)
    for extra in range(m + s + 2):
        x = x0 + extra
        t = (n + x) // m
        room = np.maximum(t[:, None] - counts, 0).sum(axis=1)
        ok = (out < 0) & (top <= t) & (t >= 1) & (room >= x)
        out[ok] = x[ok]
        if (out >= 0).all():
            break
    if (out < 0).any():        # pragma: no cover - impossible for s >= m (see the docstring)
        raise RuntimeError("counterfeit_need: no feasible count")
    return out


def need_one(counts, n: int, m: int, presence: bool = True, nulls: int = 0) -> int:
    """:func:`counterfeit_need` for one class, in plain Python (the per-individual assignment calls it thousands of
    times per release, where numpy's call overhead dominates).

    >>> need_one([5, 5, 0], 10, 3), need_one([3, 3, 3], 9, 3), need_one([4, 3, 3], 10, 3)
    (5, 0, 2)
    """
    s = len(counts)
    if s < m:
        raise ValueError(f"a signature needs at least m = {m} values, got {s}")
    zeros = sum(1 for c in counts if c == 0)
    if not presence:
        zeros = max(m - (s - zeros), 0)
    top = max(max(counts, default=0), nulls)
    x = max(zeros, m * top - n, 0)
    for _ in range(m + s + 2):
        t = (n + x) // m
        if top <= t and t >= 1 and sum(t - c for c in counts if c < t) >= x:
            return x
        x += 1
    raise RuntimeError("need_one: no feasible count")      # pragma: no cover - impossible for s >= m


def spread_counterfeits(counts: np.ndarray, n: int, m: int, presence: bool = True, nulls: int = 0) -> np.ndarray:
    """Counterfeit individuals per signature value for one class: the minimum number, each missing value first,
    the rest on the least represented values (the class ends as balanced as possible). With ``presence=False``
    absent values get one only as far as needed to reach m values (or room), in column order.

    >>> spread_counterfeits(np.array([4, 3, 3, 0]), 10, 3).tolist()
    [0, 0, 0, 2]
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = need_one(counts.tolist(), n, m, presence, nulls)
    x = np.zeros(len(counts), dtype=np.int64)
    active = counts > 0
    absent = np.flatnonzero(~active)
    first = absent if presence else absent[: max(0, m - int(np.count_nonzero(active)))]
    x[first] = 1
    active[first] = True
    t = (n + total) // m
    for _ in range(total - int(x.sum())):
        cur = counts + x
        room = active & (cur < t)
        if not room.any():                      # presence=False: open another absent value
            room = ~active & (t >= 1)
            active[np.flatnonzero(room)[0]] = True
            room = active & (cur < t)
        j = int(np.flatnonzero(room)[np.argmin(cur[room])])
        x[j] += 1
    return x


def counterfeit_token(secret: bytes, release_id: str, class_id: str, n: int) -> str:
    """Audit token of the n-th counterfeit record of a class in a release (hex HMAC-SHA256)."""
    return hmac.new(secret, f"counterfeit:{release_id}/{class_id}/{n}".encode(), hashlib.sha256).hexdigest()


def _text(v) -> str | None:
    """The text form of an invariant value (as the checker compares them)."""
    if v is None or isinstance(v, (dict, list, tuple)):
        return None
    if isinstance(v, bool):
        return str(v).lower()
    return v if isinstance(v, str) else str(v)


# ------------------------------------------------------------------------------------------ value-aware Mondrian
def split_bucket(X: np.ndarray, unit: np.ndarray, pair_value: np.ndarray, pair: np.ndarray, s: int, k: int, m: int,
                 width: np.ndarray, tolerance: int = 0, presence: bool = True) -> list[np.ndarray]:
    """Split one bucket's records into classes (phase 3).

    ``X`` (n, D) codes, ``unit`` (n,) local individual ids, ``pair`` (n,) local ids of (individual, value) pairs and
    ``pair_value`` (P,) the signature-value index of each pair (-1 for a null value), ``s`` signature size. A cut
    along the widest normalized dimension (then the next) is taken at the boundary nearest the median among those
    leaving k real individuals on both sides whose halves need at most ``tolerance`` more counterfeit individuals
    than the node; an individual whose records fall on both sides counts on both.
    """
    width = np.where(width > 0, width, 1.0)
    return split_recursively(np.arange(len(X)), lambda idx: _best_cut(
        X[idx], unit[idx], pair[idx], pair_value, s, k, m, width, tolerance, presence))


def _node_counts(unit, pair, pair_value, s):
    """(real individuals per signature value, individuals, individuals holding a null value) of a node."""
    n = len(np.unique(unit))
    c = np.zeros(s + 1, dtype=np.int64)          # last column: null
    pv = pair_value[np.unique(pair)]
    np.add.at(c, np.where(pv >= 0, pv, s), 1)
    return c[:s], n, c[s]


def _best_cut(X, unit, pair, pair_value, s, k, m, width, tolerance, presence):
    n_rows = len(X)
    c, n, z = _node_counts(unit, pair, pair_value, s)
    if n < 2 * k:
        return None
    need = int(counterfeit_need(c[None], np.array([n]), m, presence, np.array([z]))[0])
    span = (X.max(axis=0) - X.min(axis=0)) / width
    for dim in np.argsort(-span, kind="stable"):
        if span[dim] <= 0:
            break
        order = np.argsort(X[:, dim], kind="stable")
        col = X[order, dim]
        u, p = unit[order], pair[order]
        # first / last occurrence of each individual and each (individual, value) pair along the sorted column
        first_u = _first(u)
        last_u = _first(u[::-1])[::-1]
        first_p = _first(p)
        last_p = _first(p[::-1])[::-1]
        # candidate cuts: left = rows [0, b) for b where the column value changes
        bounds = np.flatnonzero(col[1:] != col[:-1]) + 1
        if len(bounds) == 0:
            continue
        left_n = np.concatenate([[0], np.cumsum(first_u)])[bounds]
        right_n = np.concatenate([np.cumsum(last_u[::-1])[::-1], [0]])[bounds]
        ok = (left_n >= k) & (right_n >= k)
        if not ok.any():
            continue
        bounds, left_n, right_n = bounds[ok], left_n[ok], right_n[ok]
        pv = pair_value[p]
        col = np.where(pv >= 0, pv, s)                       # column s: null values
        onehot = np.zeros((n_rows, s + 1), dtype=np.int64)
        onehot[np.flatnonzero(first_p), col[first_p]] = 1
        left_c = np.vstack([np.zeros((1, s + 1), dtype=np.int64), np.cumsum(onehot, axis=0)])[bounds]
        onehot[:] = 0
        onehot[np.flatnonzero(last_p), col[last_p]] = 1
        right_c = np.vstack([np.cumsum(onehot[::-1], axis=0)[::-1], np.zeros((1, s + 1), dtype=np.int64)])[bounds]
        total = (counterfeit_need(left_c[:, :s], left_n, m, presence, left_c[:, s])
                 + counterfeit_need(right_c[:, :s], right_n, m, presence, right_c[:, s]))
        good = total <= need + tolerance
        if not good.any():
            continue
        cand = bounds[good]
        b = int(cand[np.argmin(np.abs(cand - n_rows / 2))])
        mask = np.zeros(n_rows, dtype=bool)
        mask[order[:b]] = True
        return mask
    return None


def _first(a: np.ndarray) -> np.ndarray:
    """Boolean mask of the first occurrence of each value of ``a`` (in array order)."""
    out = np.zeros(len(a), dtype=bool)
    _, idx = np.unique(a, return_index=True)
    out[idx] = True
    return out


# ------------------------------------------------------------------------------------------ the former
class MInvariantFormer:
    """m-invariant release formation for one :class:`~stream_anon.engine.Engine` (one stream partition)."""

    def __init__(self, engine):
        self.engine = engine
        cfg = engine.config
        a = cfg.anonymization
        self.m = int(a.m)
        self.k = a.k
        self.horizon_s = a.m_horizon_s
        self.params = MInvariantParams(**a.m_params)
        self.inv_field = cfg.invariant_sensitive
        self.inv_col = cfg.sensitive.index(self.inv_field)
        self.secret = engine.secret
        # signatures: id -> sorted tuple of value texts; population (bound individuals) per signature and value
        self.sigs: list[tuple[str, ...]] = []
        self.sig_index: dict[tuple[str, ...], int] = {}
        self.sig_pop: list[Counter] = []
        # bound individuals: unit id -> [signature id, value text or None, event time of the last release]
        self.units: dict[int, list] = {}
        self.freq: Counter = Counter()       # bound individuals per value (for new signatures' companions)
        self.pool: dict[str, list] = {}       # value -> recent published sensitive tuples (dress counterfeits)
        self.repr: dict[str, object] = {}     # value text -> a raw value with that text
        d = engine.space.dims
        self.pub_lo, self.pub_hi = np.empty((0, d)), np.empty((0, d))
        self.pub_ids: list[str] = []
        self.pub_gen: list[dict] = []
        self.pub_ncp, self.pub_time = np.empty(0), np.empty(0)
        self.pub_sig = np.empty(0, dtype=np.int64)
        self.stats = Counter()                # counterfeit individuals/records, value changes, signatures made

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        ids = sorted(self.units)
        values = sorted({v for u in self.units.values() if u[1] is not None for v in [u[1]]})
        vindex = {v: i for i, v in enumerate(values)}
        return {
            "version": STATE_VERSION, "m": self.m,
            "sigs": [list(s) for s in self.sigs],
            "units": {"ids": ids, "sig": [self.units[u][0] for u in ids],
                      "value": [-1 if self.units[u][1] is None else vindex[self.units[u][1]] for u in ids],
                      "values": values, "last": [self.units[u][2] for u in ids]},
            "pool": self.pool, "repr": self.repr, "stats": dict(self.stats),
            "published": {"lo": self.pub_lo.tolist(), "hi": self.pub_hi.tolist(), "ids": self.pub_ids,
                          "gen": self.pub_gen, "ncp": self.pub_ncp.tolist(), "time": self.pub_time.tolist(),
                          "sig": self.pub_sig.tolist()},
        }

    def load_state(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"m-invariance state version {state.get('version')!r} is not {STATE_VERSION}")
        if state["m"] != self.m:
            raise ValueError(f"checkpoint signatures were made for m = {state['m']}, the config says m = {self.m}: "
                             "changing m would change signatures (start from an empty state to change it)")
        self.sigs = [tuple(s) for s in state["sigs"]]
        self.sig_index = {s: i for i, s in enumerate(self.sigs)}
        self.sig_pop = [Counter() for _ in self.sigs]
        u = state["units"]
        values = u["values"]
        self.units = {}
        self.freq = Counter()
        for uid, sig, vi, last in zip(u["ids"], u["sig"], u["value"], u["last"]):
            v = None if vi < 0 else values[vi]
            self.units[int(uid)] = [int(sig), v, float(last)]
            self.sig_pop[sig][v] += 1
            self.freq[v] += 1
        self.pool = {k: [list(t) for t in v] for k, v in state["pool"].items()}
        self.repr = dict(state["repr"])
        self.stats = Counter(state.get("stats", {}))
        p = state["published"]
        d = self.engine.space.dims
        self.pub_lo = np.array(p["lo"], dtype=float).reshape(-1, d)
        self.pub_hi = np.array(p["hi"], dtype=float).reshape(-1, d)
        self.pub_ids, self.pub_gen = list(p["ids"]), list(p["gen"])
        self.pub_ncp, self.pub_time = np.array(p["ncp"], dtype=float), np.array(p["time"], dtype=float)
        self.pub_sig = np.array(p["sig"], dtype=np.int64)

    # -- helpers --------------------------------------------------------------------------------------------
    def signature_of(self, unit_id: int) -> tuple[str, ...] | None:
        u = self.units.get(int(unit_id))
        return None if u is None else self.sigs[u[0]]

    def _sig_id(self, values) -> int:
        key = tuple(sorted(values))
        sid = self.sig_index.get(key)
        if sid is None:
            sid = self.sig_index[key] = len(self.sigs)
            self.sigs.append(key)
            self.sig_pop.append(Counter())
            self.stats["signatures"] += 1
        return sid

    def _template(self, v: str | None, freq: Counter) -> tuple[str, ...] | None:
        """A new signature for value v: v plus the m most frequent other values seen so far (m + 1 values: one more
        than m leaves slack for the 1/m rule; with exactly m values every class would have to be perfectly
        balanced). None (the individual waits) while fewer than m + 1 values have been seen, unless 4 m k
        individuals have been seen and the domain really seems to have m values."""
        others = sorted((w for w in freq if w is not None and w != v and freq[w] > 0),
                        key=lambda w: (-freq[w], w))
        chosen = (([v] if v is not None else []) + others)[: self.m + 1]
        enough = sum(freq.values()) >= 4 * self.m * self.k
        return tuple(sorted(chosen)) if len(chosen) > self.m or (enough and len(chosen) == self.m) else None

    def _expire(self, now: float) -> None:
        a = self.engine.config.anonymization
        keep = self.pub_time >= now - a.reuse_horizon_s
        keep &= np.arange(len(keep)) >= len(keep) - a.reuse_max_classes
        if not keep.all():
            idx = np.flatnonzero(keep)
            self.pub_lo, self.pub_hi = self.pub_lo[idx], self.pub_hi[idx]
            self.pub_ncp, self.pub_time, self.pub_sig = self.pub_ncp[idx], self.pub_time[idx], self.pub_sig[idx]
            self.pub_ids = [self.pub_ids[i] for i in idx]
            self.pub_gen = [self.pub_gen[i] for i in idx]
        if self.horizon_s is not None:
            for uid in [u for u, (_, _, last) in self.units.items() if last < now - self.horizon_s]:
                sid, v, _ = self.units.pop(uid)
                self.sig_pop[sid][v] -= 1
                self.freq[v] -= 1
                self.stats["signatures_expired"] += 1

    # -- one release ----------------------------------------------------------------------------------------
    def close(self, window_end: float, final: bool) -> Release:
        eng = self.engine
        a = eng.config.anonymization
        m, k = self.m, self.k
        rng = np.random.default_rng([a.seed, eng.partition, eng.seq])
        release_id = f"{eng.config.stream.name}-p{eng.partition}-{eng.seq:06d}"
        window_start = (eng.open_window if eng.open_window is not None else 0) * eng.window_s
        buf = eng.buffer
        self._expire(window_end)
        n_rows = len(buf)
        values = [_text(s[self.inv_col]) for s in buf.sensitive]
        for s, v in zip(buf.sensitive, values):
            if v is not None:
                self.repr.setdefault(v, s[self.inv_col])
        due = (buf.times + eng.max_delay_s < window_end + eng.window_s) | final
        uids, unit_of_row = np.unique(buf.units, return_inverse=True) if n_rows else (np.empty(0, np.int64),
                                                                                       np.empty(0, np.int64))
        rows_of = [[] for _ in uids]
        for r, u in enumerate(unit_of_row.tolist()):
            rows_of[u].append(r)

        suppressed: dict[str, list] = {}
        resolved = np.zeros(n_rows, dtype=bool)

        def suppress(rows, reason):
            for r in rows:
                suppressed.setdefault(reason, []).append(buf.tokens[r])
                resolved[r] = True

        # -- phase 1: division ------------------------------------------------------------------------------
        bucket_units: dict[int, list[int]] = {}        # signature id -> local unit indices (present, bound)
        new_units: list[int] = []
        unit_vals: list[set] = []
        unit_null: list[bool] = []
        for ui, uid in enumerate(uids.tolist()):
            vals = {values[r] for r in rows_of[ui]} - {None}
            unit_vals.append(vals)
            unit_null.append(any(values[r] is None for r in rows_of[ui]))
            bound = self.units.get(uid) if self.params.invariance else None
            if len(vals) > 1 or (bound is not None and not vals <= set(self.sigs[bound[0]])):
                # two values at once, or a value outside the bound signature: suppressed (module docstring)
                suppress(rows_of[ui], SUPPRESSED_VALUE_CHANGED)
                self.stats["value_changed_individuals"] += 1
            elif bound is not None:
                bucket_units.setdefault(bound[0], []).append(ui)
            else:
                new_units.append(ui)

        # -- phase 2: balancing and assignment of new individuals -------------------------------------------
        if self.params.invariance:
            self._assign(new_units, unit_vals, bucket_units, rng)
        elif new_units:
            bucket_units[FREE] = new_units          # measurement mode: one bucket, classes choose their values

        # -- phase 3: split each bucket into classes ---------------------------------------------------------
        new_classes: list[tuple[int, np.ndarray]] = []          # (signature id, rows)
        loss_rejected = np.zeros(n_rows, dtype=bool)
        width = eng.space.width
        for sid in sorted(bucket_units):
            members = bucket_units[sid]
            rows = np.array(sorted(r for ui in members for r in rows_of[ui]), dtype=np.int64)
            presence = sid != FREE
            sig = self.sigs[sid] if presence else tuple(sorted({v for ui in members for v in unit_vals[ui]}))
            if len(members) < k or len(sig) < m:
                continue                                         # waits; suppressed or reused when due
            vidx = {v: i for i, v in enumerate(sig)}
            c = np.zeros(len(sig), dtype=np.int64)
            for ui in members:
                for v in unit_vals[ui]:
                    c[vidx[v]] += 1
            z = sum(1 for ui in members if unit_null[ui])
            need = need_one(c.tolist(), len(members), m, presence, z)
            if not final and not due[rows].any() and need > self.params.defer_counterfeit_share * len(members):
                continue                                         # wait for more of the bucket (nothing is due)
            # local ids: individual and (individual, value) pair per row
            local_unit = unit_of_row[rows]
            pair_keys = [(int(unit_of_row[r]), values[r]) for r in rows]
            pair_id: dict = {}
            pair = np.array([pair_id.setdefault(pk, len(pair_id)) for pk in pair_keys], dtype=np.int64)
            pair_value = np.full(len(pair_id), -1, dtype=np.int64)
            for (_, v), pid in pair_id.items():
                if v is not None:
                    pair_value[pid] = vidx[v]
            for local in split_bucket(buf.X[rows], local_unit, pair_value, pair, len(sig), k, m, width,
                                      self.params.split_tolerance, presence):
                cls_rows = rows[local]
                if len(np.unique(buf.units[cls_rows])) < k:      # enforcement, independent of the split
                    continue
                lo, hi, _ = eng.space.snap(buf.X[cls_rows].min(axis=0, keepdims=True),
                                           buf.X[cls_rows].max(axis=0, keepdims=True))
                if eng.space.ncp(lo, hi)[0] > a.max_class_ncp:
                    loss_rejected[cls_rows] = True
                    continue
                if not presence:     # the class's own values, plus the absent ones its counterfeits get
                    cc = np.zeros(len(sig), dtype=np.int64)
                    zz = 0
                    for (ui, v) in {(int(unit_of_row[r]), values[r]) for r in cls_rows.tolist()}:
                        if v is not None:
                            cc[vidx[v]] += 1
                        else:
                            zz += 1
                    x = spread_counterfeits(cc, len(np.unique(unit_of_row[cls_rows])), m, presence=False, nulls=zz)
                    new_classes.append((self._sig_id([v for v, n in zip(sig, cc + x) if n > 0]), cls_rows))
                    continue
                new_classes.append((sid, cls_rows))
        placed = np.zeros(n_rows, dtype=bool)
        placed_sig: dict[int, int] = {}                         # local unit -> signature of its class here
        for sid, rows in new_classes:
            placed[rows] = True
            for ui in np.unique(unit_of_row[rows]).tolist():
                placed_sig[ui] = sid

        # -- phase 4: due leftovers -> an earlier class of the same signature, else suppressed ------------------
        reused: dict[int, list[int]] = {}                        # published class index -> rows
        leftover_due = np.flatnonzero(due & ~placed & ~resolved)
        if len(leftover_due) and a.reuse != "never" and len(self.pub_ids):
            self._reuse(leftover_due, unit_of_row, uids, unit_vals, placed_sig, rng, reused)
        for c_idx, rows in reused.items():
            placed[rows] = True
        for r in np.flatnonzero(due & ~placed & ~resolved):
            reason = SUPPRESSED_LOSS if loss_rejected[r] else (SUPPRESSED_END if final else SUPPRESSED_NO_CLASS)
            suppress([r], reason)

        release = self._make_release(release_id, window_start, window_end, new_classes, reused, suppressed,
                                     unit_of_row, uids, unit_vals, values, rng)
        buf.take(placed | resolved)
        release.deferred_tokens = list(buf.tokens)
        eng.seq += 1
        return release

    def _assign(self, new_units, unit_vals, bucket_units, rng) -> dict[int, int]:
        """Phase 2: put every new individual in a bucket (tentatively: bound only once published)."""
        m = self.m
        out: dict[int, int] = {}
        if not new_units:
            return out
        val_of = {ui: next(iter(unit_vals[ui])) if unit_vals[ui] else None for ui in new_units}
        freq = Counter(self.freq)
        freq.update(v for v in val_of.values() if v is not None)
        cap = (1.0 - self.params.slack) / m
        # present counts per bucket (this release) and population per signature (bound + tentative)
        present: dict[int, Counter] = {}
        present_n: Counter = Counter()
        for sid, members in bucket_units.items():
            cnt = Counter()
            for ui in members:
                cnt.update(unit_vals[ui])
            present[sid] = cnt
            present_n[sid] = len(members)
        pop = {sid: Counter(c) for sid, c in enumerate(self.sig_pop)}
        order = [new_units[i] for i in rng.permutation(len(new_units))]
        order.sort(key=lambda ui: (val_of[ui] is None, freq[val_of[ui]] if val_of[ui] is not None else 0))
        for ui in order:
            v = val_of[ui]
            cands = [sid for sid, sig in enumerate(self.sigs) if v is None or v in sig]
            template = self._template(v, freq)
            fresh = template is not None and template not in self.sig_index
            if not cands and template is None:
                continue                      # fewer than m values seen so far: it waits (deferred)
            best, best_key = None, None
            for sid in cands + ([-2] if fresh else []):
                if sid == -2:                 # a new signature from today's frequencies (only if it helps)
                    if best_key is not None and not best_key[0]:
                        break                 # an existing signature takes v within the cap
                    sid = self._sig_id(template)
                    pop.setdefault(sid, Counter())
                sig = self.sigs[sid]
                here = present.get(sid, Counter())
                c = [here[w] for w in sig]
                n0 = present_n[sid]
                c1 = [here[w] + (w == v) for w in sig]
                delta = need_one(c1, n0 + 1, m) - need_one(c, n0, m)
                p = pop.get(sid, Counter())
                total = sum(p.values()) + 1
                share = (p[v] + 1) / total if v is not None else 0.0
                over = max(0.0, share - cap) if total > 1 else 0.0
                key = (over > 0, delta > 0, delta, over, n0 == 0, share, -n0, sid)
                if best_key is None or key < best_key:
                    best, best_key = sid, key
            out[ui] = best
            bucket_units.setdefault(best, []).append(ui)
            present.setdefault(best, Counter()).update([v] if v is not None else [])
            present_n[best] += 1
            pop.setdefault(best, Counter())[v] += 1
        return out

    def _reuse(self, rows, unit_of_row, uids, unit_vals, placed_sig, rng, reused) -> None:
        """Phase 4: due rows -> a random covering earlier class whose signature fits the individual."""
        eng = self.engine
        clo, chi = eng.space.coverage_box(self.pub_lo, self.pub_hi)
        x = eng.buffer.X[rows]
        cover = ((x[:, None, :] >= clo[None]) & (x[:, None, :] <= chi[None])).all(axis=2)
        by_unit: dict[int, list[int]] = {}
        for i, r in enumerate(rows.tolist()):
            by_unit.setdefault(int(unit_of_row[r]), []).append(i)
        chosen: set[int] = set()
        for ui in sorted(by_unit, key=lambda u: int(uids[u])):
            uid = int(uids[ui])
            bound = self.units.get(uid)
            vals = unit_vals[ui]
            if bound is not None or ui in placed_sig:
                fits = self.pub_sig == (bound[0] if bound is not None else placed_sig[ui])
            else:
                fits = np.array([vals <= set(self.sigs[s]) for s in self.pub_sig.tolist()], dtype=bool)
            local = by_unit[ui]
            ok = cover[local].all(axis=0) & fits
            if not ok.any():
                continue          # suppressed by the caller (no class of its signature covers all its due records)
            cand = np.flatnonzero(ok)
            again = [c for c in cand.tolist() if c in chosen]
            pick = again if again else cand.tolist()
            c = int(pick[int(rng.integers(len(pick)))])        # uniform: never the best-fitting class
            chosen.add(c)
            reused.setdefault(c, []).extend(int(rows[i]) for i in local)
            if bound is None:
                placed_sig[ui] = int(self.pub_sig[c])

    def _make_release(self, release_id, window_start, window_end, new_classes, reused, suppressed, unit_of_row,
                      uids, unit_vals, values, rng) -> Release:
        eng = self.engine
        buf = eng.buffer
        m = self.m
        classes: list[ClassInfo] = []
        rec_class, rec_sens, rec_tok, rec_ncp, rec_cf = [], [], [], [], []
        # the pool of real sensitive tuples first includes what this release publishes
        published_rows = [r for _, rows in new_classes for r in rows.tolist()] + \
                         [r for rows in reused.values() for r in rows]
        fresh: dict[str, list] = {}              # the last pool_size published tuples per value, in order
        for r in reversed(published_rows):
            v = values[r]
            if v is not None:
                lst = fresh.setdefault(v, [])
                if len(lst) < self.params.pool_size:
                    lst.append(list(buf.sensitive[r]))
        for v, lst in fresh.items():
            self.pool[v] = (self.pool.get(v, []) + lst[::-1])[-self.params.pool_size:]

        groups = []      # (class id, generalization, ncp, reused, signature id, rows)
        if new_classes:
            lo = np.stack([buf.X[r].min(axis=0) for _, r in new_classes])
            hi = np.stack([buf.X[r].max(axis=0) for _, r in new_classes])
            lo, hi, labels = eng.space.snap(lo, hi)
            ncp = eng.space.ncp(lo, hi)
            for j, (sid, rows) in enumerate(new_classes):
                cid = f"{release_id}-c{j:04d}"
                gen = eng.space.describe(lo[j], hi[j], labels[j])
                groups.append((cid, gen, float(ncp[j]), False, sid, rows))
            self.pub_lo = np.concatenate([self.pub_lo, lo])
            self.pub_hi = np.concatenate([self.pub_hi, hi])
            self.pub_ncp = np.concatenate([self.pub_ncp, ncp])
            self.pub_time = np.concatenate([self.pub_time, np.full(len(new_classes), window_end)])
            self.pub_sig = np.concatenate([self.pub_sig, np.array([s for s, _ in new_classes], dtype=np.int64)])
            self.pub_ids += [g[0] for g in groups]
            self.pub_gen += [g[1] for g in groups]
        for c, rows in sorted(reused.items()):
            groups.append((self.pub_ids[c], self.pub_gen[c], float(self.pub_ncp[c]), True, int(self.pub_sig[c]),
                           np.array(rows, dtype=np.int64)))

        for ci, (cid, gen, ncp_c, is_reused, sid, rows) in enumerate(groups):
            sig = self.sigs[sid]
            vidx = {v: i for i, v in enumerate(sig)}
            members, rec_counts = np.unique(unit_of_row[rows], return_counts=True)
            # distinct (individual, value) pairs of the class (an individual has one non-null value per release)
            counts = np.zeros(len(sig), dtype=np.int64)
            nulls = 0
            for ui, v in {(int(unit_of_row[r]), values[r]) for r in rows.tolist()}:
                if v is None:
                    nulls += 1
                elif v in vidx:
                    counts[vidx[v]] += 1
                else:                            # pragma: no cover - phase 1/2 guarantee it
                    raise RuntimeError(f"{cid}: an individual's value is outside the class signature")
            rec_per_unit = rec_counts.tolist()
            for ui in members.tolist():
                bound = self.units.get(int(uids[ui]))
                if bound is not None and bound[0] != sid:    # pragma: no cover - division guarantees it
                    raise RuntimeError(f"{cid}: an individual's bound signature differs from the class signature")
            n_real = len(members)
            x = spread_counterfeits(counts, n_real, m, nulls=nulls)
            final_counts = counts + x
            if (np.count_nonzero(final_counts) < m or max(final_counts.max(), nulls) * m > n_real + x.sum()
                    or (final_counts == 0).any()):   # pragma: no cover - spread_counterfeits guarantees it
                raise RuntimeError(f"{cid}: not m-unique after counterfeits")
            # real records
            rl = rows.tolist()
            rec_class += [ci] * len(rl)
            rec_sens += [buf.sensitive[r] for r in rl]
            rec_tok += [buf.tokens[r] for r in rl]
            rec_ncp += [ncp_c] * len(rl)
            rec_cf += [False] * len(rl)
            # counterfeit individuals and records
            n_cf_rec = 0
            for j, v in enumerate(sig):
                for _ in range(int(x[j])):
                    n_rec = int(rec_per_unit[int(rng.integers(len(rec_per_unit)))])
                    for _ in range(n_rec):
                        rec_class.append(ci)
                        rec_sens.append(self._dress(v, rng))
                        rec_tok.append(counterfeit_token(self.secret, release_id, cid, n_cf_rec))
                        rec_ncp.append(ncp_c)
                        rec_cf.append(True)
                        n_cf_rec += 1
            classes.append(ClassInfo(cid, gen, n_real, len(rows) + n_cf_rec, ncp_c, is_reused,
                                     counterfeit_individuals=int(x.sum()), counterfeit_records=n_cf_rec))
            self.stats["counterfeit_individuals"] += int(x.sum())
            self.stats["counterfeit_records"] += n_cf_rec
            # bind signatures of the real individuals published here
            for ui in (members.tolist() if self.params.invariance else []):
                uid = int(uids[ui])
                vals = unit_vals[ui]
                v = next(iter(vals)) if len(vals) == 1 else None
                bound = self.units.get(uid)
                if bound is None:
                    self.units[uid] = [sid, v, float(window_end)]
                    self.sig_pop[sid][v] += 1
                    self.freq[v] += 1
                else:
                    if v is not None and v != bound[1]:
                        self.sig_pop[sid][bound[1]] -= 1
                        self.sig_pop[sid][v] += 1
                        self.freq[bound[1]] -= 1
                        self.freq[v] += 1
                        bound[1] = v
                        self.stats["value_changes_within_signature"] += 1
                    bound[2] = float(window_end)
        # shuffle: counterfeit records must not sit at a recognizable position
        perm = rng.permutation(len(rec_tok))
        return Release(
            release_id=release_id, stream=eng.config.stream.name, partition=eng.partition, seq=eng.seq,
            window_start=window_start, window_end=window_end, watermark=eng.watermark, k=self.k,
            classes=classes,
            record_class=np.array(rec_class, dtype=np.int64)[perm] if rec_tok else np.empty(0, dtype=np.int64),
            record_sensitive=[rec_sens[i] for i in perm],
            record_token=[rec_tok[i] for i in perm],
            record_ncp=np.array(rec_ncp, dtype=float)[perm] if rec_tok else np.empty(0),
            sensitive_fields=eng.config.sensitive,
            suppressed_tokens=suppressed,
            max_suppression_ratio=eng.config.anonymization.max_suppression_ratio,
            record_counterfeit=np.array(rec_cf, dtype=bool)[perm] if rec_tok else np.empty(0, dtype=bool),
            m=self.m,
        )

    def _dress(self, v: str, rng) -> tuple:
        """Sensitive tuple of a counterfeit record with invariant value v: a real published tuple with that value
        (any published tuple with the value substituted when none is known yet)."""
        lst = self.pool.get(v)
        if lst:
            t = list(lst[int(rng.integers(len(lst)))])
        else:
            keys = sorted(self.pool)
            src = self.pool[keys[int(rng.integers(len(keys)))]]
            t = list(src[int(rng.integers(len(src)))])
            t[self.inv_col] = self.repr.get(v, v)
        return tuple(t)
