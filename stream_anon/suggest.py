"""Settings suggested from a sample of the user's stream (``stream-anon calibrate --suggest``), each with the
figures it comes from. First in closed form (:func:`closed_form`), the starting point of the search:

- ``resolutions`` of an H3 geopoint: the coarsest resolution whose cells stand for less than the whole domain
  (the configured bounds, which ``calibrate`` takes from the sample) in the engine's NCP: a coarser cell is worth
  no more than the whole domain (NCP 1) yet shows an area larger than the stream covers. The finest stays as
  configured. No finer: a finer coarsest resolution turns the classes whose members share no such cell into the
  whole domain (Mondrian does not form its classes along cells), which only raises NCP. It is also the start
  resolution of ``strategy = "h3-mondrian"``, which forms classes along cells (docs/h3-positions.md).
- ``window_s`` (and ``max_delay_s`` = ``window_s``): the shortest of the candidate windows in which at least
  ``units_factor * k`` distinct privacy units occur in 9 windows of 10 (the 10th percentile over the sample's
  windows), so a window can form classes of k distinct individuals without suppressing most of it.
- ``allowed_lateness_s``: the 99th percentile of the arrival lag in the sample's order (how far an event's time is
  behind the largest event time read before it), rounded up to a minute: an event later than that whose window
  is already released is late (published under an earlier class that covers it, or suppressed as ``late``).

The sample is read in the order the stream would deliver it (the file's order for replay). When more than
:data:`OUT_OF_ORDER_SHARE` of it arrives later than the current ``allowed_lateness_s``, the sample is not in
event-time order (e.g. a CSV export sorted by vehicle, not by time): the lateness suggestion then carries a
warning saying so, with the measured share and what to do (sort the file by event time before replaying it, or
raise the lateness if the stream really delivers its events that late), since the search cannot fix an order.

These figures say where to look, not what is best: :func:`suggest` then runs a small grid of candidates around
them and the current settings through the engine on the sample (:mod:`stream_anon.suggest_search`) and suggests
the one with the lowest NCP whose suppression, late events and dead letters are no higher than the current
settings'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stream_anon.suggest_search import apply_settings, event_time, search

WINDOWS_S = (300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)
# more of the sample than this arriving later than the current lateness: an order problem, not a few stragglers
OUT_OF_ORDER_SHARE = 0.25


@dataclass
class Suggestion:
    key: str                 # where it goes, e.g. "quasi_identifiers.position.resolutions"
    value: object
    current: object
    figures: str             # what it was derived from
    closed_form: object = None   # the closed-form value, when the search chose ``value`` from candidates
    warning: str | None = None   # what the sample shows that no setting of the search fixes (its order)


def suggest(config, events: list[dict], units_factor: float = 2.0, **search_kw):
    """(suggestions, :class:`stream_anon.suggest_search.SearchResult`): the closed-form figures, then the search
    around them (``search_kw``: of :func:`stream_anon.suggest_search.search`); each suggestion's value is the
    searched one, its figures say both."""
    start = closed_form(config, events, units_factor)
    result = search(config, events, {s.key: s.value for s in start}, **search_kw)
    out = []
    for s in start:
        value = result.chosen.get(s.key, s.value)
        verdict = ("see the warning: the sample is out of event-time order" if s.warning else
                   "the search keeps the current value" if value == s.current else
                   "the search agrees" if value == s.value else f"the search chose {value}")
        out.append(Suggestion(s.key, value, result.current.get(s.key, s.current),
                              f"closed form {s.value}: {s.figures}; {verdict}", closed_form=s.value,
                              warning=s.warning))
    known = {s.key for s in start}
    out += [Suggestion(key, value, result.current.get(key), "chosen by the search (no closed form)")
            for key, value in result.chosen.items() if key not in known and value != result.current.get(key)]
    return out, result


def closed_form(config, events: list[dict], units_factor: float = 2.0) -> list[Suggestion]:
    """The closed-form suggestions of the module docstring (no engine run)."""
    from stream_anon.engine import get_path

    out: list[Suggestion] = []
    times = np.array([event_time(get_path(e, config.stream.event_time)) for e in events], dtype=float)
    units = [get_path(e, config.stream.privacy_unit) for e in events]
    for q in config.quasi_identifiers:
        if getattr(q, "h3", None):
            out.append(_h3(q))
    ok = np.isfinite(times)
    if ok.sum() >= 2:
        out += _windows(config, times[ok], [u for u, g in zip(units, ok) if g], units_factor)
        out.append(_lateness(config, times[ok]))
    return out


def _h3(q) -> Suggestion:
    """The coarsest resolution whose cells stand for less than the whole domain in the engine's NCP (``h3_ncp``:
    (7^(rmax - r) - 1) / (N - 1) below 1, N the domain's finest cells): a coarser cell is no more use than the
    whole domain ("*", NCP 1) yet shows an area larger than the stream covers."""
    import h3

    from stream_anon.engine.space import h3_domain_cells

    finest = q.h3[1]
    n_cells = h3_domain_cells(tuple(q.lower), tuple(q.upper), finest)
    coarsest = next(r for r in range(0, finest + 1) if 7.0 ** (finest - r) - 1.0 < n_cells - 1.0)
    lat_km = (q.upper[0] - q.lower[0]) * 111.32
    area = lat_km * (q.upper[1] - q.lower[1]) * 111.32 * math.cos(math.radians((q.lower[0] + q.upper[0]) / 2))
    coarser = f"resolution {coarsest - 1}: {h3.average_hexagon_area(coarsest - 1, 'km^2'):.3g} km2, " \
              f"NCP 1" if coarsest > 0 else "no coarser resolution"
    return Suggestion(f"quasi_identifiers.{q.name}.resolutions", [coarsest, finest], list(q.h3),
                      f"domain {area:.1f} km2 (the configured bounds), {n_cells} cells of resolution {finest}; "
                      f"resolution {coarsest} cells average {h3.average_hexagon_area(coarsest, 'km^2'):.3g} km2, "
                      f"NCP {(7.0 ** (finest - coarsest) - 1) / (n_cells - 1):.3f}; {coarser}")


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
    warning = None
    if late_now > OUT_OF_ORDER_SHARE:
        warning = (f"the sample is not in event-time order: {late_now:.1%} of its events arrive later than the "
                   f"current allowed_lateness_s = {current:g} s behind an event read before them (arrival lag p50 "
                   f"{np.percentile(lag, 50):.0f} s): late events, published under an earlier class only where one "
                   "covers them, else suppressed. Sort the file by event time before replaying it; only if the "
                   "stream really delivers its events this late, raise stream.allowed_lateness_s (to "
                   f"{value} s for 99% of them)")
    return Suggestion("stream.allowed_lateness_s", value, current,
                      f"arrival lag p50 {np.percentile(lag, 50):.0f} s, p99 {p99:.0f} s, max {lag.max():.0f} s; "
                      f"{late_now:.1%} of the sample arrives later than the current {current:g} s, "
                      f"{float(np.mean(lag > value)):.1%} later than {value} s", warning=warning)


def apply(raw: dict, suggestions: list[Suggestion]) -> dict:
    """The configuration document with the suggestions written in."""
    return apply_settings(raw, {s.key: s.value for s in suggestions})


def search_report(suggestions: list[Suggestion], result) -> list[str]:
    """The lines ``calibrate --suggest`` prints: every candidate with its figures, the suggestions, the held-out
    comparison and what a longer latency would buy."""
    t, h = result.train, result.held_out
    lines = [f"search: {len(result.candidates)} runs of the engine on the sample's {t['events']} events up to "
             f"{t['to_time']} (strategies on {t['strategy_events']} of them), max_delay_s at most "
             f"{result.max_delay_limit_s:g}, in {result.runtime_s:g} s:"]
    for c in result.candidates:
        mark = " <- current" if c.settings == result.current else " <- suggested" if c.settings == result.chosen \
            else ""
        lines.append(f"  [{c.part}] {c.label()}: {c.figures.brief() if c.figures else c.error}{mark}")
    lines += [f"suggest {s.key} = {s.value} (now {s.current}): {s.figures}" for s in suggestions]
    if "current" in h:
        lines.append(f"held out ({h['events']} events from {h['from_time']}): current {h['current'].brief()}; "
                     f"suggested {h['chosen'].brief()}")
    b = result.beyond_limit
    if b is not None and b.figures is not None:
        lines.append(f"beyond the latency limit: window_s {b.settings['anonymization.window_s']}, max_delay_s "
                     f"{b.settings['anonymization.max_delay_s']}: {b.figures.brief()} (--max-delay-limit-s allows "
                     "it; never suggested without)")
    lines += [f"note: {n}" for n in result.notes]
    # last, where a terminal leaves it in view after the candidates
    return lines + [f"warning: {s.warning}" for s in suggestions if s.warning]
