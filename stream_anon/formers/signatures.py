"""The signatures of an m-invariant former: which signature (set of invariant values) each released individual
is bound to, the population of every signature, and how a new individual joins one (phase 2 of
:mod:`stream_anon.formers.minvariant`, whose docstring states the rules)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from stream_anon.formers.counterfeits import need_one

# record of the ``signatures`` keyed table (unit id -> ...): 16 bytes per bound individual, plus its 8-byte key
SIGNATURE_FIELDS = [("sig", "<i4"), ("value", "<i4"), ("last", "<f8")]


class Signatures:
    """Signatures (id -> sorted tuple of value texts), their populations, and the bound individuals: the keyed
    table ``units`` (unit id -> signature id, value id or -1 for null, event time of the last release; value ids
    index ``values``, the value dictionary in the order values were first bound). ``stats``: the former's counters
    (signatures made, expired, value changes). A :class:`~stream_anon.checkpoint.Checkpointable`."""

    def __init__(self, m: int, k: int, horizon_s: float | None, units_table, stats: Counter):
        self.m, self.k, self.horizon_s, self.stats = int(m), int(k), horizon_s, stats
        self.sigs: list[tuple[str, ...]] = []
        self.sig_index: dict[tuple[str, ...], int] = {}
        self.sig_pop: list[Counter] = []        # bound individuals per signature and value
        self.units = units_table                # stream_anon.keyed_table.KeyedTable(SIGNATURE_FIELDS), empty
        self.values: list[str] = []
        self.value_id: dict[str, int] = {}
        self.freq: Counter = Counter()          # bound individuals per value (for new signatures' companions)

    def state_core(self) -> dict:
        """Signature value sets and the value dictionary (bounded: signatures are made from the values seen)."""
        return {"sigs": [list(s) for s in self.sigs], "values": list(self.values)}

    def state_tables(self) -> dict:
        """``signatures``: unit id -> signature id, value id, last release time."""
        return {"signatures": self.units}

    def load_state(self, core: dict, tables: dict) -> None:
        unknown = set(tables) - {"signatures"}
        if unknown:
            raise ValueError(f"m-invariance state holds unknown table(s) {sorted(unknown)}")
        self.sigs = [tuple(s) for s in core["sigs"]]
        self.sig_index = {s: i for i, s in enumerate(self.sigs)}
        self.values = list(core["values"])
        self.value_id = {v: i for i, v in enumerate(self.values)}
        keys, rows = tables.get("signatures", (np.empty(0, np.int64), np.empty(0, self.units.dtype)))
        rows = np.asarray(rows)
        if rows.dtype != self.units.dtype:
            raise ValueError(f"signatures table: records of dtype {rows.dtype}, expected {self.units.dtype}")
        if len(rows) and (rows["sig"].max() >= len(self.sigs) or rows["value"].max() >= len(self.values)):
            raise ValueError("signatures table refers to signatures or values the core does not know")
        self.units.load(keys, rows)
        self._recount()

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

    def vid(self, v: str | None) -> int:
        if v is None:
            return -1
        i = self.value_id.get(v)
        if i is None:
            i = self.value_id[v] = len(self.values)
            self.values.append(v)
        return i

    def signature_of(self, unit_id: int) -> tuple[str, ...] | None:
        found, rows = self.units.get(np.array([int(unit_id)], dtype=np.int64))
        return self.sigs[int(rows["sig"][0])] if found[0] else None

    def sig_id(self, values) -> int:
        key = tuple(sorted(values))
        sid = self.sig_index.get(key)
        if sid is None:
            sid = self.sig_index[key] = len(self.sigs)
            self.sigs.append(key)
            self.sig_pop.append(Counter())
            self.stats["signatures"] += 1
        return sid

    def template(self, v: str | None, freq: Counter) -> tuple[str, ...] | None:
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

    def assign(self, new_units, unit_vals, bucket_units, rng, slack: float) -> dict[int, int]:
        """Phase 2: put every new individual in a bucket (tentatively: bound only once published)."""
        m = self.m
        out: dict[int, int] = {}
        if not new_units:
            return out
        val_of = {ui: next(iter(unit_vals[ui])) if unit_vals[ui] else None for ui in new_units}
        freq = Counter(self.freq)
        freq.update(v for v in val_of.values() if v is not None)
        cap = (1.0 - slack) / m
        # present counts per bucket (this release) and population per signature (bound + tentative)
        present: dict[int, Counter] = {}
        present_n: Counter = Counter()
        for sid, members in bucket_units.items():
            cnt: Counter = Counter()
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
        empty: Counter = Counter()
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
                template = template_of[v] = self.template(v, freq)
            fresh = template is not None and template not in self.sig_index
            if not cands and template is None:
                continue                      # fewer than m values seen so far: it waits (deferred)
            best_key = best_for(v, cands)
            if fresh and (best_key is None or best_key[0]):
                # no existing signature takes v within the cap: a new one from today's frequencies
                sid = self.sig_id(template)
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
        return out

    def bind(self, binds: dict, ui: int, bound_now, vals: frozenset, sid: int, window_end: float) -> None:
        """Bind (or refresh) the signature of local unit ``ui`` in ``binds`` (written to the table in bulk)."""
        v = next(iter(vals)) if len(vals) == 1 else None
        bound = binds.get(ui)
        if bound is None:
            if bound_now[0][ui] < 0:
                binds[ui] = [sid, self.vid(v), float(window_end)]
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
            bound[1] = self.vid(v)
            self.stats["value_changes_within_signature"] += 1
        bound[2] = float(window_end)
