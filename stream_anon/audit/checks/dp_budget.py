"""Check ``dp``: the privacy loss of the differentially private aggregates, recomputed from the published rows
(``anon.aggregates``) and the config alone, never from the worker's ledger nor from the rows' ``epsilon`` claims.

What a row proves. A row declares its noise (``noise_scale`` and ``noise_std``, per component for a mean or a
ratio). One unit's contributions to one window change a component by at most ``max_contributions`` (times
``max(|lower|, |upper|)`` for a sum), from the config (or the row's ``max_contributions`` when larger). The
**rate** of a release is what one window of one unit costs in it: the sum over components of that sensitivity
divided by the noise scale (the smaller of the declared scale and the scale its declared standard deviation implies:
a row whose noise is smaller than its scale says is charged for the smaller noise). Rows tampered to claim less
noise, or noise drawn for a larger epsilon than the row's ``epsilon`` field says, therefore cost what they cost.

Worst unit. Per partition (units are keyed to one partition: parallel composition), period and aggregate, the worst
unit puts its ``W`` windows of the period where they cost most: each release holds at most ``min(W,
release_every_windows, windows_in_release)`` of them, the releases taken by rate, highest first (a fractional
knapsack: the exact maximum over every way a unit may spread ``W`` windows over the releases). A paid re-release of
a window (release key ``<window>~<n>``) is charged in full on top, and so is every further distinct value published
for one cell of a release (a second row under a new row id is a second draw). A running output whose mechanism is
``per_window`` is the prefix sum of the per-window rows (post-processing, free) and is charged only when no
per-window row of that release is published; a tree mechanism (``binary_tree``, ``hybrid``) does not declare its
depth, so its release is charged the larger of its declared ``epsilon`` and the per-window rate. In legacy mode
(no ``dp.period``) every release is one window and every release is charged.

Verdict, with one line per finding (aggregate, period, partition and the worst unit's charge):
``aggregate over its epsilon`` (the config's share), ``period over budget`` (the config's
``epsilon_per_period``), ``period over declared budget`` (the rows' ``ledger_epsilon_budget``), ``declared budget
above the config``, ``declared budget raised`` / ``declared epsilon raised`` (an increase between periods that the
partition's rows do not state as an accepted change, ``settings_changed``), ``... raised within a period``,
``period label`` (a row filed under another period than its window's), ``unknown aggregate``, ``malformed row``
and ``rows without [dp]``. Figures beside the verdict: ``spent_by_period`` (per period, the worst unit's charge per
aggregate and in all, on the partition where it is highest) and the worst charge of the run.

Settings in force. The config given is the current one; a period is judged by the settings in force when it was
released: an accepted lowering (``dp.epsilon_budget 1.0 -> 0.5`` in ``settings_changed``) judges the periods before
it, and the period it was applied in, by the old value; an accepted raise applies from the next period
(:mod:`stream_anon.dp.transition`), so the periods before it declare, and are charged within, the old one.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, TypedDict

from ..check import AuditContext, ViolationLog
from ..dp_config import COMPONENTS, AggregateBudget, DPBudget

REL_TOL = 1e-9


class _InForce(TypedDict):
    """The settings in force in one partition's period: the budget, and each aggregate's epsilon."""
    budget: float
    epsilon: dict[str, float]


class _Spread(TypedDict):
    """Units on several input partitions within a period (:func:`_units_on_several_partitions`)."""
    units: int
    worst: float
    period: str | None
    partitions: list


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def geometric_scale_of_std(std: float, resolution: float = 1.0) -> float:
    """The scale ``b`` (``p = exp(-1/b)`` in steps of ``resolution``) of a two-sided geometric noise of standard
    deviation ``std``: the variance ``2p / (1-p)^2`` solved for ``p``.

    >>> round(geometric_scale_of_std(11.306346158727699), 6)
    8.0
    """
    s2 = (std / resolution) ** 2
    if s2 <= 0:
        return 0.0
    u = (-2.0 + math.sqrt(4.0 + 8.0 * s2)) / (2.0 * s2)        # u = 1 - p
    return resolution * -1.0 / math.log1p(-u) if u < 1 else 0.0


def _as_components(value, comps: tuple[str, ...]) -> dict | None:
    if isinstance(value, dict):
        return {c: _num(value.get(c)) for c in comps}
    if len(comps) == 1:
        return {comps[0]: _num(value)}
    return None


def row_rate(row: dict, spec: AggregateBudget) -> float | None:
    """Epsilon one window of one unit costs in this row's release (None: the row does not declare its noise)."""
    comps = COMPONENTS[spec.kind]
    scales, stds = _as_components(row.get("noise_scale"), comps), _as_components(row.get("noise_std"), comps)
    if scales is None:
        return None
    geometric = str(row.get("mechanism", "")).endswith("geometric")
    per_window = str(row.get("mechanism", "")).startswith("per_window") and row.get("output") == "per_window"
    c_row = row.get("max_contributions")
    c_factor = max(1.0, float(c_row) / spec.max_contributions) if isinstance(c_row, int) and c_row > 0 else 1.0
    rate = 0.0
    for c in comps:
        b = scales.get(c)
        if b is None or b <= 0:
            return math.inf if b is not None else None
        s = (stds or {}).get(c)
        if s is not None and per_window:       # one draw: its std says the scale as well
            res = spec.resolution if c == "sum" else 1.0
            b = min(b, geometric_scale_of_std(s, res) if geometric else s / math.sqrt(2.0))
            if b <= 0:
                return math.inf
        rate += spec.window_sensitivity(c) * c_factor / b
    return rate


def worst_charge(releases: list[tuple[float, int, bool]], w: float) -> float:
    """The most one unit can be charged by ``releases`` ((rate, windows it may hold, paid re-release)) when it
    contributes to at most ``w`` windows: paid re-releases in full, the others filled by rate, highest first.

    >>> worst_charge([(0.1, 4, False), (0.3, 2, False), (0.2, 4, False)], 4)
    1.0
    >>> worst_charge([(0.125, 4, False)] * 6, 4), worst_charge([(0.125, 4, False), (0.125, 4, True)], 4)
    (0.5, 1.0)
    """
    paid = sum(rate * cap for rate, cap, rerelease in releases if rerelease)
    left, total = w, 0.0
    for rate, cap, _ in sorted((r for r in releases if not r[2]), key=lambda r: -r[0]):
        take = min(cap, left)
        total += rate * take
        left -= take
        if left <= 0:
            break
    return total + paid


def _charge_blocks(ctx: AuditContext, dp: DPBudget, log: ViolationLog) -> dict:
    """(partition, period, aggregate) -> [(rate, windows, paid)] over the releases, and the rows' declarations."""
    blocks: dict[tuple, dict] = {}      # (partition, aggregate, release) -> output -> (rate, row)
    for row in ctx.aggregates:
        name: Any = row.get("aggregate")        # any JSON value: one that names no aggregate is reported
        spec = dp.aggregates.get(name)
        if spec is None:
            log.fail("unknown aggregate", aggregate=name, row_id=row.get("row_id"))
            continue
        rate = row_rate(row, spec)
        window = row.get("window")
        if rate is None or not isinstance(window, int) or isinstance(window, bool):
            log.fail("malformed row", aggregate=name, row_id=row.get("row_id"))
            continue
        if str(row.get("mechanism", "")).split("/")[0] in ("binary_tree", "hybrid"):
            declared = _num(row.get("epsilon")) or 0.0
            rate = max(rate, declared / max(1.0, min(spec.max_windows, spec.release_every)))
        key = (row.get("partition"), name, str(row.get("release", window)))
        out = blocks.setdefault(key, {"window": window, "outputs": {}, "draws": defaultdict(set)})
        prev = out["outputs"].get(row.get("output"))
        if prev is None or rate > prev[0]:
            out["outputs"][row.get("output")] = (rate, row)
        # each distinct published value of one cell is a draw of its own (a second row under a new row id)
        out["draws"][(row.get("output"), row.get("group_key"))].add(repr(row.get("value")))
    charges: dict[tuple, list] = defaultdict(list)
    for (partition, name, release), b in blocks.items():
        spec = dp.aggregates[name]
        outs = b["outputs"]
        chosen = [outs["per_window"]] if "per_window" in outs else []
        if "running" in outs and (not chosen or not str(outs["running"][1].get("mechanism")).startswith("per_window")):
            chosen.append(outs["running"])
        period = dp.period_of(b["window"])
        for rate, row in chosen:
            if dp.period is not None and row.get("period") != period:
                log.fail("period label", aggregate=name, partition=partition, release=release,
                         declared=row.get("period"), period=period)
            held = row.get("windows_in_release")
            held = held if isinstance(held, int) and held > 0 else spec.release_every
            cap = 1 if dp.period is None else min(spec.max_windows, spec.release_every, held)
            charges[(partition, period, name)].append((rate, cap, "~" in release))
            draws = max((len(v) for (o, _), v in b["draws"].items() if o == row.get("output")), default=1)
            charges[(partition, period, name)].extend([(rate, cap, True)] * (draws - 1))
    return charges


def _changes(rows: list[dict]) -> list[tuple[str, float | None, float | None]]:
    """The accepted changes a partition's rows state (``settings_changed``: ``<key> <old> -> <new>`` lines of the
    worker's ``--accept-config-change``), as (key, old, new) with the numbers read (None: not a number)."""
    out = []
    for r in rows:
        for line in r.get("settings_changed") or ():
            if not isinstance(line, str) or " -> " not in line or " " not in line:
                continue
            key, rest = line.split(" ", 1)
            before, after = rest.split(" -> ", 1)
            out.append((key, _number_text(before), _number_text(after)))
    return out


def _number_text(text: str) -> float | None:
    try:
        return _num(float(text))
    except ValueError:
        return None


class _Accepted:
    """A partition's accepted changes of one setting (``key``): (period index, old, new), in period order."""

    def __init__(self, key: str, by_period: list[list[tuple]]):
        self.changes = [(i, a, b) for i, cs in enumerate(by_period) for k, a, b in cs if k == key]

    def raise_to(self, value: float, upto: int) -> bool:
        """An accepted change to ``value`` stated in a period up to index ``upto``."""
        return any(i <= upto and b is not None and math.isclose(b, value, rel_tol=1e-9)
                   for i, _, b in self.changes)

    def in_force(self, now: float, at: int) -> float:
        """The setting in force in period ``at`` given ``now`` (the config's): raised to the old value of every
        lowering stated in that period or later (the periods before it ran under the old value)."""
        return max([now] + [a for i, a, b in self.changes if i >= at and a is not None and b is not None and b < a])

    def lowered_in(self, at: int) -> bool:
        return any(i == at and a is not None and b is not None and b < a for i, a, b in self.changes)


def _rising(rows: list[dict], field: str) -> tuple[float, float] | None:
    """(before, after) of the first rise of ``field`` between the period's rows in window order, else None."""
    top = None
    for r in sorted(rows, key=lambda r: r["window"]):
        v = _num(r.get(field))
        if v is None:
            continue
        if top is not None and v > top * (1 + REL_TOL):
            return top, v
        top = v if top is None else max(top, v)
    return None


def _declared(ctx: AuditContext, dp: DPBudget, log: ViolationLog) -> tuple[dict, dict, list]:
    """((partition, period) -> the budget its rows declare, (partition, period) -> the budget and aggregate ->
    epsilon in force there (the config's, before a later accepted lowering: the old value), [findings to report
    with the period's worst charge: (kind, partition, period, aggregate or None, before, after)]).

    The budget a period's rows declare must not rise within the period, nor from one period to the next unless
    the partition's rows state that change as accepted (``settings_changed``) in that period or before: a raise is
    accepted only at a period boundary. A lowering may apply within a period (the worker applies it at once); that
    period is then judged by the budget declared before it."""
    by_part: dict = defaultdict(lambda: defaultdict(list))
    for row in ctx.aggregates:
        w = row.get("window")
        if isinstance(w, int) and not isinstance(w, bool):
            by_part[row.get("partition")][dp.period_of(w)].append(row)
    declared: dict[tuple, float] = {}
    in_force: dict[tuple, _InForce] = {}
    findings: list[tuple] = []
    for partition, periods in by_part.items():
        order = sorted(periods, key=lambda p: min(r["window"] for r in periods[p]))
        stated = [_changes(periods[p]) for p in order]
        budget_changes = _Accepted("dp.epsilon_budget", stated)
        last_budget: float | None = None
        last_eps: dict[str, float] = {}
        for i, period in enumerate(order):
            rows = periods[period]
            force: _InForce = {"budget": budget_changes.in_force(dp.budget, i),
                               "epsilon": {n: _Accepted(f"aggregates.{n}.epsilon", stated).in_force(a.epsilon, i)
                                           for n, a in dp.aggregates.items()}}
            in_force[(partition, period)] = force
            budgets = [b for b in (_num(r.get("ledger_epsilon_budget")) for r in rows) if b is not None]
            if not budgets:
                continue
            top = max(budgets)
            declared[(partition, period)] = top if budget_changes.lowered_in(i) else min(budgets)
            if top > force["budget"] * (1 + REL_TOL):
                log.fail("declared budget above the config", partition=partition, period=period, declared=top,
                         config=force["budget"])
            rise = _rising(rows, "ledger_epsilon_budget")
            if rise is not None:
                findings.append(("declared budget raised within a period", partition, period, None, *rise))
            elif last_budget is not None and top > last_budget * (1 + REL_TOL) \
                    and not budget_changes.raise_to(top, i):
                findings.append(("declared budget raised", partition, period, None, last_budget, top))
            last_budget = top
            eps: dict[str, float] = {}
            for r in rows:
                e = _num(r.get("epsilon_period"))
                if e is not None:
                    eps[r.get("aggregate")] = max(eps.get(r.get("aggregate"), 0.0), e)
            for name, e in eps.items():
                rise = _rising([r for r in rows if r.get("aggregate") == name], "epsilon_period")
                if rise is not None:
                    findings.append(("declared epsilon raised within a period", partition, period, name, *rise))
                elif name in last_eps and e > last_eps[name] * (1 + REL_TOL) \
                        and not _Accepted(f"aggregates.{name}.epsilon", stated).raise_to(e, i):
                    findings.append(("declared epsilon raised", partition, period, name, last_eps[name], e))
            last_eps.update(eps)
    return declared, in_force, findings


class DPBudgetCheck:
    name = "dp"

    def applies(self, ctx: AuditContext) -> bool:
        return ctx.config.dp is not None or bool(ctx.aggregates)

    def run(self, ctx: AuditContext) -> dict:
        log = ViolationLog()
        dp: DPBudget | None = ctx.config.dp
        if dp is None:
            log.fail("rows without [dp]", rows=len(ctx.aggregates))
            return log.result()
        charges = _charge_blocks(ctx, dp, log)
        declared, in_force, findings = _declared(ctx, dp, log)
        per_period: dict[tuple, dict[str, float]] = defaultdict(dict)
        for (partition, period, name), releases in charges.items():
            spec = dp.aggregates[name]
            charge = worst_charge(releases, spec.max_windows)
            per_period[(partition, period)][name] = charge
            eps = in_force.get((partition, period), {}).get("epsilon", {}).get(name, spec.epsilon)
            if charge > eps * (1 + REL_TOL):
                log.fail("aggregate over its epsilon", line=f"dp: {name} period {period}: worst unit charged "
                         f"{charge:.6g} > epsilon {eps:g} (config) on partition {partition}",
                         aggregate=name, period=period, partition=partition, charge=charge, epsilon=eps)
        for kind, partition, period, name, before, after in findings:
            by_agg = per_period.get((partition, period), {})
            name = name or (max(by_agg, key=lambda n: by_agg[n]) if by_agg else None)
            what = "budget" if name is None or kind.startswith("declared budget") else f"epsilon of {name}"
            named = by_agg.get(name, 0.0) if name is not None else 0.0
            log.fail(kind, line=f"dp: {name} period {period}: declared {what} raised {before:g} -> {after:g} "
                     f"{'within the period' if 'within' in kind else 'without an accepted change'} on partition "
                     f"{partition}; worst unit charged {sum(by_agg.values()):.6g} ({name}: "
                     f"{named:.6g})", aggregate=name, period=period, partition=partition,
                     before=before, after=after, charge=sum(by_agg.values()))
        worst = {"charge": 0.0}
        for (partition, period), by_agg in per_period.items():
            total = sum(by_agg.values())
            top = max(by_agg, key=lambda n: by_agg[n])
            if total > worst["charge"]:
                worst = {"charge": total, "period": period, "partition": partition}
            line = (f"dp: period {period}: worst unit charged {total:.6g} on partition {partition} "
                    f"(most by {top}: {by_agg[top]:.6g})")
            budget = in_force.get((partition, period), {}).get("budget", dp.budget)
            if total > budget * (1 + REL_TOL):
                log.fail("period over budget", line=f"{line} > budget {budget:g} (config)", period=period,
                         partition=partition, charge=total, budget=budget, aggregate=top)
            d = declared.get((partition, period))
            if d is not None and total > d * (1 + REL_TOL):
                log.fail("period over declared budget", line=f"{line} > budget {d:g} (declared by the rows)",
                         period=period, partition=partition, charge=total, budget=d, aggregate=top)
        spread = _units_on_several_partitions(ctx, dp, per_period)
        if spread["units"]:
            line = (f"dp: {spread['units']} unit-periods on several input partitions, each charged on every one's "
                    f"ledger: worst unit charged {spread['worst']:.6g} in period {spread['period']} over partitions "
                    f"{spread['partitions']} > budget {dp.budget:g}")
            if spread["worst"] > dp.budget * (1 + REL_TOL):
                log.fail("unit on several partitions", line=line, **spread)
        spent: dict = {}      # per period, the worst partition's charge per aggregate and in all (a figure)
        for (partition, period), by_agg in sorted(per_period.items(), key=lambda kv: str(kv[0])):
            entry = spent.setdefault(str(period), {"aggregates": {}, "total": 0.0})
            for name, charge in by_agg.items():
                entry["aggregates"][name] = round(max(entry["aggregates"].get(name, 0.0), charge), 9)
            entry["total"] = round(max(entry["total"], sum(by_agg.values())), 9)
        log.details.update(units_on_several_partitions=spread["units"],
                           worst_charge_across_partitions=round(spread["worst"], 9))
        log.details.update(rows=len(ctx.aggregates), budget=dp.budget, period=dp.period,
                           spent_by_period=dict(sorted(spent.items())),
                           periods=len({p for _, p in per_period}),
                           worst_unit_charge=round(worst["charge"], 9), worst_period=worst.get("period"),
                           worst_partition=worst.get("partition"))
        return log.result()


def _units_on_several_partitions(ctx: AuditContext, dp: DPBudget, per_period: dict) -> _Spread:
    """Units whose events (not dead-lettered) arrived on several input partitions within one period, from the raw
    topic: each such unit is charged the sum of its partitions' worst charges for the period (each partition's
    ledger charged it apart). Returns the count of such unit-periods and the worst one's charge."""
    from ..dp_values import event_seconds
    from ..primitives import get_path, source_key
    values = getattr(ctx.config, "dp_values", None)
    field = values.unit_field if values is not None else None
    time_field = values.event_time if values is not None else ctx.config.event_time
    dead = {source_key(d.get("source")) for d in ctx.deadletters}
    where: dict[tuple, set] = defaultdict(set)
    for raw in ctx.raws:
        if raw.source is None or raw.event is None or raw.source in dead:
            continue
        unit = get_path(raw.event, field) if field is not None else raw.unit
        t = event_seconds(get_path(raw.event, time_field))
        if unit is None or t is None:
            continue
        where[(str(unit), dp.period_of(math.floor(t / dp.window_s)))].add(raw.source[1])
    out: _Spread = {"units": 0, "worst": 0.0, "period": None, "partitions": []}
    for (unit, period), parts in where.items():
        if len(parts) < 2:
            continue
        out["units"] += 1
        charge = sum(sum(per_period.get((p, period), {}).values()) for p in parts)
        if charge > out["worst"]:
            out["worst"], out["period"], out["partitions"] = charge, period, sorted(parts)
    return out
