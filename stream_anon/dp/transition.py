"""A change of the DP settings accepted on a running stream (``stream-anon worker --accept-config-change``): what
stays in force until the current period ends, and what each release after it says of the change.

The budget is per unit **and period** (:mod:`stream_anon.dp.ledger`), and a period's releases are calibrated
together (each unit's ``W`` windows of the period, the aggregate's ``epsilon`` spread over them), so a change is
carried into the period in which it is accepted (the *carry*, kept in the aggregator's state until the period
ends) as follows; from the next period on, the new settings are in force:

- **budget** (``dp.epsilon_budget``, i.e. ``epsilon_per_period``): the smaller of the old and the new one holds
  for the rest of the period. A raise applies from the next period; a lowering applies at once, and the ledger
  admits no release that would take the period's charge of the worst-case unit above it (what was spent before
  stays spent: the ledger keeps it).
- **an aggregate whose calibration changed** (:data:`CALIBRATION`: epsilon, bounds, ``W``, release schedule):
  keeps its old calibration until the period ends (the noise of the period's remaining releases and the ledger's
  cap of the aggregate stay what its earlier releases of the period were calibrated to).
- **an aggregate whose definition changed** (its cells, filter, value, kind, outputs or mechanism), or an
  **added** one: paused for the rest of the period (nothing released, nothing spent), fresh from the next period.
  Its cells under the old definition are not continued: the cell of an event under the old definition (a zone of
  a regrouped hierarchy) cannot be computed without the old hierarchy, which the state keeps only as a digest.
- **a removed aggregate** ends at once; what it spent stays in the ledger's period.

Settings the state cannot carry over are refused (:data:`FIXED`): the period, its time zone, the unit of privacy,
the window length and the schedule's start (the calendar, the windows released and the units the ledger charges),
and any change without periods (a total budget over the stream's life) or that adds or removes ``[dp]``. A group
key whose values map to other cells of the same domain (stations moved between zones) is no redefinition: the
aggregate goes on, each event counted in its cell under the new mapping.

Each aggregate's first release after the change carries ``settings_changed`` (the accepted DP changes, as
``<key> <old> -> <new>`` lines of :func:`stream_anon.guarantees.changes`), so the audit tells an accepted raise
from one without the step (:mod:`stream_anon.audit.checks.dp_budget`).

>>> old = {"dp.epsilon_budget": 1.0, "dp.period": "day", "aggregates.a.epsilon": 0.5, "aggregates.a.kind": "count",
...        "aggregates.b.epsilon": 0.5, "aggregates.b.where": []}
>>> new = {**old, "dp.epsilon_budget": 5.0, "aggregates.a.epsilon": 2.5, "aggregates.b.where": [["t", ["x"]]]}
>>> c = carry(old, new, ["aggregates.a.epsilon 0.5 -> 2.5", "dp.epsilon_budget 1.0 -> 5.0"])
>>> c["budget"], c["keep"], c["pause"]
(1.0, {'a': {'epsilon': 0.5}}, ['b'])
"""
from __future__ import annotations

import dataclasses

CALIBRATION = ("epsilon", "max_contributions", "lower", "upper", "resolution", "max_windows", "release_every",
               "horizon_windows")
FIXED = {"dp.period": "the period", "dp.timezone": "the period's time zone", "dp.unit": "the unit of privacy",
         "dp.privacy_unit": "the unit of privacy", "dp.window_s": "the window length",
         "dp.stream": "the stream", "dp.start": "the release schedule's first window"}
BUDGET = "dp.epsilon_budget"


def dp_changes(changes: list[str]) -> list[str]:
    """The DP settings among ``changes`` (``dp.*``, ``aggregates.*``)."""
    return [c for c in changes if c.startswith(("dp.", "aggregates."))]


def refusals(changes: list[str], old: dict, new: dict) -> list[str]:
    """``<change>: <why>`` for every DP change that cannot apply to a running stream's state."""
    out = []
    mine = dp_changes(changes)
    if mine and (BUDGET not in old or BUDGET not in new):
        return [f"{c}: [dp] added or removed: start the stream's DP state anew (a new app id and --new-lineage)"
                for c in mine]
    if mine and (old.get("dp.period") is None or new.get("dp.period") is None):
        return [f"{c}: without dp.period the budget is a total over the stream's life: a new app id and "
                "--new-lineage" for c in mine]
    for c in mine:
        key = c.split(" ", 1)[0]
        if key in FIXED:
            out.append(f"{c}: {FIXED[key]} decides which releases the ledger charges together: a new app id "
                       "and --new-lineage, at a period boundary")
    return out


def _aggregates(settings: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for key, value in settings.items():
        if key.startswith("aggregates."):
            name, field = key[len("aggregates."):].rsplit(".", 1)
            out.setdefault(name, {})[field] = value
    return out


def carry(old: dict, new: dict, changes: list[str], previous: dict | None = None) -> dict:
    """The carry of an accepted change from settings ``old`` to ``new`` (module docstring): ``{"budget": in force
    for the rest of the period, "keep": aggregate -> {field: old value}, "pause": [aggregates], "changes": the DP
    changes}``; ``previous``: a carry still in force (a second change in the same period: what it kept stays)."""
    previous = previous or {}
    budget = min(float(previous.get("budget", old[BUDGET])), float(new[BUDGET]))
    before, after = _aggregates(old), _aggregates(new)
    keep: dict[str, dict] = {}
    pause = set(previous.get("pause", []))
    for name, fields in after.items():
        was = before.get(name)
        if was is None or name in pause:
            pause.add(name)
            continue
        changed = {f for f in set(fields) | set(was) if fields.get(f) != was.get(f)}
        if "group_by" in changed and _cells(fields["group_by"]) == _cells(was.get("group_by")):
            changed.discard("group_by")     # values mapped to other cells of the same domain: the aggregate goes on
        if changed - set(CALIBRATION):
            pause.add(name)
            continue
        kept = {f: was[f] for f in sorted(changed)}
        kept.update(previous.get("keep", {}).get(name, {}))      # what an earlier change kept stays in force
        if kept:
            keep[name] = kept
    return {"budget": budget, "keep": keep, "pause": sorted(pause & set(after)),
            "changes": list(previous.get("changes", [])) + dp_changes(changes)}


def _cells(group_by) -> list | None:
    """An aggregate's recorded ``group_by`` without each key's value mapping (:data:`stream_anon.guarantees.DIGESTED`):
    its cells."""
    if not isinstance(group_by, list):
        return None
    return [{k: v for k, v in g.items() if k != "mapping"} if isinstance(g, dict) else g for g in group_by]


def specs_in_force(specs, carried: dict | None) -> tuple:
    """The aggregate specifications in force under ``carried`` (a :func:`carry`): the kept fields' old values."""
    keep = (carried or {}).get("keep", {})
    return tuple(dataclasses.replace(s, **keep[s.name]) if s.name in keep else s for s in specs)
