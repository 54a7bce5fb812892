"""Settings suggested from a sample of the user's stream (``stream-anon calibrate --suggest``), each with the
figures it comes from:

- ``resolutions`` of an H3 geopoint: the coarsest resolution whose average cell is at most ``area_share`` of the
  sample's bounding-box area (a class generalized to a coarser cell would cover most of the domain and say
  nothing); the finest stays as configured.
- ``window_s`` (and ``max_delay_s`` = ``window_s``): the shortest of the candidate windows in which at least
  ``units_factor * k`` distinct privacy units occur in 9 windows of 10 (the 10th percentile over the sample's
  windows), so a window can form classes of k distinct individuals without suppressing most of it.
- ``allowed_lateness_s``: the 99th percentile of the arrival lag in the sample's order (how far an event's time is
  behind the largest event time read before it), rounded up to a minute: events later than that are deferred or
  dead-lettered as late.

The sample is read in the order the stream would deliver it (the file's order for replay).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

WINDOWS_S = (300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


@dataclass
class Suggestion:
    key: str                 # where it goes, e.g. "quasi_identifiers.position.resolutions"
    value: object
    current: object
    figures: str             # what it was derived from


def suggest(config, events: list[dict], area_share: float = 0.02, units_factor: float = 2.0) -> list[Suggestion]:
    from stream_anon.engine import get_path
    from stream_anon.engine.space import parse_time

    out: list[Suggestion] = []
    times = np.array([_t(parse_time, get_path(e, config.stream.event_time)) for e in events], dtype=float)
    units = [get_path(e, config.stream.privacy_unit) for e in events]
    for q in config.quasi_identifiers:
        if getattr(q, "h3", None):
            s = _h3(q, events, get_path, area_share)
            if s is not None:
                out.append(s)
    ok = np.isfinite(times)
    if ok.sum() >= 2:
        out += _windows(config, times[ok], [u for u, g in zip(units, ok) if g], units_factor)
        out.append(_lateness(config, times[ok]))
    return out


def _t(parse, v):
    try:
        x = parse(v)
    except (TypeError, ValueError):
        return math.nan
    return math.nan if x is None else float(x)


def _h3(q, events, get_path, area_share: float) -> Suggestion | None:
    import h3

    lat_f, lon_f = q.fields
    pts = [(get_path(e, lat_f), get_path(e, lon_f)) for e in events]
    pts = [(float(a), float(b)) for a, b in pts if isinstance(a, (int, float)) and isinstance(b, (int, float))]
    if len(pts) < 2:
        return None
    lats, lons = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    lat_lo, lat_hi = np.percentile(lats, [0.5, 99.5])      # the domain where the events are, not its outliers
    lon_lo, lon_hi = np.percentile(lons, [0.5, 99.5])
    km_lat = 111.32
    km_lon = 111.32 * math.cos(math.radians((lat_lo + lat_hi) / 2))
    area = max((lat_hi - lat_lo) * km_lat * (lon_hi - lon_lo) * km_lon, 1e-6)
    finest = q.h3[1]
    coarsest = next((r for r in range(0, finest + 1) if h3.average_hexagon_area(r, "km^2") <= area_share * area),
                    finest)
    cell = h3.average_hexagon_area(coarsest, "km^2")
    return Suggestion(f"quasi_identifiers.{q.name}.resolutions", [coarsest, finest], list(q.h3),
                      f"domain {area:.1f} km2 (99% of the sample's points); resolution {coarsest} cells average "
                      f"{cell:.3g} km2 <= {area_share:.0%} of it; resolution {max(coarsest - 1, 0)}: "
                      f"{h3.average_hexagon_area(max(coarsest - 1, 0), 'km^2'):.3g} km2")


def _windows(config, times: np.ndarray, units: list, units_factor: float) -> list[Suggestion]:
    k = config.anonymization.k
    need = units_factor * k
    codes = {u: i for i, u in enumerate(dict.fromkeys(units))}
    uid = np.array([codes[u] for u in units])
    span = times.max() - times.min()
    per_unit_h = len(times) / max(len(codes), 1) / max(span / 3600, 1e-9)
    candidates = [w for w in WINDOWS_S if w < span] + [next((w for w in WINDOWS_S if w >= span), WINDOWS_S[-1])]
    chosen, p10 = candidates[-1], 0.0       # none reaches the target: the window that spans the sample
    for w in candidates:
        slot = ((times - times.min()) // w).astype(np.int64)
        distinct = np.unique(np.stack([slot, uid]), axis=1)[0]
        counts = np.bincount(distinct)
        counts = counts[counts > 0]
        p10 = float(np.percentile(counts, 10)) if len(counts) else 0.0
        if p10 >= need:
            chosen = w
            break
    figures = (f"{len(codes)} units, {per_unit_h:.2f} events per unit and hour over {span / 3600:.1f} h; with "
               f"window_s = {chosen}, 9 windows of 10 hold >= {p10:.0f} distinct units (target {need:g} = "
               f"{units_factor:g} x k)")
    return [Suggestion("anonymization.window_s", chosen, config.anonymization.window_s, figures),
            Suggestion("anonymization.max_delay_s", chosen, config.anonymization.max_delay_s,
                       "a window closes at most one window length after its end")]


def _lateness(config, times: np.ndarray) -> Suggestion:
    ahead = np.maximum.accumulate(times)
    lag = ahead - times
    p99 = float(np.percentile(lag, 99))
    value = int(math.ceil(p99 / 60.0) * 60)
    current = config.stream.allowed_lateness_s
    late_now = float(np.mean(lag > current)) if len(lag) else 0.0
    return Suggestion("stream.allowed_lateness_s", value, current,
                      f"arrival lag p50 {np.percentile(lag, 50):.0f} s, p99 {p99:.0f} s, max {lag.max():.0f} s; "
                      f"{late_now:.1%} of the sample arrives later than the current {current:g} s, "
                      f"{float(np.mean(lag > value)):.1%} later than {value} s")


def apply(raw: dict, suggestions: list[Suggestion]) -> dict:
    """The configuration document with the suggestions written in."""
    for s in suggestions:
        parts = s.key.split(".")
        if parts[0] == "quasi_identifiers":
            for q in raw.get("quasi_identifiers", []):
                if q.get("name") == parts[1]:
                    q[parts[2]] = s.value
        else:
            raw.setdefault(parts[0], {})[parts[1]] = s.value
    return raw
