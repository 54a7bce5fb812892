"""Differentially private aggregate specifications: the ``[dp]`` table and ``[[aggregates]]`` tables of a stream
configuration (docs/contracts.md; example in ``configs/oyster.toml``).

Every parameter is validated once, here, with an error that names the key
(``aggregates.taps_per_zone.epsilon: must be > 0``). Group-key **domains come from configuration** (an explicit
list of values, a level of a configured hierarchy, or the hours 0-23), never from the stream: the set of keys
published is then the same whatever the data, so absent keys are published (with noise) and the key set reveals
nothing (Dwork & Roth, *The Algorithmic Foundations of Differential Privacy*, 2014, section 2.3: a histogram's
cells must be fixed in advance).

>>> raw = {"stream": {"privacy_unit": "card_id", "event_time": "event_time"},
...        "dp": {"epsilon_budget": 4.0},
...        "aggregates": [{"name": "taps", "kind": "count", "epsilon": 0.5, "max_contributions": 2,
...                        "horizon_windows": 96,
...                        "group_by": [{"name": "hour", "field": "event_time", "kind": "hour"}]}]}
>>> cfg = parse_dp_config(raw)
>>> spec = cfg.aggregates[0]
>>> spec.sensitivity, len(spec.domain), spec.domain[7]
(2.0, 24, (7,))
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stream_anon.errors import ConfigError
from stream_anon.hierarchy import Hierarchy

KINDS = ("count", "sum", "mean", "histogram", "ratio")
OUTPUTS = ("per_window", "running", "both")
MECHANISMS = ("auto", "binary_tree", "per_window", "hybrid")
NOISES = ("auto", "geometric", "snapping", "laplace")   # "laplace" = "snapping" (floating-point safe, issue 10)
UNITS = ("event", "journey", "individual")
PERIODS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
GROUP_KINDS = ("values", "hierarchy", "hour")
_NAME_RE = re.compile(r"^[a-z0-9_-]+$")
MISSING = object()


@dataclass(frozen=True)
class GroupKey:
    """One group-by dimension: how an event maps to a key, and the fixed domain of keys.

    kind ``values``: the field's value must be one of ``domain``; ``hierarchy``: the field's value is a leaf of
    the hierarchy and the key is its ancestor at ``level``; ``hour``: the UTC hour (0-23) of an ISO-8601 field.
    Events whose key is null or outside the domain are not counted (reported as ``out_of_domain``).
    """
    name: str
    fields: tuple[str, ...]
    kind: str
    domain: tuple
    mapping: dict = field(default_factory=dict, repr=False, compare=False)   # raw value -> domain value

    def key_of(self, flat: dict):
        """The domain value of a flat event, or ``None`` when it has none."""
        value = None
        for f in self.fields:
            value = flat.get(f)
            if value is not None:
                break
        return self._value_key(value)

    def keys_of(self, flats: list[dict]) -> list:
        """``key_of`` of every event (the same values), in bulk: one mapping lookup or one time parse per
        distinct value (a window's events repeat a few stations and minutes)."""
        fields = self.fields
        if len(fields) == 1:
            f0 = fields[0]
            raw = [f.get(f0) for f in flats]
        elif len(fields) == 2:
            f0, f1 = fields
            raw = [v if (v := f.get(f0)) is not None else f.get(f1) for f in flats]
        else:
            raw = [next((v for v in map(f.get, fields) if v is not None), None) for f in flats]
        if self.kind != "hour":
            get = self.mapping.get
            try:
                return [get(v) for v in raw]        # get(None) is None: no domain value is null (TOML has none)
            except TypeError:                       # an unhashable value: outside every domain
                return [self._value_key(v) for v in raw]
        cache: dict = {}
        out = []
        for v in raw:
            try:
                k = cache[v]
            except KeyError:
                k = cache[v] = self._value_key(v)
            except TypeError:
                k = self._value_key(v)
            out.append(k)
        return out

    def _value_key(self, value):
        if value is None:
            return None
        if self.kind == "hour":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return datetime.fromtimestamp(value, timezone.utc).hour
            try:
                ts = datetime.fromisoformat(str(value))
            except ValueError:
                return None
            if ts.tzinfo is None:
                return None
            return ts.astimezone(timezone.utc).hour
        try:
            return self.mapping.get(value)
        except TypeError:                      # unhashable (list/dict) values are outside every domain
            return None


@dataclass(frozen=True)
class AggregateSpec:
    """A validated ``[[aggregates]]`` table.

    Sensitivity follows from the bounds (add/remove one individual, per window): each individual contributes at
    most ``max_contributions`` events per window to this aggregate, each event to one group cell, so a count or
    histogram changes by at most ``max_contributions`` in L1 norm, a sum by ``max_contributions * max(|lower|,
    |upper|)``. ``mean`` and ``ratio`` release two such quantities (sum and count, numerator and denominator),
    each with half of ``epsilon``.
    """
    name: str
    kind: str
    group_by: tuple[GroupKey, ...]
    epsilon: float                      # per window of data, for this aggregate (all its outputs together)
    max_contributions: int
    output: str = "per_window"
    horizon_windows: int | None = None  # None: unknown horizon (hybrid mechanism for running outputs)
    mechanism: str = "auto"
    noise: str = "auto"
    value_field: str | None = None
    lower: float | None = None
    upper: float | None = None
    bins: tuple[float, ...] = ()        # histogram: bin edges over the value field
    numerator_values: tuple = ()        # ratio: an event is in the numerator when its value is one of these
    where: tuple[tuple[str, tuple], ...] = ()   # event filter: field -> allowed values
    release_every: int = 1              # windows per release (period mode: aligned to the period's start)
    resolution: float = 1.0             # sum/mean: values rounded to multiples of it (integer noise on them)
    max_windows: int | None = None      # period mode: W for this aggregate (default: dp.max_windows_per_period)

    @functools.cached_property          # computed once per spec (read for every window and row)
    def domain(self) -> tuple[tuple, ...]:
        """Every group key (a tuple, one entry per group-by dimension, plus the bin label for histograms)."""
        dims = [g.domain for g in self.group_by]
        if self.kind == "histogram":
            dims.append(self.bin_labels)
        return tuple(itertools.product(*dims)) if dims else ((),)

    @property
    def key_names(self) -> tuple[str, ...]:
        names = tuple(g.name for g in self.group_by)
        return names + ("bin",) if self.kind == "histogram" else names

    @functools.cached_property
    def bin_labels(self) -> tuple[str, ...]:
        e = self.bins
        return tuple(f"[{_fmt(e[i])},{_fmt(e[i + 1])}{']' if i == len(e) - 2 else ')'}" for i in range(len(e) - 1))

    @property
    def components(self) -> tuple[str, ...]:
        """The noisy quantities released per group cell."""
        return {"count": ("count",), "histogram": ("count",), "sum": ("sum",), "mean": ("sum", "count"),
                "ratio": ("numerator", "denominator")}[self.kind]

    def component_sensitivity(self, component: str) -> float:
        if component == "sum":
            return float(self.max_contributions * max(abs(self.lower), abs(self.upper)))
        return float(self.max_contributions)

    @property
    def sensitivity(self) -> float:
        """Sensitivity of the first component (the one shown in single-component output)."""
        return self.component_sensitivity(self.components[0])

    def component_noise(self, component: str) -> str:
        """Every mechanism is floating-point safe (Mironov, *On Significance of the Least Significant Bits for
        Differential Privacy*, CCS 2012): ``geometric`` (diffprivlib Geometric, integer-valued) for counts and,
        by default, for sums on values rounded to multiples of ``resolution`` (an integer mechanism on scaled
        values); ``snapping`` (diffprivlib Snapping, Mironov's fix of the Laplace mechanism) when configured
        (``noise = "laplace"`` means ``snapping``)."""
        if self.noise in ("snapping", "laplace"):
            return "snapping"
        return "geometric"

    def component_resolution(self, component: str) -> float:
        """Unit of the integer noise: ``resolution`` for sums, 1 for counts."""
        return self.resolution if component == "sum" else 1.0


@dataclass(frozen=True)
class DPConfig:
    """The ``[dp]`` table plus every aggregate of a stream.

    Period mode (``dp.period`` set): ``epsilon_budget`` is the epsilon per unit of privacy (``unit``: event,
    journey or individual, identified by ``privacy_unit``) per period (``period`` in ``timezone``); each unit
    contributes to at most ``max_windows_per_period`` windows of a period per aggregate. Legacy mode
    (no ``period``): ``epsilon_budget`` is the total over every window, each aggregate's ``epsilon`` per window.
    """
    epsilon_budget: float
    aggregates: tuple[AggregateSpec, ...]
    privacy_unit: str | None
    stream: str = ""
    unit: str = "individual"
    period: str | None = None
    timezone: str = "UTC"
    max_windows_per_period: int | None = None
    window_s: float | None = None

    @property
    def period_mode(self) -> bool:
        return self.period is not None

    @functools.cached_property
    def clock(self) -> "PeriodClock | None":
        return PeriodClock(self.period, self.timezone, self.window_s) if self.period else None

    def spec(self, name: str) -> AggregateSpec:
        for s in self.aggregates:
            if s.name == name:
                return s
        raise KeyError(name)


class PeriodClock:
    """Maps window indices (``window_start = index * window_s``, UTC epoch seconds) to periods: calendar hours,
    days or weeks (weeks start on Monday) in an IANA time zone. A window belongs to the period containing its
    start. DST days have 23 or 25 hours: :meth:`max_windows` is the largest number of windows a period can hold.

    >>> c = PeriodClock("day", "Europe/London", 900)
    >>> label, first, n = c.period_of(int(1257753600 // 900) + 5)      # 2009-11-09T01:15Z
    >>> label, n, c.max_windows()
    ('2009-11-09', 96, 100)
    """

    def __init__(self, period: str, tz: str, window_s: float):
        from zoneinfo import ZoneInfo
        self.period, self.tz_name, self.window_s = period, tz, float(window_s)
        self.tz = ZoneInfo(tz)
        self._cache: dict[int, tuple[str, int, int]] = {}

    def _bounds(self, t: float):
        from datetime import timedelta
        local = datetime.fromtimestamp(t, self.tz)
        if self.period == "hour":
            start = local.replace(minute=0, second=0, microsecond=0)
            return start.strftime("%Y-%m-%dT%H"), start.timestamp(), start.timestamp() + 3600
        day = local.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.period == "week":
            day = day - timedelta(days=day.weekday())
            end = day + timedelta(days=7)
        else:
            end = day + timedelta(days=1)
        start_t = day.replace(tzinfo=None).replace(tzinfo=self.tz).timestamp()
        end_t = end.replace(tzinfo=None).replace(tzinfo=self.tz).timestamp()
        return day.strftime("%Y-%m-%d"), start_t, end_t

    def period_of(self, window: int) -> tuple[str, int, int]:
        """(label, first window index, number of windows) of the period holding ``window``."""
        hit = self._cache.get(window)
        if hit is None:
            label, start, end = self._bounds(window * self.window_s)
            first = math.ceil(start / self.window_s)
            hit = (label, first, math.ceil(end / self.window_s) - first)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[window] = hit
        return hit

    def max_windows(self) -> int:
        return math.ceil((PERIODS[self.period] + 3600) / self.window_s)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _num(table: dict, key: str, path: str, required=True, default=MISSING):
    if key not in table:
        if required:
            raise ConfigError(f"{path}.{key}: missing")
        return default
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{path}.{key}: expected a finite number, got {v!r}")
    return v


def _choice(table: dict, key: str, path: str, choices, default):
    v = table.get(key, default)
    if v not in choices:
        raise ConfigError(f"{path}.{key}: must be one of {', '.join(map(str, choices))}, got {v!r}")
    return v


def _fields(v, path: str) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise ConfigError(f"{path}: expected a field path or a non-empty list of field paths")
    return tuple(v)


def hierarchy_level(file: Path, level: str | int) -> tuple[Hierarchy, dict, tuple[str, ...]]:
    """Leaf -> ancestor at ``level`` (a name from the file's ``levels`` list, ``value`` first, or a depth from
    the leaves: 0 = the leaves themselves). Returns (hierarchy, mapping, domain in depth-first order)."""
    data = json.loads(Path(file).read_text()) if Path(file).suffix == ".json" else {}
    h = Hierarchy.from_json(file) if Path(file).suffix == ".json" else Hierarchy.from_arx_csv(file)
    levels = list(data.get("levels", []))
    if isinstance(level, str):
        if level not in levels:
            raise ValueError(f"level {level!r} not in the file's levels {levels}")
        up = levels.index(level)
    else:
        up = int(level)
    mapping: dict = {}
    domain: list[str] = []
    for leaf in h.leaves:
        chain = [leaf]                         # leaf .. root
        node = leaf
        while node != h.root:
            node = next(iter(h.graph.predecessors(node)))
            chain.append(node)
        if up >= len(chain):
            raise ValueError(f"level {level!r} is above the root for leaf {leaf!r}")
        label = chain[up]
        mapping[leaf] = label
        if not domain or domain[-1] != label:
            if label not in domain:
                domain.append(label)
    return h, mapping, tuple(domain)


def _parse_group(table: Any, path: str, base_dir: Path, event_time: str) -> GroupKey:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: expected a table {{name, field, values | hierarchy+level | kind='hour'}}")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"{path}.name: use lowercase letters, digits, '_' or '-', got {name!r}")
    kind = table.get("kind") or ("hierarchy" if "hierarchy" in table else "values" if "values" in table else None)
    if kind not in GROUP_KINDS:
        raise ConfigError(f"{path}.kind: must be one of {', '.join(GROUP_KINDS)} (or give 'values' or "
                          f"'hierarchy'), got {kind!r}; the key domain comes from configuration, never the data")
    fields = _fields(table.get("field", event_time if kind == "hour" else None), f"{path}.field")
    if kind == "hour":
        return GroupKey(name, fields, "hour", tuple(range(24)))
    if kind == "values":
        values = table.get("values")
        if not isinstance(values, list) or not values or any(isinstance(v, (dict, list)) for v in values):
            raise ConfigError(f"{path}.values: expected a non-empty list of values (the key domain)")
        if len(set(values)) != len(values):
            raise ConfigError(f"{path}.values: duplicate values")
        return GroupKey(name, fields, "values", tuple(values), {v: v for v in values})
    hpath = table.get("hierarchy")
    if not isinstance(hpath, str):
        raise ConfigError(f"{path}.hierarchy: expected a file path (relative to the config file)")
    file = (base_dir / hpath).resolve()
    if not file.exists():
        raise ConfigError(f"{path}.hierarchy: file not found: {file}")
    level = table.get("level", 0)
    if isinstance(level, bool) or not isinstance(level, (str, int)):
        raise ConfigError(f"{path}.level: expected a level name or a number of levels above the leaves")
    try:
        _, mapping, domain = hierarchy_level(file, level)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{path}.level: {exc}") from None
    return GroupKey(name, fields, "hierarchy", domain, mapping)


def parse_aggregate(table: Any, i: int, base_dir: Path, event_time: str = "event_time",
                    period_mode: bool = False) -> AggregateSpec:
    """One ``[[aggregates]]`` table -> :class:`AggregateSpec` (raises :class:`ConfigError` naming the key)."""
    path = f"aggregates[{i}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: expected a table")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"{path}.name: use lowercase letters, digits, '_' or '-', got {name!r}")
    path = f"aggregates.{name}"
    known = {"name", "kind", "group_by", "epsilon", "max_contributions", "output", "horizon_windows", "mechanism",
             "noise", "value", "lower", "upper", "bins", "numerator_values", "where", "release_every_windows",
             "resolution", "max_windows_per_period"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown key (expected one of {', '.join(sorted(known))})")
    kind = _choice(table, "kind", path, KINDS, table.get("kind"))
    epsilon = _num(table, "epsilon", path)
    if not epsilon > 0:
        raise ConfigError(f"{path}.epsilon: must be > 0, got {epsilon!r}")
    mc = table.get("max_contributions", MISSING)
    if mc is MISSING:
        raise ConfigError(f"{path}.max_contributions: missing (events per individual per window; it sets the "
                          f"sensitivity)")
    if isinstance(mc, bool) or not isinstance(mc, int) or mc < 1:
        raise ConfigError(f"{path}.max_contributions: must be a positive integer, got {mc!r}")
    output = _choice(table, "output", path, OUTPUTS, "per_window")
    horizon = table.get("horizon_windows")
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise ConfigError(f"{path}.horizon_windows: must be a positive integer (omit it for an unknown horizon), "
                          f"got {horizon!r}")
    mechanism = _choice(table, "mechanism", path, MECHANISMS, "auto")
    if mechanism == "binary_tree" and horizon is None and not period_mode:
        raise ConfigError(f"{path}.mechanism: binary_tree needs horizon_windows (use hybrid for an unknown horizon)")
    noise = _choice(table, "noise", path, NOISES, "auto")
    groups_raw = table.get("group_by", [])
    if not isinstance(groups_raw, list):
        raise ConfigError(f"{path}.group_by: expected a list of tables")
    groups = tuple(_parse_group(g, f"{path}.group_by[{j}]", base_dir, event_time) for j, g in enumerate(groups_raw))
    if len({g.name for g in groups}) != len(groups):
        raise ConfigError(f"{path}.group_by: duplicate names")
    value_field = lower = upper = None
    bins: tuple = ()
    numerator: tuple = ()
    if kind in ("sum", "mean", "histogram", "ratio"):
        value_field = table.get("value")
        if not isinstance(value_field, str) or not value_field:
            raise ConfigError(f"{path}.value: missing (the dotted path of the value field)")
    if kind in ("sum", "mean"):
        lower, upper = _num(table, "lower", path), _num(table, "upper", path)
        if not lower < upper:
            raise ConfigError(f"{path}: lower ({lower}) must be below upper ({upper}) (clamping bounds come from "
                              f"configuration, never from the data)")
        lower, upper = float(lower), float(upper)
    if kind == "histogram":
        b = table.get("bins")
        if (not isinstance(b, list) or len(b) < 2 or
                any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in b)):
            raise ConfigError(f"{path}.bins: expected at least two numeric bin edges")
        if any(b[i] >= b[i + 1] for i in range(len(b) - 1)):
            raise ConfigError(f"{path}.bins: edges must increase strictly")
        bins = tuple(float(x) for x in b)
        lower, upper = bins[0], bins[-1]
    if kind == "ratio":
        nv = table.get("numerator_values")
        if not isinstance(nv, list) or not nv:
            raise ConfigError(f"{path}.numerator_values: expected a non-empty list (an event is in the numerator "
                              f"when its value is one of them)")
        numerator = tuple(nv)
    where_raw = table.get("where", {})
    if not isinstance(where_raw, dict) or not all(isinstance(v, list) and v for v in where_raw.values()):
        raise ConfigError(f"{path}.where: expected a table of field = [allowed values]")
    where = tuple((k, tuple(v)) for k, v in where_raw.items())
    every = table.get("release_every_windows", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(f"{path}.release_every_windows: must be a positive integer, got {every!r}")
    resolution = _num(table, "resolution", path, required=False, default=1.0)
    if not resolution > 0:
        raise ConfigError(f"{path}.resolution: must be > 0, got {resolution!r}")
    if kind in ("sum", "mean"):
        ratio = max(abs(lower), abs(upper)) / resolution
        if abs(ratio - round(ratio)) > 1e-9:
            raise ConfigError(f"{path}.resolution: max(|lower|, |upper|) must be a multiple of it (integer noise "
                              f"on values in units of the resolution), got {resolution!r}")
    w_own = table.get("max_windows_per_period")
    if w_own is not None and (isinstance(w_own, bool) or not isinstance(w_own, int) or w_own < 1):
        raise ConfigError(f"{path}.max_windows_per_period: must be a positive integer, got {w_own!r}")
    return AggregateSpec(name, kind, groups, float(epsilon), mc, output, horizon, mechanism, noise, value_field,
                         lower, upper, bins, numerator, where, every, float(resolution), w_own)


def parse_dp_config(raw: dict, base_dir: str | Path = ".") -> DPConfig:
    """The ``[dp]`` and ``[[aggregates]]`` tables of a stream configuration's raw TOML dict.

    Period mode (the unit of privacy and the period are explicit)::

        [dp]
        unit = "individual"            # event | journey | individual (field: stream.privacy_unit or dp.unit_field)
        period = "day"                 # hour | day | week, calendar periods in `timezone`
        timezone = "Europe/London"
        epsilon_per_period = 1.0       # per unit and period, over every aggregate (the ledger enforces it)
        max_windows_per_period = 8     # W: windows of a period a unit contributes to, per aggregate

    and each ``[[aggregates]] epsilon`` is that aggregate's share of ``epsilon_per_period`` (the shares must add up
    to at most the budget: the split is stated in the configuration). Legacy mode (no ``period``):
    ``epsilon_budget`` is the total epsilon one individual may be charged over every aggregate and window, and
    ``epsilon`` is per window (sequential composition over windows).
    """
    base_dir = Path(base_dir)
    stream = raw.get("stream", {}) if isinstance(raw.get("stream", {}), dict) else {}
    unit_field = stream.get("privacy_unit")
    dp = raw.get("dp", {})
    if not isinstance(dp, dict):
        raise ConfigError("dp: expected a table")
    known = {"epsilon_budget", "epsilon_per_period", "unit", "unit_field", "period", "timezone",
             "max_windows_per_period"}
    unknown = sorted(set(dp) - known)
    if unknown:
        raise ConfigError(f"dp.{unknown[0]}: unknown key (expected one of {', '.join(sorted(known))})")
    period_mode = "period" in dp or "unit" in dp or "epsilon_per_period" in dp
    unit, period, tz, w_max, window_s = "individual", None, "UTC", None, None
    if period_mode:
        if "epsilon_budget" in dp:
            raise ConfigError("dp.epsilon_budget: with dp.period use dp.epsilon_per_period (epsilon per unit and "
                              "period)")
        unit = _choice(dp, "unit", "dp", UNITS, dp.get("unit", MISSING) if "unit" in dp else None)
        period = _choice(dp, "period", "dp", tuple(PERIODS), dp.get("period") if "period" in dp else None)
        tz = dp.get("timezone", MISSING)
        if not isinstance(tz, str):
            raise ConfigError("dp.timezone: missing (an IANA time zone such as 'Europe/London'; periods are "
                              "calendar periods there)")
        try:
            from zoneinfo import ZoneInfo
            ZoneInfo(tz)
        except Exception:                                   # ZoneInfoNotFoundError, ValueError
            raise ConfigError(f"dp.timezone: unknown time zone {tz!r}") from None
        budget = _num(dp, "epsilon_per_period", "dp")
        if not budget > 0:
            raise ConfigError(f"dp.epsilon_per_period: must be > 0, got {budget!r}")
        anon = raw.get("anonymization", {}) if isinstance(raw.get("anonymization", {}), dict) else {}
        window_s = anon.get("window_s")
        if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not window_s > 0:
            raise ConfigError(f"anonymization.window_s: dp.period needs the window length in seconds, got "
                              f"{window_s!r}")
        if PERIODS[period] % window_s:
            raise ConfigError(f"dp.period: a {period} must hold a whole number of windows of {window_s} s")
        if unit == "event":
            # every event is its own unit: the aggregator ignores the field; it stays set (the stream's unit
            # field, else the event time) so field projections that list it keep working
            unit_field = unit_field if isinstance(unit_field, str) and unit_field else stream.get("event_time",
                                                                                                  "event_time")
            if "max_windows_per_period" in dp and dp["max_windows_per_period"] != 1:
                raise ConfigError("dp.max_windows_per_period: an event is in one window (omit it or set 1)")
            w_max = 1
        else:
            unit_field = dp.get("unit_field", unit_field)
            if not isinstance(unit_field, str) or not unit_field:
                raise ConfigError(f"dp.unit_field: missing (the field identifying the {unit}; default "
                                  f"stream.privacy_unit)")
            w_max = dp.get("max_windows_per_period", MISSING)
            if w_max is MISSING:
                raise ConfigError("dp.max_windows_per_period: missing (W: windows of a period one unit "
                                  "contributes to; it sets the per-period sensitivity)")
            per = int(PERIODS[period] // window_s)
            if isinstance(w_max, bool) or not isinstance(w_max, int) or not 1 <= w_max <= per:
                raise ConfigError(f"dp.max_windows_per_period: must be an integer in [1, {per}] (windows per "
                                  f"{period}), got {w_max!r}")
    else:
        if not isinstance(unit_field, str) or not unit_field:
            raise ConfigError("stream.privacy_unit: missing (contribution bounding counts events per individual)")
        budget = _num(dp, "epsilon_budget", "dp")
        if not budget > 0:
            raise ConfigError(f"dp.epsilon_budget: must be > 0, got {budget!r}")
    tables = raw.get("aggregates", [])
    if not isinstance(tables, list):
        raise ConfigError("aggregates: expected an array of tables ([[aggregates]])")
    specs = tuple(parse_aggregate(t, i, base_dir, stream.get("event_time", "event_time"), period_mode)
                  for i, t in enumerate(tables))
    names = [s.name for s in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"aggregates.{dup}.name: duplicate aggregate name")
    for s, t in zip(specs, tables):
        if s.epsilon > budget:
            key = "epsilon_per_period" if period_mode else "epsilon_budget"
            raise ConfigError(f"aggregates.{s.name}.epsilon: {s.epsilon} exceeds dp.{key} ({budget})")
        if period_mode and "horizon_windows" in t:
            raise ConfigError(f"aggregates.{s.name}.horizon_windows: set by dp.period (the running counters "
                              f"restart every period); remove it")
        if period_mode and unit == "event" and s.max_contributions != 1:
            raise ConfigError(f"aggregates.{s.name}.max_contributions: must be 1 when dp.unit = 'event'")
        if s.max_windows is not None and (not period_mode or unit == "event"
                                          or s.max_windows > PERIODS[period] // window_s):
            raise ConfigError(f"aggregates.{s.name}.max_windows_per_period: needs dp.period and a unit other "
                              f"than 'event', and at most the windows of a period")
        if not period_mode and s.release_every != 1:
            raise ConfigError(f"aggregates.{s.name}.release_every_windows: needs dp.period (releases are aligned "
                              f"to the period's start)")
    if period_mode:
        total = sum(s.epsilon for s in specs)
        if total > budget * (1 + 1e-9):
            raise ConfigError(f"dp.epsilon_per_period: the aggregates' epsilons add up to {total:g}, above the "
                              f"budget {budget:g} (the split across aggregates must fit one period's budget)")
        cfg = DPConfig(float(budget), (), unit_field, str(stream.get("name", "")), unit, period, tz, w_max,
                       float(window_s))
        per = cfg.clock.max_windows()
        specs = tuple(_with_horizon(s, -(-per // s.release_every), s.max_windows or w_max) for s in specs)
        return DPConfig(float(budget), specs, unit_field, str(stream.get("name", "")), unit, period, tz, w_max,
                        float(window_s))
    return DPConfig(float(budget), specs, unit_field, str(stream.get("name", "")))


def _with_horizon(spec: AggregateSpec, horizon: int, max_windows: int) -> AggregateSpec:
    from dataclasses import replace
    return replace(spec, horizon_windows=horizon, max_windows=max_windows)


def load_dp_config(path: str | Path, extra: str | Path | None = None) -> DPConfig:
    """Parse the ``[dp]``/``[[aggregates]]`` tables of a stream TOML (optionally merged with an aggregates-only
    TOML, whose ``[dp]``/``[[aggregates]]`` win)."""
    import tomllib
    path = Path(path)
    raw = tomllib.loads(path.read_text())
    if extra is not None:
        more = tomllib.loads(Path(extra).read_text())
        raw = {**raw, **{k: v for k, v in more.items() if k in ("dp", "aggregates")}}
    return parse_dp_config(raw, path.parent)
