"""Where a partition's DP budget stands, for the worker's metrics (:func:`stream_anon.kafka.observe.budget_series`)
and an operator's alerts: the current period's charge, how far the period has run by the stream's event-time
clock, what its scheduled releases will have charged by its end, and the last closed period's charge.

Why a projection and not "spent so far against time elapsed": the ledger charges an aggregate at most its share of
the period (its cap), and a unit may put its ``W`` windows in the period's first releases, so a design that spends
exactly its budget every period reaches it early (the bundled ``oyster`` stream after 2 of the day's 96 windows,
``oyster-cards`` 0.7 of 1.0 after its first two hours) and stays there; its daily releases charge in the period's last
window. The spend is on schedule when the projected charge fits the budget. It does not fit when releases were
paid again (a window re-closed with other events after a restart: the ledger charges it in full on top of the
cap), or when an accepted change lowered the budget within the period: then the ledger refuses a release before
the period ends and the aggregate stops (``budget_exhausted``) until the next period.

>>> from stream_anon.dp import BudgetLedger, DPAggregator, parse_dp_config
>>> cfg = parse_dp_config({"stream": {"privacy_unit": "card"}, "anonymization": {"window_s": 3600},
...     "dp": {"unit": "individual", "period": "day", "timezone": "UTC", "epsilon_per_period": 1.0,
...            "max_windows_per_period": 2},
...     "aggregates": [{"name": "n", "kind": "count", "epsilon": 0.6, "max_contributions": 1},
...                    {"name": "daily", "kind": "count", "epsilon": 0.4, "max_contributions": 1,
...                     "release_every_windows": 24}]})
>>> agg = DPAggregator(cfg, BudgetLedger(None, 1.0), seed=b"s")
>>> for w in range(24 * 365, 24 * 365 + 30):                     # 1 January 1971, and 6 hours of the 2nd
...     _ = agg.process_window(w, [])
>>> o = budget_outlook(cfg, agg.ledger, position_of(agg.state.state_core()))
>>> o.period, round(o.spent, 9), o.elapsed, round(o.projected, 9)
('1971-01-02', 0.6, (6, 24), 1.0)
>>> o.closed, round(o.closed_spent, 9), {a: round(e, 9) for a, e in o.closed_charges.items()}
('1971-01-01', 1.0, {'daily': 0.4, 'n': 0.6})
"""
from __future__ import annotations

from dataclasses import dataclass, field

from stream_anon.dp.ledger import BudgetLedger, current_charges
from stream_anon.dp.release import release_epsilon
from stream_anon.dp.specs import DPConfig
from stream_anon.dp.transition import specs_in_force


@dataclass(frozen=True)
class AggregatorPosition:
    """What the outlook needs of an aggregator's state: its current period, the last window it released, and the
    carry of an accepted change (:mod:`stream_anon.dp.transition`: the aggregates paused or calibrated as before
    until the period ends)."""
    period: str | None = None
    last_window: int | None = None
    carry: dict | None = None


def position_of(aggregator_core: dict | None) -> AggregatorPosition:
    """The :class:`AggregatorPosition` of an aggregator's state core (``AggregatorState.state_core``; None: a
    new aggregator)."""
    core = aggregator_core or {}
    return AggregatorPosition(core.get("period"), core.get("last_window"), core.get("carry"))


@dataclass(frozen=True)
class BudgetOutlook:
    """A partition's budget (module docstring). Without ``[dp] period`` only ``charges`` and ``spent`` (over the
    stream's life) are set; before the first window only those, empty."""
    period: str | None                               # the current period: that of the last window released
    charges: dict[str, float]                        # aggregate -> its charge of the worst-case unit in it
    spent: float                                     # the period's charge (the ledger's period_spent)
    elapsed: tuple[int, int] | None = None           # (windows of the period released, windows in the period)
    projected: float | None = None                   # the period's charge once its scheduled releases are made
    closed: str | None = None                        # the last period whose last window is released
    closed_charges: dict[str, float] = field(default_factory=dict)
    closed_spent: float | None = None


def budget_outlook(dp: DPConfig, ledger: BudgetLedger, position: AggregatorPosition) -> BudgetOutlook:
    """The partition's :class:`BudgetOutlook` from its ledger and its aggregator's position (both as of the same
    state)."""
    if dp.clock is None or position.last_window is None:
        period, charges = current_charges(ledger)
        spent = ledger.spent if period is None else ledger.period_spent(period)
        return BudgetOutlook(period, charges, spent)
    last = position.last_window
    period, first, n = dp.clock.period_of(last)
    spent = ledger.period_spent(period)
    done = last - first + 1
    closed: str | None
    if done == n:                 # its last window is released: no release of it can follow
        closed = period
    else:
        closed = max((p for p in ledger.periods() if p < period), default=None)
    return BudgetOutlook(period, ledger.charges(period), spent, (done, n),
                         projected_charge(dp, ledger, position, period, first, n), closed,
                         {} if closed is None else ledger.charges(closed),
                         None if closed is None else ledger.period_spent(closed))


def projected_charge(dp: DPConfig, ledger: BudgetLedger, position: AggregatorPosition, period: str, first: int,
                     n: int) -> float:
    """What ``period``'s releases ask of the ledger by its last window: what it charged, plus every release of an
    aggregate in force still due after the last window released and, for an aggregate the ledger stopped, every
    release from the one refused on; each aggregate at most its cap, the paid re-releases on top. Above the budget
    exactly when the ledger refuses (or refused) a release of the period."""
    assert position.last_window is not None      # budget_outlook's: a window was released
    sums, extra = ledger.period_parts(period)
    demand = {a: min(v, cap) for a, (v, cap) in sums.items()}
    carry = position.carry or {}
    paused = set(carry.get("pause", ()))
    for spec in specs_in_force(dp.aggregates, carry):
        if spec.name in paused:
            continue
        stop = ledger.exhausted_at(f"{spec.name}@{period}")
        start = int(stop.split("~")[0]) if stop is not None else position.last_window + 1
        due = releases_due(spec.release_every, first, n, start)
        v, cap = sums.get(spec.name, (0.0, spec.epsilon))
        demand[spec.name] = min(v + due * release_epsilon(spec, dp.max_windows_per_period)[0], cap)
    return extra + sum(demand[a] for a in sorted(demand))


def releases_due(every: int, first: int, n: int, start: int) -> int:
    """Releases of an aggregate released every ``every`` windows from the period's start and at its last window,
    in the period's windows ``start`` to its end (window indices; the period: ``n`` windows from ``first``).

    >>> releases_due(4, 0, 96, 0), releases_due(4, 0, 96, 5), releases_due(96, 0, 92, 10), releases_due(1, 0, 96, 96)
    (24, 23, 1, 0)
    """
    lo = max(start - first + 1, 1)           # 1-based offset of the first window counted
    if lo > n:
        return 0
    return n // every - (lo - 1) // every + (1 if n % every else 0)
