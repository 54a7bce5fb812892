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
  after its last release, see Horizon below; the binding survives restarts in checkpoints).

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

Other privacy criteria (``[[anonymization.criteria]]``) are refused with m at configuration load
(:mod:`stream_anon.criteria.parse`), not checked at close: every class is already m-diverse in the invariant field
(no value held by more than 1/m of its individuals, counterfeits included: frequency, hence entropy and distinct,
m-diversity), and a class cannot be merged or suppressed for another field's criterion after the signatures of its
individuals are bound without breaking invariance; half-enforcing one would promise what the former cannot keep.

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
* **Horizon** (``anonymization.m_horizon_s``, default 7 days: ``stream_anon.config.M_HORIZON_S``). After
  ``m_horizon_s`` of event time without a release, an individual's signature is forgotten (its entry leaves the
  ``signatures`` keyed table, a deletion in the engine's state changes); if it comes back it is treated as a new
  individual and may get another signature. What this means for the guarantee: invariance holds along every chain
  of releases of an individual in which consecutive releases are less than the horizon apart; two releases of the
  same person separated by a longer gap may carry different signatures, and an adversary who links them can
  intersect both. The trade-off: memory and checkpoint size are proportional to the individuals released within
  the horizon (24 bytes each in the table: an 8-byte key and a 16-byte record), not to every individual ever
  seen. The default keeps daily and weekly returning individuals (commuters, fleet vehicles) invariant while
  bounding the table to about a week of individuals; a longer horizon protects rarer returns for more memory.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from stream_anon.formers.base import (SUPPRESSED_VALUE_CHANGED, Counterfeits, NewClass, Plan, WindowView)
from stream_anon.formers.counterfeits import counterfeit_need, need_one, spread_counterfeits
from stream_anon.strategies.partition import split_recursively

STATE_VERSION = 3
# record of the ``signatures`` keyed table (unit id -> ...): 16 bytes per bound individual, plus its 8-byte key
SIGNATURE_FIELDS = [("sig", "<i4"), ("value", "<i4"), ("last", "<f8")]
FREE = -1            # bucket of the measurement mode without invariance (``invariance=False``)


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

    >>> MInvariantParams(slack=1.5)
    Traceback (most recent call last):
    ...
    ValueError: slack: must be in [0, 1), got 1.5
    """

    slack: float = 0.1
    split_tolerance: int = 0
    defer_counterfeit_share: float = 0.5
    pool_size: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.slack, bool) or not isinstance(self.slack, (int, float)) or not 0 <= self.slack < 1:
            raise ValueError(f"slack: must be in [0, 1), got {self.slack}")
        if isinstance(self.split_tolerance, bool) or not isinstance(self.split_tolerance, int) \
                or self.split_tolerance < 0:
            raise ValueError(f"split_tolerance: must be an integer >= 0, got {self.split_tolerance!r}")
        if isinstance(self.defer_counterfeit_share, bool) or not isinstance(self.defer_counterfeit_share,
                                                                            (int, float)) \
                or self.defer_counterfeit_share < 0:
            raise ValueError(f"defer_counterfeit_share: must be >= 0, got {self.defer_counterfeit_share}")
        if isinstance(self.pool_size, bool) or not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise ValueError(f"pool_size: must be a positive integer, got {self.pool_size!r}")


def invariant_text(v) -> str | None:
    """The text form of an invariant value (as the checker compares them); None for null and containers."""
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
    if len(unit) == 0:
        return np.zeros(s, dtype=np.int64), 0, 0
    # local ids are small non-negative integers: counting beats sorting
    n = int(np.count_nonzero(np.bincount(unit)))
    pv = pair_value[np.flatnonzero(np.bincount(pair))]
    c = np.bincount(np.where(pv >= 0, pv, s), minlength=s + 1)      # last column: null
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
        first_u, last_u = _first_last(u)
        first_p, last_p = _first_last(p)
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


def _first_last(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks of the first and of the last occurrence of each value of ``a`` (in array order), from one
    stable sort: within a run of equal values the positions ascend.

    >>> [m.astype(int).tolist() for m in _first_last(np.array([3, 1, 3, 2, 1]))]
    [[1, 1, 0, 1, 0], [0, 0, 1, 1, 1]]
    """
    n = len(a)
    first, last = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    if n == 0:
        return first, last
    order = np.argsort(a, kind="stable")
    change = np.flatnonzero(a[order[1:]] != a[order[:-1]])
    first[order[np.concatenate([[0], change + 1])]] = True
    last[order[np.concatenate([change, [n - 1]])]] = True
    return first, last


class _RowValues:
    """The invariant values of a close's rows as integer codes, and the (individual, value) structure phases 1 and 3
    read, computed with numpy once per close instead of per row in Python."""

    def __init__(self, values: list, units: np.ndarray):
        self.value_list = [v for v in dict.fromkeys(values) if v is not None]     # first-appearance order
        self.code_of = {v: i for i, v in enumerate(self.value_list)}
        self.code_of[None] = -1
        n = len(values)
        self.code = np.fromiter(map(self.code_of.__getitem__, values), dtype=np.int64, count=n)
        _, first = np.unique(self.code, return_index=True)
        self.first_row = first[1:] if n and self.code[first[0]] < 0 else first    # per value, by code
        if n:
            self.uids, self.unit_of_row = np.unique(units, return_inverse=True)
        else:
            self.uids, self.unit_of_row = np.empty(0, np.int64), np.empty(0, np.int64)
        self.unit_of_row = self.unit_of_row.astype(np.int64, copy=False)
        n_units = len(self.uids)
        self._base = len(self.value_list) + 1
        keys = np.unique(self.unit_of_row * self._base + (self.code + 1))    # distinct (individual, value) pairs
        self._pair_unit, self._pair_code = keys // self._base, keys % self._base - 1
        valued = self._pair_code >= 0
        self.n_values = np.bincount(self._pair_unit[valued], minlength=n_units)
        self.unit_null = np.zeros(n_units, dtype=bool)
        self.unit_null[self._pair_unit[~valued]] = True
        self._row_order = None

    def unit_sets(self) -> list[frozenset]:
        """Per individual, the set of its non-null values (shared frozensets: read, never changed)."""
        valued = self._pair_code >= 0
        single = np.full(len(self.uids), -1, dtype=np.int64)
        single[self._pair_unit[valued]] = self._pair_code[valued]
        vl = self.value_list
        sets = [frozenset((v,)) for v in vl] + [frozenset()]       # code -1 (no value) reads the last one
        out = list(map(sets.__getitem__, single.tolist()))
        for ui in np.flatnonzero(self.n_values > 1).tolist():     # rare: suppressed in phase 1
            out[ui] = frozenset(vl[c] for c in self._pair_code[valued & (self._pair_unit == ui)].tolist())
        return out

    def rows_of(self, ui: int) -> list[int]:
        return np.flatnonzero(self.unit_of_row == ui).tolist()

    def rows_of_units(self, members) -> np.ndarray:
        """The rows of the given individuals, ascending."""
        mask = np.zeros(len(self.uids), dtype=bool)
        mask[members] = True
        return np.flatnonzero(mask[self.unit_of_row])

    def pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(local id of each row's (individual, value) pair, numbered in order of first appearance in ``rows``;
        the value code of each pair, -1 for null)."""
        keys = self.unit_of_row[rows] * self._base + (self.code[rows] + 1)
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
        pair_code = np.empty(len(uniq), dtype=np.int64)
        pair_code[rank] = uniq % self._base - 1
        return rank[inverse.reshape(-1)], pair_code

    def columns_for(self, sig) -> np.ndarray:
        """Value code -> column of ``sig`` (-1: not in it; the last entry, read by the null code -1, is -1)."""
        out = np.full(len(self.value_list) + 1, -1, dtype=np.int64)
        for i, v in enumerate(sig):
            code = self.code_of.get(v)
            if code is not None and code >= 0:
                out[code] = i
        return out

    def class_counts(self, rows: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, int]:
        """(distinct individuals per column of a class's rows, individuals with a null value); ``columns`` maps a
        value code (and -1 for null, the last entry) to its column, -1 for a value outside them."""
        keys = np.unique(self.unit_of_row[rows] * self._base + (self.code[rows] + 1))
        codes = keys % self._base - 1
        nulls = int(np.count_nonzero(codes < 0))
        cols = columns[codes[codes >= 0]]
        if (cols < 0).any():
            raise RuntimeError("a class's value is outside its columns")
        return cols, nulls


# ------------------------------------------------------------------------------------------ the former
class MInvariantFormer:
    """m-invariant release formation for one engine (one stream partition); see the module docstring.

    ``invariance=False`` exists only to MEASURE what invariance costs and is not reachable from a configuration
    file (benchmarks construct it in code): every release is m-unique on its own (one bucket, each class's
    signature is whatever values it holds), no signature is kept, and the intersection attack works again (the
    checker fails ``invariance``).
    """

    shuffle_records = True        # counterfeit records must not sit at a recognizable position
    registry_tags = True          # a registered class carries its signature id

    def __init__(self, m: int, k: int, params: MInvariantParams, sensitive_fields: tuple[str, ...],
                 invariant_field: str, horizon_s: float | None, max_class_ncp: float, reuse: str,
                 invariance: bool = True, *, units_table):
        self.m, self.k = int(m), int(k)
        self.params = params
        self.horizon_s = horizon_s
        self.max_class_ncp, self.reuse_policy = float(max_class_ncp), reuse
        self.invariance = bool(invariance)
        self.inv_field = invariant_field
        self.inv_col = tuple(sensitive_fields).index(invariant_field)
        # signatures: id -> sorted tuple of value texts; population (bound individuals) per signature and value
        self.sigs: list[tuple[str, ...]] = []
        self.sig_index: dict[tuple[str, ...], int] = {}
        self.sig_pop: list[Counter] = []
        # bound individuals: keyed table unit id -> (signature id, value id or -1 for null, event time of the last
        # release); value ids index ``values`` (the value dictionary, in the order values were first bound)
        self.units = units_table             # stream_anon.engine.state.KeyedTable(SIGNATURE_FIELDS), empty
        self.values: list[str] = []
        self.value_id: dict[str, int] = {}
        self.freq: Counter = Counter()       # bound individuals per value (for new signatures' companions)
        self.pool: dict[str, list] = {}       # value -> recent published sensitive tuples (dress counterfeits)
        self.repr: dict[str, object] = {}     # value text -> a raw value with that text
        self.stats = Counter()                # counterfeit individuals/records, value changes, signatures made
        self._close = None                    # what form() learnt about the current close, for reuse/complete

    # -- state ----------------------------------------------------------------------------------------------
    def state_core(self) -> dict:
        """The bounded part of the state (JSON): signatures, value dictionary, counterfeit pool, statistics."""
        return {"version": STATE_VERSION, "m": self.m, "sigs": [list(s) for s in self.sigs],
                "values": list(self.values), "pool": self.pool, "repr": self.repr, "stats": dict(self.stats)}

    def state_tables(self) -> dict:
        """The keyed tables of the former: ``signatures`` (unit id -> signature id, value id, last release time)."""
        return {"signatures": self.units}

    def state_dict(self) -> dict:
        """Core and signature table in one JSON document (``units``: ids, sig, value, last as lists)."""
        keys, rows = self.units.snapshot()
        return {**self.state_core(), "units": {"ids": keys.tolist(), "sig": rows["sig"].tolist(),
                                               "value": rows["value"].tolist(), "last": rows["last"].tolist()}}

    def load_core(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"m-invariance state version {state.get('version')!r} is not {STATE_VERSION}")
        if state["m"] != self.m:
            raise ValueError(f"checkpoint signatures were made for m = {state['m']}, the config says m = {self.m}: "
                             "changing m would change signatures (start from an empty state to change it)")
        self.sigs = [tuple(s) for s in state["sigs"]]
        self.sig_index = {s: i for i, s in enumerate(self.sigs)}
        self.values = list(state["values"])
        self.value_id = {v: i for i, v in enumerate(self.values)}
        self.pool = {k: [list(t) for t in v] for k, v in state["pool"].items()}
        self.repr = dict(state["repr"])
        self.stats = Counter(state.get("stats", {}))
        self._recount()

    def load_tables(self, tables: dict) -> None:
        keys, rows = tables.get("signatures", (np.empty(0, np.int64), np.empty(0, self.units.dtype)))
        rows = np.asarray(rows)
        if rows.dtype != self.units.dtype:
            raise ValueError(f"signatures table: records of dtype {rows.dtype}, expected {self.units.dtype}")
        if len(rows) and (rows["sig"].max() >= len(self.sigs) or rows["value"].max() >= len(self.values)):
            raise ValueError("signatures table refers to signatures or values the core does not know")
        self.units.load(keys, rows)
        self._recount()

    def load_state(self, state: dict) -> None:
        self.load_core(state)
        u = state["units"]
        rows = np.zeros(len(u["ids"]), dtype=self.units.dtype)
        rows["sig"], rows["value"], rows["last"] = u["sig"], u["value"], u["last"]
        self.load_tables({"signatures": (np.array(u["ids"], dtype=np.int64), rows)})

    def _recount(self) -> None:
        """Population per signature and value, and per value, from the signature table."""
        self.sig_pop = [Counter() for _ in self.sigs]
        self.freq = Counter()
        if len(self.units) == 0:
            return
        _, rows = self.units.snapshot()
        pairs, counts = np.unique(np.stack([rows["sig"], rows["value"]], axis=1), axis=0, return_counts=True)
        for (sid, vid), n in zip(pairs.tolist(), counts.tolist()):
            v = None if vid < 0 else self.values[vid]
            self.sig_pop[sid][v] += n
            self.freq[v] += n

    def _vid(self, v: str | None) -> int:
        if v is None:
            return -1
        i = self.value_id.get(v)
        if i is None:
            i = self.value_id[v] = len(self.values)
            self.values.append(v)
        return i

    # -- helpers --------------------------------------------------------------------------------------------
    def signature_of(self, unit_id: int) -> tuple[str, ...] | None:
        found, rows = self.units.get(np.array([int(unit_id)], dtype=np.int64))
        return self.sigs[int(rows["sig"][0])] if found[0] else None

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

    def expire(self, now: float) -> None:
        """Forget the signatures of individuals not released for ``m_horizon_s`` (module docstring: Horizon)."""
        if self.horizon_s is None:
            return
        keys, rows = self.units.delete_where("last", now - self.horizon_s)
        if len(keys) == 0:
            return
        pairs, counts = np.unique(np.stack([rows["sig"], rows["value"]], axis=1), axis=0, return_counts=True)
        for (sid, vid), n in zip(pairs.tolist(), counts.tolist()):
            v = None if vid < 0 else self.values[vid]
            self.sig_pop[sid][v] -= n
            self.freq[v] -= n
        self.stats["signatures_expired"] += len(keys)

    # -- phases 1-3 -----------------------------------------------------------------------------------------
    def form(self, view: WindowView) -> Plan:
        m, k = self.m, self.k
        rng = view.rng
        n_rows = len(view)
        values = [invariant_text(s[self.inv_col]) for s in view.sensitive]
        rv = _RowValues(values, view.units)
        for v, r in zip(rv.value_list, rv.first_row):
            if v not in self.repr:
                self.repr[v] = view.sensitive[r][self.inv_col]
        due = view.due
        uids, unit_of_row = rv.uids, rv.unit_of_row
        plan = Plan(loss_rejected=np.zeros(n_rows, dtype=bool))
        # bound signatures of the present individuals (one vectorized lookup; -1: not bound)
        if self.invariance and len(uids):
            found, brow = self.units.get(uids)
            bound_sig = np.where(found, brow["sig"], -1).tolist()
            bound_now = (bound_sig, brow["value"].tolist(), brow["last"].tolist())
        else:
            bound_sig = [-1] * len(uids)
            bound_now = (bound_sig, bound_sig, [0.0] * len(uids))

        # -- phase 1: division ------------------------------------------------------------------------------
        bucket_units: dict[int, list[int]] = {}        # signature id -> local unit indices (present, bound)
        new_units: list[int] = []
        unit_vals, unit_null = rv.unit_sets(), rv.unit_null
        sig_sets: dict[int, set] = {}
        for ui, (vals, bsid) in enumerate(zip(unit_vals, bound_sig)):
            if len(vals) > 1 or (bsid >= 0 and not vals <= (sig_sets.get(bsid) or
                                                          sig_sets.setdefault(bsid, set(self.sigs[bsid])))):
                # two values at once, or a value outside the bound signature: suppressed (module docstring)
                plan.suppressed.setdefault(SUPPRESSED_VALUE_CHANGED, []).extend(rv.rows_of(ui))
                self.stats["value_changed_individuals"] += 1
            elif bsid >= 0:
                bucket_units.setdefault(bsid, []).append(ui)
            else:
                new_units.append(ui)

        # -- phase 2: balancing and assignment of new individuals -------------------------------------------
        if self.invariance:
            self._assign(new_units, unit_vals, bucket_units, rng)
        elif new_units:
            bucket_units[FREE] = new_units          # measurement mode: one bucket, classes choose their values

        # -- phase 3: split each bucket into classes ---------------------------------------------------------
        width = view.space.width
        for sid in sorted(bucket_units):
            members = bucket_units[sid]
            rows = rv.rows_of_units(members)
            presence = sid != FREE
            sig = self.sigs[sid] if presence else tuple(sorted({v for ui in members for v in unit_vals[ui]}))
            if len(members) < k or len(sig) < m:
                continue                                         # waits; suppressed or reused when due
            vidx = {v: i for i, v in enumerate(sig)}
            c = np.zeros(len(sig), dtype=np.int64)
            for ui in members:
                for v in unit_vals[ui]:
                    c[vidx[v]] += 1
            z = int(np.count_nonzero(unit_null[members]))
            need = need_one(c.tolist(), len(members), m, presence, z)
            if not view.final and not due[rows].any() and need > self.params.defer_counterfeit_share * len(members):
                continue                                         # wait for more of the bucket (nothing is due)
            # local ids: individual and (individual, value) pair per row
            local_unit = unit_of_row[rows]
            pair, pair_code = rv.pairs(rows)
            sig_col = rv.columns_for(sig)
            pair_value = sig_col[pair_code]
            for local in split_bucket(view.X[rows], local_unit, pair_value, pair, len(sig), k, m, width,
                                      self.params.split_tolerance, presence):
                cls_rows = rows[local]
                if len(np.unique(view.units[cls_rows])) < k:      # enforcement, independent of the split
                    continue
                lo, hi, _ = view.space.snap(view.X[cls_rows].min(axis=0, keepdims=True),
                                            view.X[cls_rows].max(axis=0, keepdims=True))
                if view.space.ncp(lo, hi)[0] > self.max_class_ncp:
                    plan.loss_rejected[cls_rows] = True
                    continue
                if not presence:     # the class's own values, plus the absent ones its counterfeits get
                    cols, zz = rv.class_counts(cls_rows, sig_col)
                    cc = np.bincount(cols, minlength=len(sig))
                    x = spread_counterfeits(cc, len(np.unique(unit_of_row[cls_rows])), m, presence=False, nulls=zz)
                    plan.new_classes.append(NewClass(cls_rows, self._sig_id([v for v, n in zip(sig, cc + x)
                                                                             if n > 0])))
                    continue
                plan.new_classes.append(NewClass(cls_rows, sid))
        placed_sig: dict[int, int] = {}                         # local unit -> signature of its class here
        for nc in plan.new_classes:
            for ui in np.unique(unit_of_row[nc.rows]).tolist():
                placed_sig[ui] = nc.tag
        self._close = (unit_of_row, uids, unit_vals, values, placed_sig, bound_now, rv)
        return plan

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
        # stable sort by (no value, frequency of the value), as sorted() with that key
        no_value = np.array([val_of[ui] is None for ui in order], dtype=bool)
        f = np.array([freq[val_of[ui]] if val_of[ui] is not None else 0 for ui in order], dtype=np.int64)
        order = [order[i] for i in np.lexsort((f, no_value)).tolist()]
        # The choice for an individual with value v is the smallest key(sid, v) over the signatures holding v
        # (a new signature from today's frequencies only when every one of them is over the cap). key(sid, v)
        # depends only on the bucket and population of sid, which change only when an individual joins sid, so
        # keys are cached per signature and recomputed after a join (same choices as evaluating every key).
        empty = Counter()
        keys: dict[int, dict] = {}                # sid -> {v: key}
        base: dict[int, int] = {}                 # sid -> counterfeits the bucket needs now
        totals = {sid: sum(p.values()) for sid, p in pop.items()}
        cands_of: dict = {}                       # v -> signatures holding v (None: every signature)
        template_of: dict = {}                    # v -> its new-signature template (freq is fixed here)
        keys_of_v: dict = {}                      # v -> {sid: key(sid, v)} over cands_of[v]
        stale: dict = {}                          # v -> signatures whose key changed (or appeared) since

        def key_of(sid, v):
            ks = keys.setdefault(sid, {})
            key = ks.get(v)
            if key is None:
                sig = self.sigs[sid]
                here = present.get(sid, empty)
                n0 = present_n[sid]
                b = base.get(sid)
                if b is None:
                    b = base[sid] = need_one([here[w] for w in sig], n0, m)
                delta = need_one([here[w] + (w == v) for w in sig], n0 + 1, m) - b
                p = pop.get(sid, empty)
                total = totals.get(sid, 0) + 1
                share = (p[v] + 1) / total if v is not None else 0.0
                over = max(0.0, share - cap) if total > 1 else 0.0
                key = ks[v] = (over > 0, delta > 0, delta, over, n0 == 0, share, -n0, sid)
            return key

        def best_for(v, cands):
            kv = keys_of_v.get(v)
            if kv is None:
                stale.pop(v, None)
                kv = keys_of_v[v] = {sid: key_of(sid, v) for sid in cands}
            else:
                for sid in stale.pop(v, ()):
                    kv[sid] = key_of(sid, v)
            return min(kv.values()) if kv else None

        def changed(sid):
            sig = self.sigs[sid]
            for w in keys_of_v:
                if w is None or w in sig:
                    stale.setdefault(w, set()).add(sid)

        for ui in order:
            v = val_of[ui]
            cands = cands_of.get(v)
            if cands is None:
                cands = cands_of[v] = [sid for sid, sig in enumerate(self.sigs) if v is None or v in sig]
            if v in template_of:
                template = template_of[v]
            else:
                template = template_of[v] = self._template(v, freq)
            fresh = template is not None and template not in self.sig_index
            if not cands and template is None:
                continue                      # fewer than m values seen so far: it waits (deferred)
            best_key = best_for(v, cands)
            if fresh and (best_key is None or best_key[0]):
                # no existing signature takes v within the cap: a new one from today's frequencies
                sid = self._sig_id(template)
                pop.setdefault(sid, Counter())
                totals.setdefault(sid, 0)
                sig = self.sigs[sid]
                for w, lst in cands_of.items():
                    if w is None or w in sig:
                        lst.append(sid)
                changed(sid)
                key = key_of(sid, v)
                if best_key is None or key < best_key:
                    best_key = key
            best = best_key[-1]
            out[ui] = best
            bucket_units.setdefault(best, []).append(ui)
            here = present.get(best)
            if here is None:
                here = present[best] = Counter()
            if v is not None:
                here[v] += 1
            present_n[best] += 1
            pop[best][v] += 1                     # every signature has a population entry (made with it)
            totals[best] = totals.get(best, 0) + 1
            keys.pop(best, None)
            base[best] += best_key[2]             # the bucket's need now: the need with v counted
            changed(best)

    # -- phase 4 --------------------------------------------------------------------------------------------
    def reuse(self, view: WindowView, rows: np.ndarray, plan: Plan) -> dict[int, list[int]]:
        """Due rows -> a random covering earlier class whose signature fits the individual (all of an
        individual's due records go into one class)."""
        reused: dict[int, list[int]] = {}
        registry = view.registry
        if len(rows) == 0 or self.reuse_policy == "never" or len(registry) == 0:
            return reused
        unit_of_row, uids, unit_vals, _, placed_sig, (bound_sig, _, _), _ = self._close
        cover = registry.cover(view.X[rows])
        by_unit: dict[int, list[int]] = {}
        for i, r in enumerate(rows.tolist()):
            by_unit.setdefault(int(unit_of_row[r]), []).append(i)
        chosen: set[int] = set()
        for ui in sorted(by_unit, key=lambda u: int(uids[u])):
            bsid = bound_sig[ui]
            vals = unit_vals[ui]
            if bsid >= 0 or ui in placed_sig:
                fits = registry.tag == (bsid if bsid >= 0 else placed_sig[ui])
            else:
                fits = np.array([vals <= set(self.sigs[s]) for s in registry.tag.tolist()], dtype=bool)
            local = by_unit[ui]
            ok = cover[local].all(axis=0) & fits
            if not ok.any():
                continue          # suppressed by the core (no class of its signature covers all its due records)
            cand = np.flatnonzero(ok)
            again = [c for c in cand.tolist() if c in chosen]
            pick = again if again else cand.tolist()
            c = int(pick[int(view.rng.integers(len(pick)))])        # uniform: never the best-fitting class
            chosen.add(c)
            reused.setdefault(c, []).extend(int(rows[i]) for i in local)
            if bsid < 0:
                placed_sig[ui] = int(registry.tag[c])
        return reused

    # -- counterfeits and binding ---------------------------------------------------------------------------
    def complete(self, view: WindowView, groups: list, published_rows: list[int]) -> list[Counterfeits]:
        """Counterfeits per class of the release (``groups``: ``(class_id, rows, signature id)`` in release
        order), then bind the signatures of the real individuals published. ``published_rows`` (new classes'
        rows, then reused rows, in placement order) refresh the pool that dresses counterfeit records."""
        unit_of_row, uids, unit_vals, values, _, bound_now, rv = self._close
        bound_sig = bound_now[0]
        binds: dict[int, list] = {}              # local unit -> [signature id, value id, last] after this release
        self._close = None
        m, rng = self.m, view.rng
        fresh: dict[str, list] = {}              # the last pool_size published tuples per value, in order
        for r in reversed(published_rows):
            v = values[r]
            if v is not None:
                lst = fresh.setdefault(v, [])
                if len(lst) < self.params.pool_size:
                    lst.append(list(view.sensitive[r]))
        for v, lst in fresh.items():
            self.pool[v] = (self.pool.get(v, []) + lst[::-1])[-self.params.pool_size:]
        out = []
        for cid, rows, sid in groups:
            sig = self.sigs[sid]
            members, rec_counts = np.unique(unit_of_row[rows], return_counts=True)
            # distinct (individual, value) pairs of the class (an individual has one non-null value per release);
            # a value outside the signature raises (phases 1 and 2 guarantee it never happens)
            cols, nulls = rv.class_counts(rows, rv.columns_for(sig))
            counts = np.bincount(cols, minlength=len(sig))
            for ui in members.tolist():
                if bound_sig[ui] >= 0 and bound_sig[ui] != sid:    # pragma: no cover - division guarantees it
                    raise RuntimeError(f"{cid}: an individual's bound signature differs from the class signature")
            n_real = len(members)
            x = spread_counterfeits(counts, n_real, m, nulls=nulls)
            final_counts = counts + x
            if (np.count_nonzero(final_counts) < m or max(final_counts.max(), nulls) * m > n_real + x.sum()
                    or (final_counts == 0).any()):   # pragma: no cover - spread_counterfeits guarantees it
                raise RuntimeError(f"{cid}: not m-unique after counterfeits")
            rec_per_unit = rec_counts.tolist()
            dressed = []
            for j, v in enumerate(sig):
                for _ in range(int(x[j])):
                    n_rec = int(rec_per_unit[int(rng.integers(len(rec_per_unit)))])
                    dressed += [self._dress(v, rng) for _ in range(n_rec)]
            out.append(Counterfeits(int(x.sum()), dressed))
            self.stats["counterfeit_individuals"] += int(x.sum())
            self.stats["counterfeit_records"] += len(dressed)
            for ui in (members.tolist() if self.invariance else []):
                self._bind(binds, ui, bound_now, unit_vals[ui], sid, view.window_end)
        if binds:
            local = np.fromiter(binds, dtype=np.int64, count=len(binds))
            rows = np.array([tuple(b) for b in binds.values()], dtype=self.units.dtype)
            self.units.put(uids[local], rows)
        return out

    def _bind(self, binds: dict, ui: int, bound_now, vals: frozenset, sid: int, window_end: float) -> None:
        """Bind (or refresh) the signature of local unit ``ui`` in ``binds`` (written to the table in bulk)."""
        v = next(iter(vals)) if len(vals) == 1 else None
        bound = binds.get(ui)
        if bound is None:
            if bound_now[0][ui] < 0:
                binds[ui] = [sid, self._vid(v), float(window_end)]
                self.sig_pop[sid][v] += 1
                self.freq[v] += 1
                return
            bound = binds[ui] = [bound_now[0][ui], bound_now[1][ui], bound_now[2][ui]]
        old = None if bound[1] < 0 else self.values[bound[1]]
        if v is not None and v != old:
            self.sig_pop[sid][old] -= 1
            self.sig_pop[sid][v] += 1
            self.freq[old] -= 1
            self.freq[v] += 1
            bound[1] = self._vid(v)
            self.stats["value_changes_within_signature"] += 1
        bound[2] = float(window_end)

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
