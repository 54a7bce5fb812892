"""Privacy budget ledger: user-level accounting across windows, reserved before any release spends it. Step 4
of the walk of a DP value (:mod:`stream_anon.dp`).

Accounting unit. Every release of an aggregate for a window is charged to **every** individual (the worst case
of an individual present in every window and every aggregate), so the total over all reservations bounds the
privacy loss of any one individual by sequential composition (Dwork & Roth 2014, Theorem 3.16; McSherry, PINQ,
SIGMOD 2009). The sum is checked by diffprivlib's :class:`~diffprivlib.accountant.BudgetAccountant` (pure
epsilon, no slack, i.e. basic composition). Per-individual filters
(Feldman & Zrnic, NeurIPS 2021) could charge only the individuals present, but the budget check would then
depend on the data; the worst-case charge keeps the stop decision data-independent.

Durability. The ledger is part of the partition's state (a :class:`~stream_anon.checkpoint.Checkpointable` with
a bounded core and no keyed table): the worker writes it in the same Kafka transaction as the rows that spend it
(:mod:`stream_anon.worker.state`), so a release is published only together with its spend, and a restarted worker
resumes from the committed ledger. A reservation is keyed by ``(aggregate, window)``: reserving it again (a
restarted worker re-producing the same window) returns the existing reservation and spends nothing. That is sound
because the aggregator's noise is a deterministic function of a secret seed and the window, so a re-produced
release is identical to the first; and a window released again with other content (its bounded values, seen
through :func:`content_digest`) is a second, paid release with its own noise.

Periods (``[dp] period``, the unit of privacy explicit). A reservation may carry the period it belongs to and a
cap: the most that aggregate can charge one unit in that period. The aggregator calibrates the noise so that a
unit contributing to at most ``W`` windows of a period loses at most the aggregate's ``epsilon`` over all of the
period's releases, and charges each release its share ``epsilon * m / W`` (``m`` windows per release); the
ledger then charges a period ``sum over aggregates of min(sum of its releases, cap)`` and keeps that total below
the budget, which is per unit **and period**. Periods are disjoint in time, so a unit's loss over ``k`` periods
is at most ``k`` times the per-period budget (sequential composition; Dwork & Roth 2014, Theorem 3.16). A paid
re-release (``"<window>~<n>"``) is charged outside the cap: it releases the same data a second time.

Bounded size. In period mode the ledger would otherwise grow by one entry per aggregate and release for ever,
and it is written whole with every state record. When the aggregator starts a period, :meth:`BudgetLedger.compact`
folds every period older than the previous one into its totals (per aggregate: the sum of its releases and its
cap; the paid re-releases; the stops): what :meth:`period_spent` and :attr:`spent` need; after
:data:`SUMMARY_PERIODS` such periods only the largest charge of the older ones is kept (for :attr:`spent`). Their
per-window entries, needed only to recognise a re-produced release of a window, go: the aggregator never processes
a window at or before its last one, so no release of a finished period is produced again (one that were would be
charged again, never less). Without a period the entries are bounded by the budget (each spends epsilon > 0).

>>> ledger = BudgetLedger(None, epsilon_budget=1.0)
>>> ledger.reserve("taps", 0, 0.6).ok, ledger.reserve("taps", 0, 0.6).new
(True, False)
>>> import json
>>> restarted = BudgetLedger(None, epsilon_budget=1.0)
>>> restarted.load_state(json.loads(json.dumps(ledger.state_core())), {})
>>> out = restarted.reserve("taps", 1, 0.6)
>>> out.ok, round(out.spent, 3), out.event()["type"]
(False, 0.6, 'budget_exhausted')
"""
from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass, field
from typing import NamedTuple
from datetime import datetime, timezone

import numpy as np
from diffprivlib.accountant import BudgetAccountant
from diffprivlib.utils import BudgetError

from stream_anon.checkpoint import load_tables

LEDGER_VERSION = 1
KEEP_PERIODS = 2           # periods whose per-window entries are kept (the current one and the one before)
SUMMARY_PERIODS = 31       # older periods kept as per-aggregate totals; beyond them only their largest charge
_REL_TOL = 1e-9     # floating-point slack: ten spends of 0.1 must fit a budget of 1.0


def content_digest(seed: bytes, aggregate: str, window: int, values: dict[str, np.ndarray]) -> str:
    """Keyed digest (HMAC of the secret seed) of a release's bounded true values (component -> per cell), the
    ``content`` of a reservation: without the seed it reveals nothing of the values."""
    h = hmac.new(seed, f"stream-anon/dp-content\x00{aggregate}\x00{window}".encode(), hashlib.sha256)
    for comp in sorted(values):
        h.update(comp.encode() + b"\x00" + np.ascontiguousarray(values[comp], dtype=float).tobytes())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Reservation:
    """A spend recorded in the ledger. ``new`` is False when the same (aggregate, window) was reserved before."""
    aggregate: str
    window: str
    epsilon: float
    spent: float                # total spent after this reservation
    budget: float
    new: bool = True
    ok: bool = field(default=True, init=False)


@dataclass(frozen=True)
class BudgetExhausted:
    """The outcome of a reservation that would exceed the budget; the aggregate is stopped for good."""
    aggregate: str
    window: str
    epsilon: float
    spent: float
    budget: float
    first: bool = True          # False when the aggregate had already been stopped
    ok: bool = field(default=False, init=False)

    def event(self, stream: str = "") -> dict:
        """The ``budget_exhausted`` event for the metrics topic."""
        return {"type": "budget_exhausted", "stream": stream, "aggregate": self.aggregate, "window": self.window,
                "epsilon_requested": self.epsilon, "epsilon_spent": self.spent, "epsilon_budget": self.budget,
                "ts": datetime.now(timezone.utc).isoformat()}


class BudgetExhaustedError(BudgetError):
    """Raised by :meth:`BudgetLedger.reserve` with ``raise_on_exhausted=True``."""

    def __init__(self, outcome: BudgetExhausted):
        super().__init__(f"{outcome.aggregate} window {outcome.window}: spending {outcome.epsilon} would exceed "
                         f"the budget ({outcome.spent} of {outcome.budget} spent)")
        self.outcome = outcome


class PeriodTotals:
    """The ledger's totals per period (period mode): per (period, aggregate) the sum of its releases and its cap, per
    period the paid re-releases (uncapped). What a period charged the worst-case unit is read from them alone, also
    once the period's entries are compacted away (:meth:`BudgetLedger.compact`)."""

    def __init__(self) -> None:
        self._sums: dict[tuple[str, str], float] = {}       # (period, aggregate) -> capped part: sum of releases
        self._caps: dict[tuple[str, str], float] = {}       # (period, aggregate) -> cap
        self._extra: dict[str, float] = {}                  # period -> paid re-releases (uncapped)

    def add(self, period: str, aggregate: str, epsilon: float, cap: float, rerelease: bool) -> None:
        if rerelease:
            self._extra[period] = self._extra.get(period, 0.0) + epsilon
        else:
            self._sums[(period, aggregate)] = self._sums.get((period, aggregate), 0.0) + epsilon
            self._caps[(period, aggregate)] = float(cap)

    def parts(self, period: str) -> tuple[dict[str, tuple[float, float]], float]:
        """(aggregate -> (sum of its releases, its cap), the paid re-releases) of ``period``."""
        sums = {a: (v, self._caps[(p, a)]) for (p, a), v in sorted(self._sums.items()) if p == period}
        return sums, self._extra.get(period, 0.0)

    def periods(self) -> set[str]:
        return {p for p, _ in self._sums} | set(self._extra)

    def summary(self, period: str) -> dict:
        aggs = sorted(a for (p, a) in self._sums if p == period)
        return {"sums": {a: self._sums[(period, a)] for a in aggs}, "caps": {a: self._caps[(period, a)] for a in aggs},
                "extra": self._extra.get(period, 0.0)}

    def load(self, period: str, summary: dict) -> None:
        for a, v in summary["sums"].items():
            self._sums[(period, a)] = float(v)
            self._caps[(period, a)] = float(summary["caps"][a])
        if float(summary.get("extra", 0.0)):
            self._extra[period] = float(summary["extra"])

    def drop(self, period: str) -> None:
        self._extra.pop(period, None)
        for key in [key for key in self._sums if key[0] == period]:
            del self._sums[key], self._caps[key]


class BudgetLedger:
    """Budget ledger (module docstring), a Checkpointable: :meth:`state_core`, :meth:`load_state`.

    Parameters
    ----------
    path : None
        The ledger has no file: it lives in the partition's state. Any other value is refused.
    epsilon_budget : float
        Total epsilon per individual over all aggregates and windows (per period in period mode). Must be in
        (0, inf).
    """

    def __init__(self, path: None, epsilon_budget: float):
        if path is not None:
            raise TypeError(f"path: the ledger is kept in the partition's state (state_core / load_state), not in "
                            f"a file; got {path!r}")
        if isinstance(epsilon_budget, bool) or not isinstance(epsilon_budget, (int, float)) \
                or not (0 < epsilon_budget < math.inf):
            raise ValueError(f"epsilon_budget: must be a finite number > 0, got {epsilon_budget!r}")
        self.epsilon_budget = float(epsilon_budget)
        self._entries: dict[tuple[str, str], float] = {}
        self._exhausted: dict[str, dict] = {}
        self._content: dict[tuple[str, str], str] = {}      # digest of the released content per entry
        self._period: dict[tuple[str, str], tuple[str, float]] = {}   # entry -> (period, cap) in period mode
        self._totals = PeriodTotals()
        # compacted periods (:meth:`compact`): their totals stay in _totals; here what else is kept
        self._compacted: dict[str, dict] = {}               # period -> {"entries": count, "exhausted": stops}
        self._archive: dict | None = None                   # periods before the compacted ones: largest charge
        # without a period: the total, checked by diffprivlib (pure epsilon, basic composition)
        self._accountant = BudgetAccountant(epsilon=self.epsilon_budget * (1 + _REL_TOL), delta=0.0)
        # :meth:`charge_entries`, kept while entries are only added (a release appends one); None: built when asked
        self._charge_list: list[ChargeEntry] | None = None

    def _index(self, key: tuple[str, str], epsilon: float, period: str, cap: float) -> None:
        self._period[key] = (period, float(cap))
        self._totals.add(period, key[0], epsilon, cap, "~" in key[1])

    def period_spent(self, period: str, extra: tuple[str, float, float, bool] | None = None) -> float:
        """Epsilon charged to the worst-case unit in ``period`` (optionally with one more release ``(aggregate,
        epsilon, cap, rerelease)``)."""
        sums, total = self.period_parts(period)
        if extra is not None:
            a, epsilon, cap, rerelease = extra
            if rerelease:
                total += epsilon
            else:
                sums[a] = (sums.get(a, (0.0, cap))[0] + epsilon, cap)
        for a in sorted(sums):      # a fixed order: a float sum over a set would depend on the string hash seed
            total += min(*sums[a])
        return total

    def period_parts(self, period: str) -> tuple[dict[str, tuple[float, float]], float]:
        """What :meth:`period_spent` adds up for ``period``: (aggregate -> (sum of its releases, its cap), the paid
        re-releases)."""
        return self._totals.parts(period)

    def spent_by_period(self) -> dict[str, float]:
        """Period -> epsilon charged to the worst-case unit (period mode)."""
        return {p: self.period_spent(p) for p in sorted(self.periods())}

    def periods(self) -> set[str]:
        """The periods the ledger holds charges of (not those only in its archive)."""
        return self._totals.periods()

    def charges(self, period: str | None) -> dict[str, float]:
        """Aggregate -> what it charged the worst-case unit in ``period``: ``min(sum of its releases, cap)`` plus
        its paid re-releases, summing to :meth:`period_spent` while the period's entries are kept (the current
        period and the one before: :meth:`compact`); a compacted period's re-releases are kept as the period's
        total only, in no aggregate's figure. ``period`` None (no periods): the sum of each aggregate's
        reservations, summing to :attr:`spent`."""
        out: dict[str, float] = {}
        if period is None:
            for (a, _), e in self._entries.items():
                out[a] = out.get(a, 0.0) + e
            return out
        out = {a: min(v, cap) for a, (v, cap) in self._totals.parts(period)[0].items()}
        for (a, w), (p, _) in self._period.items():
            if p == period and "~" in w:
                out[a] = out.get(a, 0.0) + self._entries[(a, w)]
        return out

    @property
    def period_mode(self) -> bool:
        return bool(self._period or self._compacted or self._archive)

    # -- Checkpointable -------------------------------------------------------------------------------------
    def state_core(self) -> dict:
        """Every reservation (JSON), the stops, and the compacted periods' totals: bounded by the configuration
        (module docstring), never by the units seen."""
        return {"version": LEDGER_VERSION, "epsilon_budget": self.epsilon_budget, "spent": self.spent,
                "entries": [{"aggregate": a, "window": w, "epsilon": e, "content": self._content.get((a, w)),
                             **({"period": self._period[(a, w)][0], "cap": self._period[(a, w)][1]}
                                if (a, w) in self._period else {})}
                            for (a, w), e in self._entries.items()],
                "exhausted": self._exhausted,
                **({"periods": {p: self._summary(p) for p in sorted(self._compacted)}} if self._compacted else {}),
                **({"archive": self._archive} if self._archive else {})}

    def state_tables(self) -> dict:
        return {}

    def load_state(self, core: dict, tables=None) -> None:
        """The reservations of a :meth:`state_core`, into a ledger that holds none yet."""
        load_tables({}, tables or {})
        if self._entries or self._exhausted or self._compacted or self._archive:
            raise ValueError("load_state: the ledger already holds reservations")
        if core.get("version") != LEDGER_VERSION:
            raise ValueError(f"ledger state: unsupported version {core.get('version')!r}")
        if core.get("archive"):
            a = core["archive"]
            self._archive = {"periods": int(a["periods"]), "first": a["first"], "last": a["last"],
                             "max_spent": float(a["max_spent"])}
        for period, summary in core.get("periods", {}).items():
            if not self._archived(period):
                self._load_summary(period, summary)
        self._charge_list = None
        for e in core["entries"]:
            key, eps = (e["aggregate"], str(e["window"])), float(e["epsilon"])
            if e.get("period") is not None:
                self._index(key, eps, e["period"], e["cap"])
            else:
                self._accountant.spend(eps, 0.0)
            self._entries[key] = eps
            if e.get("content") is not None:
                self._content[key] = e["content"]
        self._exhausted = dict(core.get("exhausted", {}))

    # -- queries ------------------------------------------------------------------------------------------
    @property
    def spent(self) -> float:
        """Total epsilon charged (to the worst-case individual); in period mode the largest per-period charge
        (the budget is per period)."""
        if self.period_mode:
            return max([*self.spent_by_period().values(), self._archive["max_spent"] if self._archive else 0.0])
        return float(sum(self._entries.values()))

    def is_stopped(self, aggregate: str) -> bool:
        return aggregate in self._exhausted or self._compacted_stop(aggregate) is not None

    def _compacted_stop(self, key: str) -> dict | None:
        """The stop of ``"<aggregate>@<period>"`` in a compacted period, or None."""
        if not self._compacted or "@" not in key:
            return None
        summary = self._compacted.get(key.rsplit("@", 1)[1])
        return None if summary is None else summary["exhausted"].get(key)

    def spent_through(self, windows) -> dict[int, float]:
        """Window -> total charged for windows up to it (integer window ids), for each of ``windows``: unlike
        :attr:`spent` it does not depend on how far a crashed worker got before its restart, so a re-produced
        release shows the same figure. In period mode the charge of the window's period through it (capped as in
        :meth:`period_spent`). The entries are read once for all the windows (a flush releases many)."""
        return charged_through(self.charge_entries(), windows, self.period_mode)

    def charge_entries(self) -> list["ChargeEntry"]:
        """Every entry kept, in the order reserved (a list the ledger keeps: do not change it)."""
        if self._charge_list is None:
            self._charge_list = [charge_entry(key, amount, self._period) for key, amount in self._entries.items()]
        return self._charge_list

    def exhausted_at(self, aggregate: str) -> str | None:
        """The window at which the aggregate was stopped, or None."""
        e = self._exhausted.get(aggregate) or self._compacted_stop(aggregate)
        return None if e is None else str(e["window"])

    def reserved(self, aggregate: str, window) -> float | None:
        return self._entries.get((aggregate, str(window)))

    def __len__(self) -> int:
        return len(self._entries)

    # -- spending -----------------------------------------------------------------------------------------
    def reserve(self, aggregate: str, window, epsilon: float, raise_on_exhausted: bool = False):
        """Record a spend of ``epsilon`` for ``(aggregate, window)`` and return a
        :class:`Reservation`; or a :class:`BudgetExhausted` outcome (raised as :class:`BudgetExhaustedError`
        with ``raise_on_exhausted``) when the total would exceed the budget."""
        out = self.reserve_many([(aggregate, window, epsilon)])[0]
        if raise_on_exhausted and not out.ok:
            raise BudgetExhaustedError(out)
        return out

    def reserve_many(self, requests) -> list:
        """Several reservations (e.g. every aggregate of a window), in order.

        A request is ``(aggregate, window, epsilon)``, ``(aggregate, window, epsilon, content)`` or, in period
        mode, ``(aggregate, window, epsilon, content, period, cap)``: the budget then applies to ``period``'s
        capped total (:meth:`period_spent`) and a stopped aggregate is stopped for that period only (key
        ``"<aggregate>@<period>"`` in :meth:`is_stopped`). ``content``
        (a keyed digest of the window's bounded true values) makes the idempotence exact: reserving the same
        window again with the same content spends nothing, but with a **different** content (a restarted worker
        that closed the window with other events, e.g. after an idle flush that was never checkpointed) it is a
        second release of that window, charged again under the key ``"<window>~<n>"``; the returned
        :attr:`Reservation.window` is that key, and the aggregator draws the release's noise from it.
        """
        outcomes: list[Reservation | BudgetExhausted] = []
        for aggregate, window, epsilon, *rest in requests:
            window = str(window)
            content = rest[0] if rest else None
            # cap: read with a period only
            period, cap = (rest[1], float(rest[2])) if len(rest) >= 3 and rest[1] is not None else (None, 0.0)
            if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
                raise ValueError(f"epsilon: must be > 0, got {epsilon!r}")
            base, n = window, 0
            while content is not None and (aggregate, window) in self._entries \
                    and self._content.get((aggregate, window)) != content:
                n += 1
                window = f"{base}~{n}"
            key = (aggregate, window)
            if key in self._entries:                         # idempotent: a re-produced window spends nothing
                if not math.isclose(self._entries[key], epsilon, rel_tol=1e-12):
                    raise ValueError(f"{aggregate} window {window}: already reserved with epsilon "
                                     f"{self._entries[key]}, not {epsilon}")
                outcomes.append(Reservation(aggregate, window, float(epsilon), self.spent, self.epsilon_budget,
                                            new=False))
                continue
            stop_key = aggregate if period is None else f"{aggregate}@{period}"
            if stop_key in self._exhausted:
                outcomes.append(BudgetExhausted(aggregate, window, float(epsilon), self.spent,
                                                self.epsilon_budget, first=False))
                continue
            try:
                if period is None:
                    self._accountant.spend(float(epsilon), 0.0)
                else:                     # the period's capped total with this release, checked by diffprivlib
                    after = self.period_spent(period, (aggregate, float(epsilon), cap, "~" in window))
                    BudgetAccountant(epsilon=self.epsilon_budget * (1 + _REL_TOL), delta=0.0).check(after, 0.0)
            except BudgetError:
                spent_now = self.spent if period is None else self.period_spent(period)
                self._exhausted[stop_key] = {"window": window, "epsilon": float(epsilon), "spent": spent_now}
                outcomes.append(BudgetExhausted(aggregate, window, float(epsilon), spent_now, self.epsilon_budget))
                continue
            self._entries[key] = float(epsilon)
            if period is not None:
                self._index(key, float(epsilon), period, cap)
            if content is not None:
                self._content[key] = content
            if self._charge_list is not None:
                self._charge_list.append(charge_entry(key, float(epsilon), self._period))
            outcomes.append(Reservation(aggregate, window, float(epsilon), self.spent, self.epsilon_budget))
        return outcomes

    # -- bounded size -------------------------------------------------------------------------------------
    def compact(self, current: str, keep: int | None = None) -> int:
        """Fold the entries of every period before the last ``keep`` periods up to ``current`` (labels sort in
        time: ``YYYY-MM-DD``, ``YYYY-MM-DDTHH``) into the period's totals (default ``keep``:
        :data:`KEEP_PERIODS`), and the totals beyond the last :data:`SUMMARY_PERIODS` into the archive; returns
        the entries dropped (the next state record carries the ledger compacted)."""
        keep = KEEP_PERIODS if keep is None else keep
        periods = sorted({p for p, _ in self._period.values()} | {current})
        kept = set(periods[max(0, periods.index(current) - keep + 1):])
        old = {p for p in periods if p not in kept and p < current}
        if not old:
            return 0
        dropped = sum(self._fold_period(p) for p in sorted(old))
        for p in sorted(self._compacted)[:max(0, len(self._compacted) - SUMMARY_PERIODS)]:
            self._archive_period(p)
        return dropped

    def _fold_period(self, period: str) -> int:
        """Compact ``period``: drop its per-window entries (its totals stay), keep their count and its stops;
        returns the entries dropped."""
        keys = [k for k, (p, _) in self._period.items() if p == period]
        self._charge_list = None
        for k in keys:
            del self._period[k], self._entries[k]
            self._content.pop(k, None)
        folded = self._compacted.setdefault(period, {"entries": 0, "exhausted": {}})
        folded["entries"] += len(keys)
        for stop in [s for s in self._exhausted if s.endswith("@" + period)]:
            folded["exhausted"][stop] = self._exhausted.pop(stop)
        return len(keys)

    def _summary(self, period: str) -> dict:
        """A compacted period as saved: per aggregate the sum of its releases and its cap, the paid re-releases,
        the entry count and the stops."""
        return {**self._totals.summary(period), **self._compacted[period]}

    def _archived(self, period: str) -> bool:
        return self._archive is not None and period <= self._archive["last"]

    def _drop_period(self, period: str) -> None:
        """Forget a compacted period (its charge is in the archive)."""
        self._compacted.pop(period, None)
        self._totals.drop(period)

    def _archive_period(self, period: str) -> None:
        """Move the oldest compacted period into the archive (periods are compacted in time order, so it follows
        every archived one): only its charge is kept, as the archive's largest if it is."""
        spent, mine = self.period_spent(period), self._archive
        if mine is None:
            self._archive = {"periods": 1, "first": period, "last": period, "max_spent": spent}
        else:
            mine.update({"periods": mine["periods"] + 1, "last": period, "max_spent": max(mine["max_spent"], spent)})
        self._drop_period(period)

    def _load_summary(self, period: str, summary: dict) -> None:
        """A compacted period's totals, entry count and stops (:meth:`_summary`), as saved."""
        self._totals.load(period, summary)
        self._compacted[period] = {"entries": int(summary.get("entries", 0)),
                                   "exhausted": dict(summary.get("exhausted", {}))}


class ChargeEntry(NamedTuple):
    """One ledger entry as :func:`charged_through` reads it: its window, aggregate, whether it is a paid re-release
    (``"<window>~<n>"``: uncapped), the epsilon charged, and in period mode its period and the aggregate's cap."""
    window: int
    aggregate: str
    rerelease: bool
    amount: float
    period: str | None
    cap: float


def charge_entry(key: tuple[str, str], amount: float, periods: dict) -> ChargeEntry:
    """The :class:`ChargeEntry` of the ledger entry ``key`` = (aggregate, window key); ``periods``: entry ->
    (period, cap) in period mode."""
    a, w = key
    return ChargeEntry(int(w.split("~")[0]), a, "~" in w, amount, *periods.get(key, (None, 0.0)))


def charged_through(entries: list[ChargeEntry], windows, period_mode: bool) -> dict[int, float]:
    """:meth:`BudgetLedger.spent_through` of ``entries`` (in the order reserved): without periods the sum of the
    entries up to each window; in period mode, of the window's period, each aggregate's sum capped, re-releases
    in full."""
    if any(e.window > f.window for e, f in zip(entries, entries[1:])):
        return _charged_window_by_window(entries, windows, period_mode)
    # the entries are in window order (as the worker reserves them): each window's charge is a prefix of them,
    # summed in the same order as window by window, in one pass
    period_of = {e.window: e.period for e in entries}
    out: dict[int, float] = {}
    total = 0.0                     # without periods: every entry so far
    per_period: dict = {}           # period -> [re-releases' total, per aggregate sum, per aggregate cap]
    i = 0
    for x in sorted({int(w) for w in windows}):
        while i < len(entries) and entries[i].window <= x:
            e = entries[i]
            if not period_mode:
                total += e.amount
            else:
                acc = per_period.setdefault(e.period, [0.0, {}, {}])
                if e.rerelease:
                    acc[0] += e.amount
                else:
                    acc[1][e.aggregate], acc[2][e.aggregate] = acc[1].get(e.aggregate, 0.0) + e.amount, e.cap
            i += 1
        if not period_mode:
            out[x] = float(total)
            continue
        acc = per_period.get(period_of.get(x), (0.0, {}, {}))
        out[x] = float(acc[0] + sum(min(v, acc[2][a]) for a, v in acc[1].items()))
    return {x: out[int(x)] for x in windows}


def _charged_window_by_window(entries: list[ChargeEntry], windows, period_mode: bool) -> dict[int, float]:
    """:func:`charged_through` when the entries were not reserved in window order."""
    if not period_mode:
        return {x: float(sum(e.amount for e in entries if e.window <= x)) for x in windows}
    period_of = {e.window: e.period for e in entries}
    out = {}
    for x in windows:
        total = 0.0
        sums: dict[str, float] = {}
        caps: dict[str, float] = {}
        for e in entries:
            if e.window <= x and e.period == period_of.get(x):
                if e.rerelease:
                    total += e.amount
                else:
                    sums[e.aggregate], caps[e.aggregate] = sums.get(e.aggregate, 0.0) + e.amount, e.cap
        out[x] = float(total + sum(min(v, caps[a]) for a, v in sums.items()))
    return out


def current_charges(ledger: BudgetLedger) -> tuple[str | None, dict[str, float]]:
    """(current period, aggregate -> what it charged the worst-case unit in that period): in period mode the
    latest period (labels sort in time) and its :meth:`BudgetLedger.charges`; without periods (None, the sum of
    each aggregate's reservations), summing to :attr:`BudgetLedger.spent`."""
    if not ledger.period_mode:
        return None, ledger.charges(None)
    periods = ledger.periods()
    if not periods:
        return None, {}
    period = max(periods)
    return period, ledger.charges(period)
