"""Budget spent before a total loss, carried into the lineage that follows it.

A lineage that starts after the broker and the state were lost together has an empty ledger: without more, it
spends every period's budget again, and a unit's loss over both lineages is up to twice the budget for that
period. The rows of ``anon.aggregates`` that a downstream consumer kept state what was spent: each row's
``ledger_epsilon_spent`` is its partition's charge of its period through its window (the worst-case unit's,
:meth:`~stream_anon.dp.ledger.BudgetLedger.spent_through`). :func:`carried_spend` takes, per period, the largest
over every partition and lineage of the rows (a unit's partition in the new lineage need not be its old one);
:func:`carry_into` charges it to a new ledger as one reservation of aggregate :data:`CARRIED` at the period's
first window, so the period's remaining budget is what the lost lineage left (none when it spent it all), the
ledger's state keeps it across restarts, and the new rows' ``ledger_epsilon_spent`` include it.

Procedure (docs/operations.md, Lineage): ``stream-anon worker --new-lineage --carry-budget kept-rows.jsonl``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

CARRIED = "carried"       # the ledger's aggregate name for a spend carried from a lost lineage


def carried_spend(rows) -> dict[str, tuple[int, float]]:
    """Period label -> (a window of the period, the largest ``ledger_epsilon_spent`` of its rows); rows without a
    period (legacy mode) or without a finite spend are refused: ValueError naming the row."""
    out: dict[str, tuple[int, float]] = {}
    for i, r in enumerate(rows):
        period, window, spent = r.get("period"), r.get("window"), r.get("ledger_epsilon_spent")
        if not isinstance(period, str) or isinstance(window, bool) or not isinstance(window, int) \
                or isinstance(spent, bool) or not isinstance(spent, (int, float)) or not math.isfinite(spent) \
                or spent < 0:
            raise ValueError(f"row {i + 1}: a DP row of a period needs period, window and ledger_epsilon_spent "
                             f"(got {r.get('row_id', 'no row_id')!r})")
        _, before = out.get(period, (window, 0.0))
        out[period] = (window, max(before, float(spent)))
    return out


def read_carried(path: str | Path) -> dict[str, tuple[int, float]]:
    """:func:`carried_spend` of a JSONL file of ``anon.aggregates`` rows (ValueError naming the file)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rows.append(json.loads(line))
        spend = carried_spend(rows)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--carry-budget {path}: {exc}") from None
    if not spend:
        raise ValueError(f"--carry-budget {path}: no DP rows in it")
    return spend


def carry_into(ledger, clock, carried: dict[str, tuple[int, float]]) -> None:
    """Charge each period's carried spend to ``ledger`` (at most its budget: a period spent in full stays spent),
    at the period's first window by ``clock`` (a :class:`~stream_anon.dp.specs.PeriodClock`); ValueError when
    the clock files a window under another period label (the config's period or timezone is not the lost one's)."""
    for label, (window, spent) in sorted(carried.items()):
        mine, first, _ = clock.period_of(window)
        if mine != label:
            raise ValueError(f"carried budget: window {window} is in period {mine} by this config, the rows say "
                             f"{label} (another dp.period or timezone)")
        eps = min(spent, ledger.epsilon_budget)
        if eps > 0:
            ledger.reserve_many([(CARRIED, first, eps, None, label, eps)])


def with_carried(config, carried: dict[str, tuple[int, float]]):
    """``config`` whose DP aggregates charge ``carried`` to every partition new in its lineage (ValueError: the
    stream has no [dp])."""
    import dataclasses

    if config.dp is None:
        raise ValueError("--carry-budget: the stream has no [dp] aggregates")
    spend = tuple((label, int(w), float(eps)) for label, (w, eps) in sorted(carried.items()))
    return dataclasses.replace(config, dp=dataclasses.replace(config.dp, carried=spend))
