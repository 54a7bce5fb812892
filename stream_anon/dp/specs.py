"""Differentially private aggregate specifications: the ``[dp]`` table and ``[[aggregates]]`` tables of a stream
configuration (every key: docs/configuration.md; example in ``configs/oyster.toml``).

Every parameter is validated once, here, through :mod:`stream_anon.validation`, with an error that names the key
(``aggregates.taps_per_zone.epsilon: must be > 0, got 0``); a key no table knows is refused.
Group-key **domains come from configuration** (an explicit list of values, a level of a configured hierarchy, or
the hours 0-23), never from the stream: the set of keys published is then the same whatever the data, so absent
keys are published (with noise) and the key set reveals nothing (Dwork & Roth, *The Algorithmic Foundations of
Differential Privacy*, 2014, section 2.3: a histogram's cells must be fixed in advance).

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
import math
import itertools
import json
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from stream_anon.dp.periods import PERIODS, PeriodClock, period_alignment_error
from stream_anon.errors import ConfigError
from stream_anon.hierarchy import Hierarchy
from stream_anon.validation import MAX_COUNT, MAX_EPSILON, MAX_MAGNITUDE, MAX_SECONDS, REQUIRED, ConfigDir, Table, \
    check_integer, check_number, check_timestamp, named_tables

KINDS = ("count", "sum", "mean", "histogram", "ratio")
OUTPUTS = ("per_window", "running", "both")
MECHANISMS = ("auto", "binary_tree", "per_window", "hybrid")
NOISES = ("auto", "geometric", "snapping", "laplace")   # "laplace" = "snapping" (floating-point safe)
UNITS = ("event", "journey", "individual")
GROUP_KINDS = ("values", "hierarchy", "hour")
MAX_WINDOWS = 10 ** 9      # horizon_windows: more windows than a stream of one-second windows has in 30 years
MAX_LEVEL = 64             # levels above the leaves of a hierarchy

# the keys of each table (docs/configuration.md lists the same; tests/cli/test_config_reference.py compares them)
DP_KEYS = ("epsilon_budget", "epsilon_per_period", "unit", "unit_field", "period", "timezone",
           "max_windows_per_period", "start")
AGGREGATE_KEYS = ("name", "kind", "group_by", "epsilon", "max_contributions", "output", "horizon_windows",
                  "mechanism", "noise", "value", "lower", "upper", "bins", "numerator_values", "where",
                  "release_every_windows", "resolution", "max_windows_per_period")
GROUP_KEYS = ("name", "field", "kind", "values", "hierarchy", "level")


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
        return self.value_key(value)

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
                return [self.value_key(v) for v in raw]
        cache: dict = {}
        out = []
        for v in raw:
            try:
                k = cache[v]
            except KeyError:
                k = cache[v] = self.value_key(v)
            except TypeError:
                k = self.value_key(v)
            out.append(k)
        return out

    def value_key(self, value):
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
            assert self.lower is not None and self.upper is not None, "a sum's bounds (parse_aggregate)"
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
    start: float | None = None          # the schedule's start (epoch seconds): see :attr:`start_window`
    # period -> (a window of it, epsilon) spent by a lost lineage, charged to a new one (stream_anon.dp.carry)
    carried: tuple = ()

    @property
    def period_mode(self) -> bool:
        return self.period is not None

    @property
    def start_window(self) -> int | None:
        """The first window of the release schedule: the first window of the period holding :attr:`start` (period
        mode), or the window holding it. Every window from it on is released, whatever the data (None: no
        declared start, the schedule begins at the first window processed, a library use only)."""
        if self.start is None or self.window_s is None:
            return None
        w = math.floor(self.start / self.window_s)
        return self.clock.period_of(w)[1] if self.clock is not None else w

    def schedule_end(self, window: int) -> int:
        """The last window released when the stream's clock stands in ``window``: the last window of its period
        (a period is released whole once its clock has reached it), or ``window`` itself without a period."""
        if self.clock is None:
            return int(window)
        _, first, n = self.clock.period_of(int(window))
        return first + n - 1

    @functools.cached_property
    def clock(self) -> "PeriodClock | None":
        if not self.period:
            return None
        assert self.window_s is not None, "period mode has a window length (parse_dp_config)"
        return PeriodClock(self.period, self.timezone, self.window_s)

    def spec(self, name: str) -> AggregateSpec:
        for s in self.aggregates:
            if s.name == name:
                return s
        raise KeyError(name)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


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


def _parse_group(raw: Any, path: str, base_dir: Path | ConfigDir, event_time: str) -> GroupKey:
    t = Table(raw, path, GROUP_KEYS)
    name = t.name()
    kind = t.choice("kind", GROUP_KINDS, "hierarchy" if "hierarchy" in t else "values" if "values" in t else None)
    if kind is None:
        raise ConfigError(f"{t.key('kind')}: give values, hierarchy or kind = 'hour'; the key domain comes from "
                          f"configuration, never the data")
    fields = t.fields("field", (event_time,) if kind == "hour" else REQUIRED)
    if kind == "hour":
        group = GroupKey(name, fields, "hour", tuple(range(24)))
    elif kind == "values":
        values = t.get("values")
        if not isinstance(values, list) or not values or any(isinstance(v, (dict, list)) for v in values):
            raise ConfigError(f"{t.key('values')}: expected a non-empty list of values (the key domain)")
        for v in values:
            if isinstance(v, float):
                check_number(v, t.key("values"))
        if len(set(values)) != len(values):
            raise ConfigError(f"{t.key('values')}: duplicate values")
        group = GroupKey(name, fields, "values", tuple(values), {v: v for v in values})
    else:
        file = t.file("hierarchy", base_dir)
        level = t.get("level", 0)      # a name of the file's levels, or a number of levels above the leaves
        if not isinstance(level, str):
            check_integer(level, t.key("level"), 0, MAX_LEVEL)
        try:
            _, mapping, domain = hierarchy_level(file, level)
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"{t.key('level')}: {exc}") from None
        group = GroupKey(name, fields, "hierarchy", domain, mapping)
    t.done(f"not a key of a group of kind {kind!r}")
    return group


def parse_aggregate(table: Any, path: str, base_dir: Path | ConfigDir, event_time: str = "event_time",
                    period_mode: bool = False) -> AggregateSpec:
    """One ``[[aggregates]]`` table (``path``: ``aggregates.<name>``) -> :class:`AggregateSpec` (raises
    :class:`ConfigError` naming the key)."""
    t = table if isinstance(table, Table) else Table(table, path, AGGREGATE_KEYS)
    name, kind = t.name(), t.choice("kind", KINDS)
    epsilon = t.number("epsilon", above=0, at_most=MAX_EPSILON)
    if "max_contributions" not in t:
        raise ConfigError(f"{t.key('max_contributions')}: missing (events per individual per window; it sets the "
                          f"sensitivity)")
    mc = t.integer("max_contributions", 1, MAX_COUNT)
    output = t.choice("output", OUTPUTS, "per_window")
    horizon = None if period_mode else t.integer("horizon_windows", 1, MAX_WINDOWS, None)
    mechanism = t.choice("mechanism", MECHANISMS, "auto")
    if mechanism == "binary_tree" and horizon is None and not period_mode:
        raise ConfigError(f"{t.key('mechanism')}: binary_tree needs horizon_windows (use hybrid for an unknown "
                          f"horizon)")
    noise = t.choice("noise", NOISES, "auto")
    groups_raw = t.get("group_by", [])
    if not isinstance(groups_raw, list):
        raise ConfigError(f"{t.key('group_by')}: expected a list of tables")
    groups = tuple(_parse_group(g, f"{t.key('group_by')}[{j}]", base_dir, event_time)
                   for j, g in enumerate(groups_raw))
    if len({g.name for g in groups}) != len(groups):
        raise ConfigError(f"{t.key('group_by')}: duplicate names")
    value_field = t.text("value") if kind in ("sum", "mean", "histogram", "ratio") else None
    lower = upper = None
    bins: tuple = ()
    numerator: tuple = ()
    if kind in ("sum", "mean"):
        lower, upper = (t.number(b, at_least=-MAX_MAGNITUDE, at_most=MAX_MAGNITUDE) for b in ("lower", "upper"))
        if not lower < upper:
            raise ConfigError(f"{t.key('lower')}: must be below upper ({upper}), got {lower} (clamping bounds "
                              f"come from configuration, never from the data)")
    if kind == "histogram":
        b = t.get("bins")
        if not isinstance(b, list) or len(b) < 2:
            raise ConfigError(f"{t.key('bins')}: expected at least two numeric bin edges")
        bins = tuple(check_number(x, f"{t.key('bins')}[{i}]", at_least=-MAX_MAGNITUDE, at_most=MAX_MAGNITUDE)
                     for i, x in enumerate(b))
        if any(bins[i] >= bins[i + 1] for i in range(len(bins) - 1)):
            raise ConfigError(f"{t.key('bins')}: edges must increase strictly")
        lower, upper = bins[0], bins[-1]
    if kind == "ratio":
        nv = t.get("numerator_values")
        if not isinstance(nv, list) or not nv:
            raise ConfigError(f"{t.key('numerator_values')}: expected a non-empty list (an event is in the "
                              f"numerator when its value is one of them)")
        numerator = tuple(nv)
    where_raw = t.mapping("where", {})
    if not all(isinstance(v, list) and v for v in where_raw.values()):
        raise ConfigError(f"{t.key('where')}: expected a table of field = [allowed values]")
    every = t.integer("release_every_windows", 1, MAX_COUNT, 1)
    resolution = 1.0
    if kind in ("sum", "mean"):
        resolution = t.number("resolution", 1.0, above=0)
        assert lower is not None and upper is not None      # read above for sums and means
        ratio = max(abs(lower), abs(upper)) / resolution
        if abs(ratio - round(ratio)) > 1e-9:
            raise ConfigError(f"{t.key('resolution')}: max(|lower|, |upper|) must be a multiple of it (integer "
                              f"noise on values in units of the resolution), got {t.get('resolution')!r}")
    w_own = t.integer("max_windows_per_period", 1, MAX_COUNT, None)
    if period_mode and "horizon_windows" in t:
        raise ConfigError(f"{t.key('horizon_windows')}: set by dp.period (the running counters restart every "
                          f"period); remove it")
    t.done(f"not a key of a {kind} aggregate")
    return AggregateSpec(name, kind, groups, epsilon, mc, output, horizon, mechanism, noise, value_field,
                         lower, upper, bins, numerator, tuple((k, tuple(v)) for k, v in where_raw.items()), every,
                         resolution, w_own)


def parse_dp_config(raw: dict, base_dir: "str | Path | ConfigDir" = ".", need_start: bool = False) -> DPConfig:
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

    ``dp.start`` (default: the event time's declared lower bound) fixes where the release schedule begins
    (:attr:`DPConfig.start_window`); ``need_start``: refuse a stream without one (the worker's configurations).
    """
    base_dir = ConfigDir.of(base_dir)        # the config's directory, whose tree its hierarchy files lie in
    stream = raw.get("stream", {}) if isinstance(raw.get("stream", {}), dict) else {}
    t = Table(raw.get("dp", {}), "dp", DP_KEYS)
    period_mode = "period" in t or "unit" in t or "epsilon_per_period" in t
    if period_mode:
        mode = _period_mode(t, raw, stream)
        budget = mode["epsilon_budget"]
    else:
        unit_field = stream.get("privacy_unit")
        if not isinstance(unit_field, str) or not unit_field:
            raise ConfigError("stream.privacy_unit: missing (contribution bounding counts events per individual)")
        budget = t.number("epsilon_budget", above=0, at_most=MAX_EPSILON)
        mode = {"epsilon_budget": budget, "privacy_unit": unit_field}
    start = _schedule_start(t, raw, stream, mode.get("timezone", "UTC"), need_start)
    t.done("only meaningful in period mode (with dp.period)")
    tables = named_tables(raw.get("aggregates", []), "aggregates", AGGREGATE_KEYS)
    specs = tuple(parse_aggregate(a, a.path, base_dir, stream.get("event_time", "event_time"), period_mode)
                  for a in tables)
    unit, window_s = mode.get("unit"), mode.get("window_s")
    for s in specs:
        if s.epsilon > budget:
            key = "epsilon_per_period" if period_mode else "epsilon_budget"
            raise ConfigError(f"aggregates.{s.name}.epsilon: {s.epsilon} exceeds dp.{key} ({budget})")
        if period_mode and unit == "event" and s.max_contributions != 1:
            raise ConfigError(f"aggregates.{s.name}.max_contributions: must be 1 when dp.unit = 'event'")
        if s.max_windows is not None and (not period_mode or unit == "event"
                                          or s.max_windows > PERIODS[mode["period"]] // mode["window_s"]):
            raise ConfigError(f"aggregates.{s.name}.max_windows_per_period: needs dp.period and a unit other "
                              f"than 'event', and at most the windows of a period")
        if not period_mode and s.release_every != 1:
            raise ConfigError(f"aggregates.{s.name}.release_every_windows: needs dp.period (releases are aligned "
                              f"to the period's start)")
    name = str(stream.get("name", ""))
    if not period_mode:
        anon = raw.get("anonymization", {}) if isinstance(raw.get("anonymization", {}), dict) else {}
        window_s = anon.get("window_s")
        window_s = check_number(window_s, "anonymization.window_s", above=0, at_most=MAX_SECONDS) \
            if window_s is not None else None
        if need_start and window_s is None:
            raise ConfigError("anonymization.window_s: missing (the DP release schedule is in windows)")
        return DPConfig(float(budget), specs, mode["privacy_unit"], name, window_s=window_s, start=start)
    total = sum(s.epsilon for s in specs)
    if total > budget * (1 + 1e-9):
        raise ConfigError(f"dp.epsilon_per_period: the aggregates' epsilons add up to {total:g}, above the "
                          f"budget {budget:g} (the split across aggregates must fit one period's budget)")
    cfg = DPConfig(aggregates=(), stream=name, **mode)
    assert cfg.clock is not None                 # period mode
    per = cfg.clock.max_windows()
    w_max = mode["max_windows_per_period"]
    specs = tuple(_with_horizon(s, -(-per // s.release_every), s.max_windows or w_max) for s in specs)
    return DPConfig(aggregates=specs, stream=name, start=start, **mode)


def _schedule_start(t: Table, raw: dict, stream: dict, tz: str, need_start: bool) -> float | None:
    """``dp.start`` in epoch seconds: a TOML date or date-time, or ISO-8601 text; a date or a time without a UTC
    offset is read in ``dp.timezone``. Default: the lower bound of the event time's timestamp quasi-identifier (the
    declared domain: an earlier event is dead-lettered). The schedule must not start where the data starts: which
    rows exist would then tell whose event came first."""
    if "start" in t:
        value = t.get("start")
        if isinstance(value, date) and not isinstance(value, datetime):
            value = datetime(value.year, value.month, value.day)
        elif isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                raise ConfigError(f"dp.start: not an ISO-8601 date or time: {value!r}") from None
        if isinstance(value, datetime) and value.tzinfo is None:
            from zoneinfo import ZoneInfo
            value = value.replace(tzinfo=ZoneInfo(tz))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return check_number(value, "dp.start")
        if not isinstance(value, datetime):
            raise ConfigError(f"dp.start: expected a date or a date-time, got {value!r}")
        return value.timestamp()
    event_time = stream.get("event_time", "event_time")
    for q in raw.get("quasi_identifiers") or ():
        fields = q.get("field") if isinstance(q, dict) else None
        fields = [fields] if isinstance(fields, str) else list(fields or ())
        if q.get("kind") == "timestamp" and event_time in fields and q.get("lower") is not None:
            return check_timestamp(q["lower"], f"quasi_identifiers.{q.get('name')}.lower")
    if need_start:
        raise ConfigError("dp.start: missing (the first period of the DP release schedule: every window from it on "
                          "is published whatever the data; default: the lower bound of the event time's timestamp "
                          "quasi-identifier, which this stream does not have)")
    return None


def _period_mode(t: Table, raw: dict, stream: dict) -> dict:
    """The [dp] keys of period mode: unit, period, time zone, budget per period, W (DPConfig's fields)."""
    if "epsilon_budget" in t:
        raise ConfigError("dp.epsilon_budget: with dp.period use dp.epsilon_per_period (epsilon per unit and "
                          "period)")
    unit, period = t.choice("unit", UNITS), t.choice("period", tuple(PERIODS))
    if "timezone" not in t:
        raise ConfigError("dp.timezone: missing (an IANA time zone such as 'Europe/London'; periods are "
                          "calendar periods there)")
    t.timezone("timezone")
    budget = t.number("epsilon_per_period", above=0, at_most=MAX_EPSILON)
    anon = raw.get("anonymization", {}) if isinstance(raw.get("anonymization", {}), dict) else {}
    if anon.get("window_s") is None:
        raise ConfigError("anonymization.window_s: missing (dp.period needs the window length in seconds)")
    window_s = check_number(anon["window_s"], "anonymization.window_s", above=0, at_most=MAX_SECONDS)
    if PERIODS[period] % window_s:
        raise ConfigError(f"dp.period: a {period} must hold a whole number of windows of {window_s} s")
    misaligned = period_alignment_error(period, t.get("timezone"), window_s)
    if misaligned:
        raise ConfigError(misaligned)
    per = int(PERIODS[period] // window_s)
    if unit == "event":
        # every event is its own unit: the aggregator ignores the field; it stays set (the stream's unit field,
        # else the event time) so field projections that list it keep working
        if "unit_field" in t:
            raise ConfigError("dp.unit_field: not with dp.unit = 'event' (every event is its own unit)")
        unit_field = stream.get("privacy_unit")
        unit_field = unit_field if isinstance(unit_field, str) and unit_field else stream.get("event_time",
                                                                                                "event_time")
        if t.integer("max_windows_per_period", 1, per, 1) != 1:
            raise ConfigError("dp.max_windows_per_period: an event is in one window (omit it or set 1)")
        w_max = 1
    else:
        unit_field = t.text("unit_field", stream.get("privacy_unit"))
        if not isinstance(unit_field, str) or not unit_field:
            raise ConfigError(f"dp.unit_field: missing (the field identifying the {unit}; default "
                              f"stream.privacy_unit)")
        if "max_windows_per_period" not in t:
            raise ConfigError("dp.max_windows_per_period: missing (W: windows of a period one unit "
                              "contributes to; it sets the per-period sensitivity)")
        w_max = t.integer("max_windows_per_period", 1, per)
    return {"epsilon_budget": budget, "privacy_unit": unit_field, "unit": unit, "period": period,
            "timezone": t.get("timezone"), "max_windows_per_period": w_max, "window_s": float(window_s)}


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
