"""Calendar periods of the DP budget: which period a window belongs to (:class:`PeriodClock`), and whether every
period of a time zone starts on a window boundary (:func:`period_alignment_error`).

Windows are aligned to the UTC epoch (``window_start = index * window_s``) and a window belongs to the period
holding its start; a period is therefore the windows that start in it. docs/privacy.md (Differentially private
aggregates, Windows and periods across time zones) works an example through.
"""
from __future__ import annotations

import functools
import math
from datetime import datetime, timezone

PERIODS = {"hour": 3600, "day": 86400, "week": 7 * 86400}


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


# Window starts are multiples of window_s from the UTC epoch, a Thursday: a week's Monday 00:00 UTC lies this far
# into a span of whole weeks from the epoch; hours and days start at 0.
PERIOD_ANCHOR_S = {"hour": 0, "day": 0, "week": 4 * 86400}
ALIGNMENT_YEARS = (1990, 2100)       # the UTC offsets of a zone checked for period alignment: those in use then


@functools.lru_cache(maxsize=64)
def zone_offsets(tz: str) -> tuple[int, ...]:
    """The UTC offsets (seconds) ``tz`` uses from ``ALIGNMENT_YEARS[0]`` to ``ALIGNMENT_YEARS[1]``, sampled every
    week (an offset in force for less than a week is missed; standard and DST offsets last months)."""
    from datetime import timedelta
    from zoneinfo import ZoneInfo
    zone = ZoneInfo(tz)
    t, end = datetime(ALIGNMENT_YEARS[0], 1, 1, 12, tzinfo=timezone.utc), datetime(ALIGNMENT_YEARS[1], 1, 1,
                                                                                     tzinfo=timezone.utc)
    seen: set[int] = set()
    while t < end:
        offset = t.astimezone(zone).utcoffset()
        assert offset is not None           # an aware datetime's
        seen.add(int(offset.total_seconds()))
        t += timedelta(days=7)
    return tuple(sorted(seen))


def _clock(seconds: float, weekday: bool = False) -> str:
    """Time of day of ``seconds`` from the epoch; with ``weekday`` prefixed with the day of the week."""
    day = ("Thu ", "Fri ", "Sat ", "Sun ", "Mon ", "Tue ", "Wed ")[int(seconds // 86400) % 7] if weekday else ""
    seconds %= 86400
    return f"{day}{int(seconds // 3600):02d}:{int(seconds % 3600 // 60):02d}"


def _offset(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    return f"UTC{sign}{_clock(abs(seconds))}"


def period_alignment_error(period: str, tz: str, window_s: float) -> str | None:
    """Why the periods of ``period`` in ``tz`` do not start on window boundaries, in one line naming the keys;
    None when every period start in the zone is a window start. Windows are aligned to the UTC epoch and a window
    belongs to the period holding its start (:class:`PeriodClock`): a period starting inside a window would share
    that window with the period before, so one unit's events of one calendar period would be charged to two."""
    anchor, length = PERIOD_ANCHOR_S[period], PERIODS[period]
    offsets = zone_offsets(tz)
    bad = [o for o in offsets if (anchor - o) % window_s]
    if not bad:
        return None
    o = bad[0]
    boundary = (anchor - o) % length                       # a period's start, seconds into a span from the epoch
    start = boundary - boundary % window_s                 # the window holding it
    longest = math.gcd(length, *(int(anchor - x) for x in offsets))
    utc_ok = not anchor % window_s
    wd = period == "week"
    return (f"dp.timezone: {period}s (dp.period = \"{period}\") in {tz} ({', '.join(_offset(x) for x in offsets)}) "
            f"do not start on window boundaries (anonymization.window_s = {window_s:g} s, windows from "
            f"1970-01-01T00:00Z): the window {_clock(start, wd)}-{_clock(start + window_s, wd)} UTC is "
            f"{_clock(start + o, wd)}-{_clock(start + window_s + o, wd)} local ({_offset(o)}), astride two {period}s, "
            f"and would be charged to the {period} it starts in; choose a window_s that divides {longest} s"
            + (', or dp.timezone = "UTC"' if utc_ok else ""))
