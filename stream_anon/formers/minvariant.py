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

Guarantee (checked independently by :mod:`stream_anon.audit.checks.m_invariance`)
-------------------------------------------------------------------------------
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
from typing import TypeAlias

import numpy as np

from stream_anon.criteria.k_individuals import MaxClassNCP
from stream_anon.formers.base import (SUPPRESSED_VALUE_CHANGED, Counterfeits, NewClass, Plan, WindowView)
from stream_anon.formers.buckets import RowValues, invariant_text, split_bucket
from stream_anon.formers.counterfeits import need_one, spread_counterfeits
from stream_anon.formers.signatures import Signatures
from stream_anon.validation import MAX_COUNT, check_integer, check_number

STATE_VERSION = 4           # 4: the signatures' core under "signatures"
FREE = -1            # bucket of the measurement mode without invariance (``invariance=False``)
# What form() learns about a close for reuse() and complete(): each row's local unit, the unit ids, each unit's
# values, each row's value, local unit -> signature of its new class, (signature, value id, last release) of
# each unit as bound before the close, and the RowValues
_Close: TypeAlias = ("tuple[np.ndarray, np.ndarray, list[frozenset], list[str | None], dict[int, int], "
                     "tuple[list, list, list], RowValues]")


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
    stream_anon.errors.ConfigError: slack: must be in [0, 1), got 1.5
    """

    slack: float = 0.1
    split_tolerance: int = 0
    defer_counterfeit_share: float = 0.5
    pool_size: int = 32

    def __post_init__(self) -> None:
        check_number(self.slack, "slack", at_least=0, below=1)
        check_integer(self.split_tolerance, "split_tolerance", 0, MAX_COUNT)
        check_number(self.defer_counterfeit_share, "defer_counterfeit_share", at_least=0, at_most=100)
        check_integer(self.pool_size, "pool_size", 1, MAX_COUNT)


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
        self.loss_rule = MaxClassNCP(self.max_class_ncp)
        self.invariance = bool(invariance)
        self.inv_field = invariant_field
        self.inv_col = tuple(sensitive_fields).index(invariant_field)
        self.stats: Counter[str] = Counter()  # counterfeit individuals/records, value changes, signatures made
        self.book = Signatures(m, k, horizon_s, units_table, self.stats)
        self.pool: dict[str, list] = {}       # value -> recent published sensitive tuples (dress counterfeits)
        self.repr: dict[str, object] = {}     # value text -> a raw value with that text
        self._close: _Close | None = None     # what form() learnt about the current close, for reuse/complete

    # -- state ----------------------------------------------------------------------------------------------
    def state_core(self) -> dict:
        """The bounded part of the state (JSON): signatures, value dictionary, counterfeit pool, statistics."""
        return {"version": STATE_VERSION, "m": self.m, "signatures": self.book.state_core(), "pool": self.pool,
                "repr": self.repr, "stats": dict(self.stats)}

    def state_tables(self) -> dict:
        """The keyed tables of the former: ``signatures`` (unit id -> signature id, value id, last release time)."""
        return self.book.state_tables()

    def load_state(self, core: dict, tables: dict) -> None:
        """The core of :meth:`state_core` and the ``signatures`` table (unit id -> signature, value, last release)."""
        if core.get("version") != STATE_VERSION:
            raise ValueError(f"m-invariance state version {core.get('version')!r} is not {STATE_VERSION}")
        if core["m"] != self.m:
            raise ValueError(f"checkpoint signatures were made for m = {core['m']}, the config says m = {self.m}: "
                             "changing m would change signatures (start from an empty state to change it)")
        self.stats.clear()
        self.stats.update(core.get("stats", {}))
        self.book.load_state(core["signatures"], tables)
        self.pool = {k: [list(t) for t in v] for k, v in core["pool"].items()}
        self.repr = dict(core["repr"])

    @property
    def units(self):
        """The bound individuals' keyed table (:class:`~stream_anon.formers.signatures.Signatures`)."""
        return self.book.units

    @property
    def sigs(self) -> list[tuple[str, ...]]:
        return self.book.sigs

    def signature_of(self, unit_id: int) -> tuple[str, ...] | None:
        return self.book.signature_of(unit_id)

    def expire(self, now: float) -> None:
        """Forget the signatures of individuals not released for ``m_horizon_s`` (module docstring: Horizon)."""
        self.book.expire(now)

    # -- phases 1-3 -----------------------------------------------------------------------------------------
    def form(self, view: WindowView) -> Plan:
        m, k = self.m, self.k
        rng = view.rng
        n_rows = len(view)
        values = [invariant_text(s[self.inv_col]) for s in view.sensitive]
        rv = RowValues(values, view.units)
        for v, r in zip(rv.value_list, rv.first_row):
            if v not in self.repr:
                self.repr[v] = view.sensitive[r][self.inv_col]
        due = view.due
        uids, unit_of_row = rv.uids, rv.unit_of_row
        loss_rejected = np.zeros(n_rows, dtype=bool)
        plan = Plan(loss_rejected=loss_rejected)
        # bound signatures of the present individuals (one vectorized lookup; -1: not bound)
        if self.invariance and len(uids):
            found, brow = self.book.units.get(uids)
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
                                                          sig_sets.setdefault(bsid, set(self.book.sigs[bsid])))):
                # two values at once, or a value outside the bound signature: suppressed (module docstring)
                plan.suppressed.setdefault(SUPPRESSED_VALUE_CHANGED, []).extend(rv.rows_of(ui))
                self.stats["value_changed_individuals"] += 1
            elif bsid >= 0:
                bucket_units.setdefault(bsid, []).append(ui)
            else:
                new_units.append(ui)

        # -- phase 2: balancing and assignment of new individuals -------------------------------------------
        if self.invariance:
            self.book.assign(new_units, unit_vals, bucket_units, rng, self.params.slack)
        elif new_units:
            bucket_units[FREE] = new_units          # measurement mode: one bucket, classes choose their values

        # -- phase 3: split each bucket into classes ---------------------------------------------------------
        width = view.space.width
        for sid in sorted(bucket_units):
            members = bucket_units[sid]
            rows = rv.rows_of_units(members)
            presence = sid != FREE
            sig = self.book.sigs[sid] if presence else tuple(sorted({v for ui in members for v in unit_vals[ui]}))
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
                if self.loss_rule.binding and self._above_loss_limit(view, cls_rows):
                    loss_rejected[cls_rows] = True
                    continue
                if not presence:     # the class's own values, plus the absent ones its counterfeits get
                    cols, zz = rv.class_counts(cls_rows, sig_col)
                    cc = np.bincount(cols, minlength=len(sig))
                    x = spread_counterfeits(cc, len(np.unique(unit_of_row[cls_rows])), m, presence=False, nulls=zz)
                    plan.new_classes.append(NewClass(cls_rows, self.book.sig_id([v for v, n in zip(sig, cc + x)
                                                                             if n > 0])))
                    continue
                plan.new_classes.append(NewClass(cls_rows, sid))
        placed_sig: dict[int, int] = {}                         # local unit -> signature of its class here
        for nc in plan.new_classes:
            for ui in np.unique(unit_of_row[nc.rows]).tolist():
                placed_sig[ui] = nc.tag
        self._close = (unit_of_row, uids, unit_vals, values, placed_sig, bound_now, rv)
        return plan

    # -- phase 4 --------------------------------------------------------------------------------------------
    def _above_loss_limit(self, view: WindowView, rows: np.ndarray) -> bool:
        """Whether the class of ``rows`` has a snapped box whose NCP is above ``max_class_ncp``."""
        lo, hi, _ = view.space.snap(view.X[rows].min(axis=0, keepdims=True), view.X[rows].max(axis=0, keepdims=True))
        return bool(view.space.ncp(lo, hi)[0] > self.max_class_ncp)

    def reuse(self, view: WindowView, rows: np.ndarray, plan: Plan) -> dict[int, list[int]]:
        """Due rows -> a random covering earlier class whose signature fits the individual (all of an
        individual's due records go into one class)."""
        reused: dict[int, list[int]] = {}
        registry = view.registry
        if len(rows) == 0 or self.reuse_policy == "never" or len(registry) == 0:
            return reused
        unit_of_row, uids, unit_vals, _, placed_sig, (bound_sig, _, _), _ = self._closing()
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
                fits = np.array([vals <= set(self.book.sigs[s]) for s in registry.tag.tolist()], dtype=bool)
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

    def _closing(self) -> _Close:
        assert self._close is not None, "reuse() and complete() follow form() in a close (the engine's order)"
        return self._close

    # -- counterfeits and binding ---------------------------------------------------------------------------
    def complete(self, view: WindowView, groups: list, published_rows: list[int]) -> list[Counterfeits]:
        """Counterfeits per class of the release (``groups``: ``(class_id, rows, signature id)`` in release
        order), then bind the signatures of the real individuals published. ``published_rows`` (new classes'
        rows, then reused rows, in placement order) refresh the pool that dresses counterfeit records."""
        unit_of_row, uids, unit_vals, values, _, bound_now, rv = self._closing()
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
            sig = self.book.sigs[sid]
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
                self.book.bind(binds, ui, bound_now, unit_vals[ui], sid, view.window_end)
        if binds:
            local = np.fromiter(binds, dtype=np.int64, count=len(binds))
            rows = np.array([tuple(b) for b in binds.values()], dtype=self.book.units.dtype)
            self.book.units.put(uids[local], rows)
        return out

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
