"""The audit's own computation of every DP value a worker publishes: from the raw topic, the secret and the
config, the bounded true value of every cell (contribution bounding as docs/privacy.md states it) plus the noise
the secret determines. Nothing of :mod:`stream_anon.dp`, ``.engine`` or ``.kafka`` is imported: the TOML is read
here with tomllib (hierarchy files with the audit's own reader), windows are rebuilt by the watermark rule from the
raw topic in offset order, and the noise is drawn by diffprivlib's own mechanisms, value by value, from the generator
the secret seeds.

What it rebuilds, per partition (one lineage):

1. **Windows**: the events not dead-lettered, in offset order; an event is late (in no window) when its time is
   below the end of the last close (docs/privacy.md: a window closes when the watermark, the latest event time
   minus ``allowed_lateness_s``, reaches the next window holding events; the end of the stream closes the rest).
   Within a window, events in event-time order (ties: arrival; with a lateness, the audit token).
2. **Cells and bounds**, per aggregate and window: the ``where`` filter; the unit (none: left out); the cell of the
   configured domain (none: left out); the value (none, or not a finite number: left out); in period mode the unit's
   first ``W`` windows of the period; its first ``max_contributions`` events; values clamped and rounded to
   ``resolution``; summed per cell.
3. **Schedule**: every window from the start of ``dp.start``'s period; in period mode the bounded sums of a
   release's span (``release_every_windows`` from the period's start, and the period's last window).
4. **Noise**: the partition's seed ``HMAC(secret, "dp-noise:<stream>:<lineage>:<partition>")``, per release and
   component a generator seeded by ``HMAC(seed, "stream-anon/dp\\0<aggregate>\\0<component>\\0window\\0<release>")``,
   and diffprivlib's ``Geometric`` (integer values, in units of ``resolution``) or ``Snapping`` at the calibration
   the config implies (epsilon ``epsilon * m / W`` per release, split over components; sensitivity
   ``max_contributions * m`` times the value bound for a sum, ``m = min(release_every_windows, W)``). The running
   output of a per-window mechanism is the prefix sum of the noisy window values within the period.

What a worker publishes must equal this, row for row. Not recomputed (counted, never passed silently): rows of a
tree mechanism (``binary_tree``, ``hybrid``), a paid re-release (``<window>~<n>``), a partition whose rows state an
accepted settings change, and rows of a lineage that did not start at the partition's first event.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any, Iterable, cast

import numpy as np

from .primitives import Hierarchy, get_path, parse_time

PERIOD_SECONDS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
COMPONENTS = {"count": ("count",), "sum": ("sum",), "mean": ("sum", "count"), "histogram": ("count",),
              "ratio": ("numerator", "denominator")}
SNAP_BOUND = 2.0 ** 30        # the release path's Snapping bounds, in units of the sensitivity (docs/privacy.md)


@dataclass(frozen=True)
class GroupDef:
    """One group-by dimension: ``fields`` (the first non-null is the key's source), and either ``mapping`` (raw
    value -> domain label) or the UTC hour (``hour``)."""
    name: str
    fields: tuple[str, ...]
    hour: bool
    mapping: dict
    domain: tuple

    def key_of(self, event: dict):
        value = None
        for f in self.fields:
            value = get_path(event, f)
            if value is not None:
                break
        if value is None:
            return None
        if self.hour:
            if isinstance(value, bool):
                return None
            if isinstance(value, (int, float)):
                return datetime.fromtimestamp(value, timezone.utc).hour
            try:
                ts = datetime.fromisoformat(str(value))
            except ValueError:
                return None
            return None if ts.tzinfo is None else ts.astimezone(timezone.utc).hour
        try:
            return self.mapping.get(value)
        except TypeError:
            return None


@dataclass(frozen=True)
class AggregateDef:
    """One ``[[aggregates]]`` table as the recomputation needs it."""
    name: str
    kind: str
    epsilon: float
    max_contributions: int
    max_windows: int | None          # W (period mode), None in legacy mode
    release_every: int
    output: str
    mechanism: str
    noise: str                       # geometric or snapping
    groups: tuple[GroupDef, ...]
    value_field: str | None = None
    lower: float | None = None
    upper: float | None = None
    bins: tuple[float, ...] = ()
    numerator: tuple = ()
    where: tuple = ()
    resolution: float = 1.0

    @property
    def components(self) -> tuple[str, ...]:
        return COMPONENTS[self.kind]

    @property
    def value_bounds(self) -> tuple[float, float]:
        """(lower, upper) of a sum or a mean, which always has both (the audit's config reading, read_dp,
        requires them)."""
        assert self.lower is not None and self.upper is not None, f"{self.name}: no value bounds"
        return self.lower, self.upper

    def bin_labels(self) -> list[str]:
        e = self.bins
        fmt = lambda x: str(int(x)) if float(x).is_integer() else repr(float(x))      # noqa: E731
        return [f"[{fmt(e[i])},{fmt(e[i + 1])}{']' if i == len(e) - 2 else ')'}" for i in range(len(e) - 1)]

    def group_keys(self) -> list[str]:
        """Every cell's ``group_key``, the domain from the config alone."""
        keys: list[tuple] = [()]
        for g in self.groups:
            keys = [k + (v,) for k in keys for v in g.domain]
        if self.kind == "histogram":
            keys = [k + (b,) for k in keys for b in self.bin_labels()]
        return ["|".join(map(str, k)) for k in keys]


@dataclass
class DPValues:
    """The ``[dp]`` settings the recomputation needs, and each aggregate's definition."""
    stream: str
    unit_field: str | None           # None: every event is its own unit
    event_time: str
    window_s: float
    lateness: float
    period: str | None
    timezone: str
    start: float | None
    aggregates: dict[str, AggregateDef] = field(default_factory=dict)

    def period_bounds(self, w: int) -> tuple[str | None, int, int]:
        """(label, first window, windows) of the period holding window ``w`` (legacy mode: the window itself)."""
        if self.period is None:
            return None, w, 1
        from zoneinfo import ZoneInfo
        tz = ZoneInfo(self.timezone)
        local = datetime.fromtimestamp(w * self.window_s, tz)
        if self.period == "hour":
            start = local.replace(minute=0, second=0, microsecond=0)
            label, s, e = start.strftime("%Y-%m-%dT%H"), start.timestamp(), start.timestamp() + 3600
        else:
            day = local.replace(hour=0, minute=0, second=0, microsecond=0)
            if self.period == "week":
                day = day - timedelta(days=day.weekday())
            end = day + timedelta(days=7 if self.period == "week" else 1)
            label = day.strftime("%Y-%m-%d")
            s = day.replace(tzinfo=None).replace(tzinfo=tz).timestamp()
            e = end.replace(tzinfo=None).replace(tzinfo=tz).timestamp()
        first = math.ceil(s / self.window_s)
        return label, first, math.ceil(e / self.window_s) - first

    @property
    def start_window(self) -> int | None:
        if self.start is None:
            return None
        w = math.floor(self.start / self.window_s)
        return self.period_bounds(w)[1]


# -- reading the config --------------------------------------------------------------------------------------------
def read_dp_values(raw: dict, files) -> DPValues | None:
    """The recomputation's reading of a parsed stream TOML (None without ``[dp]``); ``files``: the config's
    directory (:func:`stream_anon.contract.config_dir`), where its hierarchy files lie."""
    dp = raw.get("dp")
    if not isinstance(dp, dict):
        return None
    stream, anon = raw.get("stream", {}), raw.get("anonymization", {})
    period_mode = "period" in dp or "unit" in dp or "epsilon_per_period" in dp
    event_unit = period_mode and dp.get("unit") == "event"
    tz = dp.get("timezone", "UTC")
    w_default = 1 if event_unit else dp.get("max_windows_per_period")
    values = DPValues(str(stream.get("name", "")), None if event_unit else dp.get("unit_field",
                                                                                   stream.get("privacy_unit")),
                      stream.get("event_time", "event_time"), float(anon.get("window_s", 900)),
                      float(stream.get("allowed_lateness_s", 0.0)), dp.get("period") if period_mode else None, tz,
                      _start(dp, raw, stream, tz))
    for a in raw.get("aggregates") or []:
        groups = tuple(_group(g, files, stream.get("event_time", "event_time")) for g in a.get("group_by") or [])
        kind = a["kind"]
        bins = tuple(float(x) for x in a.get("bins", ()))
        noise = "snapping" if a.get("noise") in ("snapping", "laplace") else "geometric"
        lower = bins[0] if kind == "histogram" else a.get("lower")
        upper = bins[-1] if kind == "histogram" else a.get("upper")
        w = a.get("max_windows_per_period", w_default) if period_mode else None
        values.aggregates[a["name"]] = AggregateDef(
            a["name"], kind, float(a["epsilon"]), int(a["max_contributions"]), None if w is None else int(w),
            int(a.get("release_every_windows", 1)), a.get("output", "per_window"), a.get("mechanism", "auto"),
            noise, groups, a.get("value"), None if lower is None else float(lower),
            None if upper is None else float(upper), bins, tuple(a.get("numerator_values", ())),
            tuple((k, tuple(v)) for k, v in (a.get("where") or {}).items()),
            float(a.get("resolution", 1.0)) if kind in ("sum", "mean") else 1.0)
    return values


def _start(dp: dict, raw: dict, stream: dict, tz: str) -> float | None:
    """``dp.start`` (a date or time; without offset, in the zone), else the event time's declared lower bound."""
    from zoneinfo import ZoneInfo
    value = dp.get("start")
    if value is None:
        for q in raw.get("quasi_identifiers") or ():
            fields = q.get("field")
            fields = [fields] if isinstance(fields, str) else list(fields or ())
            if q.get("kind") == "timestamp" and stream.get("event_time", "event_time") in fields and \
                    q.get("lower") is not None:
                value = q["lower"]
                break
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=ZoneInfo(tz))
    return value.timestamp()


def _group(g: dict, files, event_time: str) -> GroupDef:
    fields = g.get("field", event_time if g.get("kind") == "hour" else None)
    # a list of fields in a valid config (None raises, as ever)
    fields = (fields,) if isinstance(fields, str) else tuple(cast(Iterable[str], fields))
    kind = g.get("kind") or ("hierarchy" if "hierarchy" in g else "values")
    if kind == "hour":
        return GroupDef(g["name"], fields, True, {}, tuple(range(24)))
    if kind == "values":
        return GroupDef(g["name"], fields, False, {v: v for v in g["values"]}, tuple(g["values"]))
    path = files.file(g["hierarchy"], f"aggregates.group_by.{g['name']}.hierarchy")
    h = Hierarchy.load(path)
    level = g.get("level", 0)
    if isinstance(level, str):
        levels = list(json.loads(path.read_text()).get("levels", [])) if path.suffix == ".json" else []
        level = levels.index(level)
    parents = set(h.parent.values())
    mapping, domain = {}, []
    for label in h.parent:                        # the file's order: leaves depth-first
        if label in parents:
            continue
        chain = h.ancestors_or_self(label)
        mapping[label] = chain[level]
        if chain[level] not in domain:
            domain.append(chain[level])
    return GroupDef(g["name"], fields, False, mapping, tuple(domain))


# -- windows -------------------------------------------------------------------------------------------------------
def event_seconds(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    t = parse_time(value)
    return None if t is None else t.timestamp()


def partition_windows(events: list, dpv: DPValues) -> tuple[dict[int, list], int]:
    """(window -> its events in the window's order, late events) of one partition's accepted events, given as
    ``(offset, event, token)`` in offset order (module docstring, step 1)."""
    ws, lateness = dpv.window_s, dpv.lateness
    open_w: dict[int, list] = {}
    keys: list[int] = []
    closed: dict[int, list] = {}
    closed_until, latest, late = -math.inf, -math.inf, 0
    for order, (_, event, token) in enumerate(events):
        t = event_seconds(get_path(event, dpv.event_time))
        if t is None:
            continue
        if t < closed_until:
            late += 1
            continue
        w = math.floor(t / ws)
        if w not in open_w:
            open_w[w] = []
            keys.append(w)
            keys.sort()
        open_w[w].append((t, token if lateness > 0 else order, event))
        latest = max(latest, t)
        c = math.floor((latest - lateness) / ws)
        while len(keys) >= 2 and keys[1] <= c:
            w0 = keys.pop(0)
            closed[w0] = open_w.pop(w0)
            closed_until = max(closed_until, keys[0] * ws)
    for w0 in keys:
        closed[w0] = open_w.pop(w0)
    return {w: [e for _, _, e in sorted(evs, key=lambda x: (x[0], x[1]))] for w, evs in closed.items()}, late


# -- bounded true values -------------------------------------------------------------------------------------------
def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def bounded_values(spec: AggregateDef, events: list, unit_field: str | None, used: dict[object, int],
                   cap: int | None) -> dict[str, dict[str, float]]:
    """Component -> group_key -> bounded true value of one window (step 2); ``used``: unit -> windows used in the
    period (updated), ``cap``: W (None: no window cap)."""
    cand: list[tuple[object, tuple, Any]] = []      # (unit, group key, raw value)
    for e in events:
        if any(get_path(e, k) not in allowed for k, allowed in spec.where):
            continue
        unit = get_path(e, unit_field) if unit_field is not None else object()
        if unit is None:
            continue
        key = tuple(g.key_of(e) for g in spec.groups)
        if None in key:
            continue
        v = get_path(e, spec.value_field) if spec.value_field else None
        if spec.value_field is not None:
            if v is None or (spec.kind != "ratio" and _number(v) is None):
                continue
        cand.append((unit if unit_field is None else str(unit), key, v))
    if cap is not None and unit_field is not None:
        admitted = {}
        for unit, _, _ in cand:
            if unit not in admitted:
                n = used.get(unit, 0)
                admitted[unit] = n < cap
                if n < cap:
                    used[unit] = n + 1
        cand = [c for c in cand if admitted[c[0]]]
    kept: dict[object, int] = {}
    out: dict[str, dict[str, float]] = {c: {} for c in spec.components}
    labels = spec.bin_labels() if spec.kind == "histogram" else None
    for unit, key, v in cand:
        kept[unit] = kept.get(unit, 0) + 1
        if kept[unit] > spec.max_contributions:
            continue
        if labels is not None:
            nb = len(labels)
            b = min(max(int(np.searchsorted(spec.bins, float(v), side="right")) - 1, 0), nb - 1)
            key = key + (labels[b],)
        gk = "|".join(map(str, key))
        if spec.kind in ("count", "histogram"):
            _add(out["count"], gk, 1.0)
        elif spec.kind in ("sum", "mean"):
            lower, upper = spec.value_bounds
            x = min(max(float(v), lower), upper)
            _add(out["sum"], gk, round(x / spec.resolution) * spec.resolution)
            if spec.kind == "mean":
                _add(out["count"], gk, 1.0)
        else:
            _add(out["numerator"], gk, 1.0 if v in spec.numerator else 0.0)
            _add(out["denominator"], gk, 1.0)
    return out


def _add(d: dict, k: str, v: float) -> None:
    d[k] = d.get(k, 0.0) + v


# -- noise ---------------------------------------------------------------------------------------------------------
def noise_seed(secret: bytes, stream: str, partition: int, lineage: str | None) -> bytes:
    where = f"{stream}:{partition}" if lineage is None else f"{stream}:{lineage}:{partition}"
    return hmac.new(secret, f"dp-noise:{where}".encode(), hashlib.sha256).digest()


def calibration(spec: AggregateDef, period_mode: bool) -> tuple[float, int]:
    """(epsilon per component of one release, windows of one unit a release can hold: ``m``)."""
    if not period_mode:
        return spec.epsilon / len(spec.components), 1
    assert spec.max_windows is not None         # period mode: W is set (read_dp requires it)
    m = min(spec.release_every, spec.max_windows)
    return spec.epsilon * m / spec.max_windows / len(spec.components), m


def noisy(seed: bytes, spec: AggregateDef, component: str, release: str, x: np.ndarray, epsilon: float,
          m: int) -> np.ndarray:
    """The per-window noisy values of one component of one release (step 4), drawn by diffprivlib one by one."""
    from diffprivlib.mechanisms import Geometric, Snapping
    digest = hmac.new(seed, b"stream-anon/dp\x00" + "\x00".join([spec.name, component, "window", release]).encode(),
                      hashlib.sha256).digest()
    rs = np.random.RandomState(np.frombuffer(digest, dtype=np.uint32))
    sens = spec.max_contributions * m * (max(map(abs, spec.value_bounds)) if component == "sum" else 1.0)
    res = spec.resolution if component == "sum" else 1.0
    if spec.noise == "snapping":
        mech = Snapping(epsilon=epsilon, sensitivity=float(sens), lower=-SNAP_BOUND * sens, upper=SNAP_BOUND * sens,
                        random_state=rs)
        return np.array([mech.randomise(float(v)) for v in x], dtype=float)
    mech = Geometric(epsilon=epsilon, sensitivity=int(round(sens / res)), random_state=rs)
    draws = np.array([float(mech.randomise(0)) for _ in range(len(x))])
    if res != 1.0:
        return (np.round(x / res) + draws) * res
    return x + draws
