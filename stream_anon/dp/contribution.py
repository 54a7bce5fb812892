"""Contribution bounding: the step that gives every noisy aggregate a finite sensitivity. Step 3 of the walk of a
DP value (:mod:`stream_anon.dp`).

Per window and per aggregate each individual (a value of the aggregates' ``privacy_unit``) keeps at most
``max_contributions`` (``C``) events: the **first ones in arrival order** (a deterministic choice that depends only
on that individual's own events, so a restarted worker cuts the same events). Numeric values are clamped to the
configured ``[lower, upper]``. With both bounds the L1 sensitivity of one window of a count is ``C`` and of a sum
``C * max(|lower|, |upper|)`` (Wilson et al., *Differentially Private SQL with Bounded User Contribution*, PoPETs
2020; Amin et al., *Bounding User Contributions*, ICML 2019).

Period mode (``[dp] period``) also bounds the windows: per aggregate, a unit contributes to at most ``W`` windows
of a period (the first ones in time), counted in the **unit window table** (:func:`unit_window_table`: the unit's
key -> windows used in the period, one column per aggregate; the aggregator's keyed state). A unit's key is the
engine's keyed 64-bit id of the unit (scheme ``ids``, when the aggregates' unit is the stream's privacy unit) or a
keyed BLAKE2b hash of the unit's text (scheme ``hash``): never the unit itself (:class:`UnitKeys`). With
``unit = "event"`` every event is its own unit and nothing is counted.

:class:`Bounding` applies both caps to a window's :class:`~stream_anon.dp.cells.EventCells` in numpy and sums the
kept contributions per cell (:func:`cell_sums`): the bounded true values the noisy release starts from.

>>> keep, cut = bound_contributions(["a", "b", "a", "a", "b"], 2)
>>> keep.tolist(), cut
([True, True, True, False, True], 1)
>>> clamp([-5, 3, 120], 0, 100).tolist()
[0.0, 3.0, 100.0]
>>> rank, units, first = UnitGroups(np.array([3, 1, 3, 3, 1])).subset(np.arange(5))
>>> (rank < 2).tolist()                     # each unit's first 2 events
[True, True, True, False, True]
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Sequence, cast

import numpy as np
import pandas as pd

from stream_anon.dp.cells import EventCells
from stream_anon.dp.columns import WindowColumns
from stream_anon.dp.specs import AggregateSpec
from stream_anon.events import UNIT_IDS
from stream_anon.keyed_table import KeyedTable

# privacy units the columnar path takes: all text or all integers (missing ones aside), where one value for a dict
# is one value for the unit's text (its hash); other mixes (1 and 1.0, 1 and "1") go event by event
PLAIN_UNIT_TYPES = ({str, type(None)}, {int, type(None)})


def bound_contributions(units: Sequence, max_contributions: int) -> tuple[np.ndarray, int]:
    """Mask of the events kept (the first ``max_contributions`` of each individual, in the given order) and the
    number of events cut. ``units`` holds one privacy-unit value per event, in arrival order."""
    if isinstance(max_contributions, bool) or not isinstance(max_contributions, (int, np.integer)) \
            or max_contributions < 1:
        raise ValueError(f"max_contributions: must be a positive integer, got {max_contributions!r}")
    n = len(units)
    if n == 0:
        return np.zeros(0, dtype=bool), 0
    codes = pd.factorize(np.asarray(list(units), dtype=object), use_na_sentinel=False)[0]
    rank = pd.Series(codes).groupby(codes).cumcount().to_numpy()
    keep = rank < max_contributions
    return keep, int(n - keep.sum())


def clamp(values, lower: float, upper: float) -> np.ndarray:
    """Values clipped to ``[lower, upper]`` (bounds from configuration, never from the data)."""
    if not lower < upper:
        raise ValueError(f"clamp: lower ({lower}) must be below upper ({upper})")
    return np.clip(np.asarray(values, dtype=float), lower, upper)


def cell_sums(spec: AggregateSpec, cells: np.ndarray, kept: np.ndarray | None) -> dict[str, np.ndarray]:
    """Cell values (component -> one value per cell) from the contributions kept after bounding: the cell of each
    (``cells``) and, for sums and means, its value (clamped to the bounds and rounded to the resolution here), for
    ratios whether it counts in the numerator (0/1)."""
    n = len(spec.domain)
    count = np.bincount(cells, minlength=n).astype(float)
    if spec.kind in ("count", "histogram"):
        return {"count": count}
    assert kept is not None, "the values kept of a sum, mean or ratio"
    if spec.kind in ("sum", "mean"):
        v = np.clip(kept, spec.lower, spec.upper)
        v = np.round(v / spec.resolution) * spec.resolution      # integer noise in units of the resolution
        x = {"sum": np.bincount(cells, weights=v, minlength=n) if len(v) else np.zeros(n)}
        if spec.kind == "mean":
            x["count"] = count
        return x
    return {"numerator": np.bincount(cells, weights=kept, minlength=n) if len(kept) else np.zeros(n),
            "denominator": count}


class UnitGroups:
    """A window's events grouped by unit once (one stable sort of their unit codes), for the subsets its
    aggregates keep: a subset's units and each of its events' rank among its unit's events (in the window's
    order) in linear time, where ``np.unique`` and a rank by unit would sort again per aggregate. ``rank < C`` is
    the rule of :func:`bound_contributions` (each unit's first ``C`` events).

    >>> g = UnitGroups(np.array([3, 1, 3, 3, 1, 2]))
    >>> rank, units, first = g.subset(np.array([0, 1, 3, 4]))
    >>> rank.tolist(), units.tolist(), first.tolist()
    ([0, 0, 1, 1], [1, 3], [1, 0])
    """

    def __init__(self, codes: np.ndarray):
        self.codes = np.asarray(codes)
        self.order = np.argsort(self.codes, kind="stable")     # a unit's events together, in their order

    def subset(self, events: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``events`` (indices into the window, increasing): each one's rank among the events of its unit
        in the subset (0 for the first), the subset's unit codes (ascending) and the index of each unit's first
        event."""
        n, k = len(self.codes), len(events)
        if k == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=self.codes.dtype), np.zeros(0, dtype=np.int64)
        mask = np.zeros(n, dtype=bool)
        mask[events] = True
        order = self.order[mask[self.order]]
        codes = self.codes[order]
        starts = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(k) - np.repeat(starts, np.diff(np.append(starts, k)))
        return rank[events], codes[starts], order[starts]


# -- the unit window table (period mode) --------------------------------------------------------------------------
def unit_window_table(specs) -> KeyedTable:
    """Unit key -> windows the unit used in the current period, one u2 column per aggregate (one lookup per window
    for all aggregates, 8 bytes of key per unit)."""
    return KeyedTable([(s.name, "<u2") for s in specs])


class UnitKeys:
    """How units are told apart and keyed in the unit window table: ``scheme`` ``ids`` (the window's
    :data:`~stream_anon.events.UNIT_IDS` column: the engine's keyed 64-bit ids) or ``hash`` (a BLAKE2b hash of the
    unit's text keyed by the secret seed). Either way the state never holds a raw identifier."""

    def __init__(self, seed: bytes, scheme: str):
        if scheme not in ("ids", "hash"):
            raise ValueError(f"unit key scheme: expected 'ids' or 'hash', got {scheme!r}")
        self.scheme = scheme
        key = hmac.new(seed, b"stream-anon/dp-unit-hash", hashlib.sha256).digest()
        self._hasher = hashlib.blake2b(key=key, digest_size=8)     # copied per unit

    def hashes(self, units: list) -> np.ndarray:
        """The keyed 64-bit hash of each unit, as uint64 (keyed by the text hashed: 1 == 1.0, "1" != "1.0"). A copy
        of one keyed hasher per unit: the key block is absorbed once (the digests are those of
        ``blake2b(text, key=...)``, ~30% faster; most units of a window are new, so no cache)."""
        copy = self._hasher.copy
        digests: list[bytes] = []
        append = digests.append
        for u in units:
            h = copy()
            h.update((u if type(u) is str else str(u)).encode())
            append(h.digest())
        return np.frombuffer(b"".join(digests), dtype="<u8").astype(np.uint64)

    def table_keys(self, units) -> np.ndarray:
        """The unit window table's keys (int64) of distinct units: the ids themselves, or their keyed hashes."""
        if self.scheme == "ids":
            return np.asarray(units, dtype=np.int64)
        return self.hashes(units).view(np.int64)

    @staticmethod
    def id_codes(wc: WindowColumns) -> tuple[np.ndarray, np.ndarray]:
        """(code of each event's unit, distinct unit ids) from the window's :data:`UNIT_IDS` column."""
        hit = wc.memo.get(UNIT_IDS)
        if hit is None:
            ids = wc.columns.get(UNIT_IDS, np.empty(0, dtype=np.int64) if wc.n == 0 else None)
            if ids is None or len(ids) != wc.n:
                raise ValueError(f"the window's columns carry no unit ids ({UNIT_IDS}) for its {wc.n} events: the "
                                 "aggregator keys units by the engine's ids (unit_ids=True)")
            uniq, codes = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)
            hit = wc.memo[UNIT_IDS] = (codes.reshape(-1), uniq)
        return hit


class WindowUnits:
    """The unit window counts of one window's units, read from the table once and written back once: every
    aggregate of the window reads and updates its own column here (one table lookup and one write per window,
    not one per aggregate)."""

    def __init__(self, table: KeyedTable):
        self.table = table
        self.keys = np.empty(0, dtype=np.int64)          # sorted, unique
        self.rows = np.zeros(0, dtype=table.dtype)
        self.changed = np.zeros(0, dtype=bool)
        self.generation = 0                              # + 1 whenever keys are added (positions move)

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """Positions of ``keys`` in :attr:`rows`, reading the keys not held yet from the table."""
        keys = np.asarray(keys, dtype=np.int64)
        pos = np.searchsorted(self.keys, keys)
        held = pos < len(self.keys)
        held[held] = self.keys[pos[held]] == keys[held]
        if not held.all():
            new = np.unique(keys[~held])
            _, rows = self.table.get(new)
            order = np.argsort(np.concatenate([self.keys, new]), kind="stable")
            self.keys = np.concatenate([self.keys, new])[order]
            self.rows = np.concatenate([self.rows, rows])[order]
            self.changed = np.concatenate([self.changed, np.zeros(len(new), dtype=bool)])[order]
            self.generation += 1
            pos = np.searchsorted(self.keys, keys)
        return pos

    def flush(self) -> None:
        """Write the rows counted in to the table."""
        if self.changed.any():
            self.table.put(self.keys[self.changed], self.rows[self.changed])
            self.changed[:] = False


# -- both caps on a window ------------------------------------------------------------------------------------------
class Bounding:
    """Contribution bounding of an aggregator's aggregates. ``field``: the privacy unit's field; ``keys``: its
    :class:`UnitKeys` (None: every event its own unit); ``caps``: aggregate -> ``W`` in period mode, else None."""

    def __init__(self, field: str | None, keys: UnitKeys | None, caps: dict[str, int] | None):
        self.field, self.keys, self.caps = field, keys, caps

    def takes(self, wc: WindowColumns) -> bool:
        """Whether :meth:`bound` takes the window's units (else the per-event path bounds them)."""
        if self.keys is None or self.keys.scheme == "ids":
            return True
        types = wc.types(cast(str, self.field))     # units with keys are values of a field
        return any(types <= plain for plain in PLAIN_UNIT_TYPES)

    def bound(self, spec: AggregateSpec, wc: WindowColumns, cells: EventCells, window_units: WindowUnits | None,
              commit: bool = True) -> tuple[dict[str, np.ndarray], dict]:
        """(bounded true value of every cell per component, counts of what was left out) of one window for one
        aggregate. ``window_units``: the window's unit counts (period mode), shared by its aggregates and flushed by
        the caller; ``commit``: count this window for the units admitted."""
        positions = cells.positions
        m = len(positions)
        all_codes: np.ndarray | None = None          # each event's unit code, all the window's events
        distinct_units: np.ndarray | list | None     # the window's units (their codes index them)
        if self.keys is None:                        # every event its own unit, numbered after the filter
            unit_codes, distinct_units = np.arange(m), None
            unit_none = np.zeros(m, dtype=bool)
        elif self.keys.scheme == "ids":              # every accepted event has a unit (the engine checked)
            all_codes, distinct_units = self.keys.id_codes(wc)
            unit_codes = all_codes[positions]
            unit_none = np.zeros(m, dtype=bool)
        else:
            all_codes, distinct_units = wc.factorized(self.field)
            unit_codes = all_codes[positions]
            unit_none = unit_codes == wc.code_of_none(self.field)
        # each event left out is counted once, in this order: no unit (missing), no key, no value (missing)
        has_unit_key = ~unit_none & ~cells.key_none
        missing = int(unit_none.sum()) + int((has_unit_key & ~cells.valid).sum())
        ood = int((~unit_none & cells.key_none).sum())
        cand = np.flatnonzero(has_unit_key & cells.valid)
        units = unit_codes[cand]
        if all_codes is None:                        # one event per unit
            rank = np.zeros(len(cand), dtype=np.int64)
        else:
            # each event's rank among its unit's events, and the units (sorted), from one grouping of the
            # window's events by unit shared by its aggregates (no sort per aggregate)
            groups = wc.memo.get("unit_groups")
            if groups is None:
                groups = wc.memo["unit_groups"] = UnitGroups(all_codes)
            rank, uniq, first = groups.subset(positions[cand])
        extra = {}
        if self.caps is not None:
            wcut = ucut = 0
            if self.keys is not None and len(cand):
                assert distinct_units is not None            # units with keys: their codes were found above
                uniq, admitted = self._admitted(spec.name, wc, distinct_units, uniq, first, commit, window_units)
                if not admitted.all():
                    ok_code = np.zeros(len(distinct_units), dtype=bool)
                    ok_code[uniq] = admitted
                    ev_ok = ok_code[units]
                    wcut, ucut = int(len(units) - ev_ok.sum()), int(len(admitted) - admitted.sum())
                    cand, units, rank = cand[ev_ok], units[ev_ok], rank[ev_ok]   # whole units: ranks hold
            extra = {"windows_cut": wcut, "units_window_capped": ucut}
        keep = rank < spec.max_contributions         # each unit's first events (bound_contributions' rule)
        cut = int(len(keep) - keep.sum())
        # the other kinds have a value field, so values (CellKeys.of_window)
        kept = None if spec.kind in ("count", "histogram") else cast(np.ndarray, cells.values)[cand][keep].astype(float)
        x = cell_sums(spec, cells.cell[cand][keep], kept)
        return x, {"contributions_cut": cut, "out_of_domain": ood, "missing": missing, **extra}

    def _admitted(self, name, wc, distinct_units, uniq, first, commit, window_units
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(the aggregate's unit codes ``uniq``, in the order they were counted; which of them may still contribute
        a window in this period)."""
        # the rows of all the window's units, found once for its aggregates (valid while no aggregate brought
        # other units into ``window_units``: its generation)
        assert self.keys is not None                 # called for units with keys only (bound)
        keys = wc.memo.get("unit_keys")
        if keys is None:
            keys = wc.memo["unit_keys"] = self.keys.table_keys(distinct_units)
        memo = wc.memo.get("unit_positions")
        if memo is None or memo[0] is not window_units or memo[1] != window_units.generation:
            pos_all = window_units.positions(keys)
            memo = wc.memo["unit_positions"] = (window_units, window_units.generation, pos_all,
                                                len(np.unique(pos_all)) == len(pos_all))
        _, _, pos_all, all_distinct = memo
        if not all_distinct:                 # counted one by one: in the order of the units' first events
            uniq = uniq[np.argsort(first, kind="stable")]
        return uniq, self.cap_units(name, pos_all[uniq], commit, window_units, distinct=True if all_distinct else None)

    def cap_units(self, name: str, pos: np.ndarray, commit: bool, window_units: WindowUnits,
                  distinct: bool | None = None) -> np.ndarray:
        """Which of a window's units (their rows in ``window_units``, one per unit, in the order of the units'
        first events) may still contribute a window to ``name`` in this period: fewer than ``W`` windows counted
        so far (the first windows in time: a choice that depends on the unit's own events only). ``commit``:
        count this window for the admitted units (in ``window_units``, written to the table when it is flushed).
        ``distinct``: whether the positions are known to differ (no two units share a 64-bit key), if known."""
        assert self.caps is not None                 # period mode: the only one that caps windows
        cap = self.caps[name]
        column = window_units.rows[name]             # a view: assignments update the window's rows
        counts = column[pos].astype(np.int64)
        if distinct is None:
            distinct = len(np.unique(pos)) == len(pos)
        if distinct:
            admitted = counts < cap
            if commit:
                at = pos[admitted]
                column[at] = counts[admitted] + 1
                window_units.changed[at] = True
            return admitted
        # two units of the window share a 64-bit hash, hence a count: the units one by one, in order
        admitted = np.zeros(len(pos), dtype=bool)
        for j, p in enumerate(pos.tolist()):
            c = int(column[p])
            admitted[j] = c < cap
            if admitted[j] and commit:
                column[p] = c + 1
                window_units.changed[p] = True
        return admitted

    def window_cap(self, name: str, units: list, commit: bool, window_units: WindowUnits
                   ) -> tuple[list[bool], int, int]:
        """Per-event form of :meth:`cap_units`: mask of the events whose unit is admitted; events and units cut."""
        assert self.keys is not None                 # units that are not events (per_event.cell_values)
        distinct = list(dict.fromkeys(units))
        pos = window_units.positions(self.keys.table_keys(distinct))
        ok = self.cap_units(name, pos, commit, window_units).tolist()
        admitted = dict(zip(distinct, ok))
        mask = [admitted[u] for u in units]
        return mask, len(mask) - sum(mask), ok.count(False)

