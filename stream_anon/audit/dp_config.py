"""The audit's reading of a stream's ``[dp]`` and ``[[aggregates]]`` tables (tomllib only, nothing of
:mod:`stream_anon.dp` nor :mod:`stream_anon.config`), and its own calendar of periods.

What the DP check needs and nothing more: the budget (per unit and period in period mode, a total in legacy mode),
the period and its time zone, ``W`` (windows of a period one unit contributes to, per aggregate), and per aggregate
its kind, epsilon, ``max_contributions``, value bounds and ``release_every_windows``. A key the engine requires and
this reader cannot find is an error (``ValueError``), never a default that would make the audit more lenient.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

PERIOD_SECONDS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
# components of an aggregate kind, in the order the rows publish them
COMPONENTS = {"count": ("count",), "sum": ("sum",), "mean": ("sum", "count"), "histogram": ("count",),
              "ratio": ("numerator", "denominator")}


@dataclass(frozen=True)
class AggregateBudget:
    """One ``[[aggregates]]`` table as the DP check reads it."""

    name: str
    kind: str
    epsilon: float
    max_contributions: int
    max_windows: float           # W of this aggregate (period mode); inf in legacy mode (one window per release)
    release_every: int
    lower: float | None = None
    upper: float | None = None
    resolution: float = 1.0

    def window_sensitivity(self, component: str) -> float:
        """How much one unit's contributions to one window change ``component`` (L1): ``max_contributions``
        events, each worth at most ``max(|lower|, |upper|)`` in a sum and 1 in a count."""
        if component == "sum":
            return float(self.max_contributions) * max(abs(self.lower or 0.0), abs(self.upper or 0.0))
        return float(self.max_contributions)


@dataclass(frozen=True)
class DPBudget:
    """``[dp]``: ``budget`` per unit and period (legacy mode, ``period`` None: over every window)."""

    budget: float
    period: str | None
    timezone: str | None
    window_s: float
    unit: str | None
    aggregates: dict[str, AggregateBudget] = field(default_factory=dict)

    def period_of(self, window: int) -> str | None:
        """The calendar period holding ``window`` (its start, ``window * window_s`` UTC seconds), labelled as the
        rows label it: ``YYYY-MM-DDTHH`` (hour), ``YYYY-MM-DD`` (day; a week by its Monday)."""
        if self.period is None:
            return None
        from zoneinfo import ZoneInfo
        assert self.timezone is not None       # read_dp requires a time zone with a period
        local = datetime.fromtimestamp(window * self.window_s, ZoneInfo(self.timezone))
        if self.period == "hour":
            return local.strftime("%Y-%m-%dT%H")
        day = local.date()
        if self.period == "week":
            day = day - timedelta(days=day.weekday())
        return day.isoformat()


def _number(t: dict, key: str, at: str, default: Any = None) -> float:
    v = t.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{at}.{key}: a finite number, got {v!r}")
    return float(v)


def read_dp(raw: dict) -> DPBudget | None:
    """The DP settings of a parsed stream TOML (None: no ``[dp]`` table)."""
    dp = raw.get("dp")
    if not isinstance(dp, dict):
        return None
    anon = raw.get("anonymization", {})
    window_s = _number(anon, "window_s", "anonymization", 900)
    period_mode = "period" in dp or "unit" in dp or "epsilon_per_period" in dp
    if period_mode:
        period, unit = dp.get("period"), dp.get("unit")
        if period not in PERIOD_SECONDS:
            raise ValueError(f"dp.period: one of {sorted(PERIOD_SECONDS)}, got {period!r}")
        budget = _number(dp, "epsilon_per_period", "dp")
        w_default = 1 if unit == "event" else int(_number(dp, "max_windows_per_period", "dp"))
        tz = dp.get("timezone")
        if not isinstance(tz, str):
            raise ValueError(f"dp.timezone: an IANA time zone, got {tz!r}")
    else:
        period, unit, tz, w_default = None, None, None, None
        budget = _number(dp, "epsilon_budget", "dp")
    aggs = {}
    for i, a in enumerate(raw.get("aggregates") or []):
        at = f"aggregates[{i}]"
        name, kind = a.get("name"), a.get("kind")
        if kind not in COMPONENTS:
            raise ValueError(f"{at}.kind: the audit cannot check {kind!r}")
        w = math.inf if not period_mode else int(a.get("max_windows_per_period", w_default))
        lower = _number(a, "lower", at) if "lower" in a else None
        upper = _number(a, "upper", at) if "upper" in a else None
        if kind in ("sum", "mean") and (lower is None or upper is None):
            raise ValueError(f"{at}: lower and upper are required for a {kind}")
        aggs[str(name)] = AggregateBudget(str(name), kind, _number(a, "epsilon", at),
                                          int(_number(a, "max_contributions", at)), w,
                                          int(a.get("release_every_windows", 1)), lower, upper,
                                          _number(a, "resolution", at, 1.0))
    return DPBudget(budget, period, tz, window_s, unit, aggs)
