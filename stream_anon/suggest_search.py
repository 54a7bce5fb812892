"""The search behind ``stream-anon calibrate --suggest``: candidate settings run through the engine on the sample.

The closed-form figures of :mod:`stream_anon.suggest` (coarsest H3 resolution for the domain, window for 2k units,
lateness from the p99 arrival lag) only say where to look: a window long enough for 2k units still publishes
wide classes when the units rarely overlap, a coarsest H3 resolution finer than needed turns every class whose
members share no such cell into the whole domain (NCP 1), and how a window's records are grouped (the strategy)
often matters more than either. So, as ARX searches a generalization lattice with a utility metric, a small grid
of candidates around them is run through the engine (library API, one partition, no Kafka) and the candidate with
the lowest NCP is kept whose suppressed events, late events suppressed and dead letters are no more than the
current settings' on the same events:

- the sample is cut by event time: the earlier ``train_share`` chooses (capped to its first ``max_events``
  events), the later part is held out and reports the chosen settings against the current ones (a deployment
  runs the settings on the stream that follows its sample);
- ``strategy`` in :data:`STRATEGY_CANDIDATES` (those that need no parameters; with an H3 geopoint also
  ``h3-mondrian``, which forms classes along the cells), judged on runs of consecutive
  windows spread over the choosing part (a lattice search per window makes some strategies costly), then
  confirmed on the whole part;
- ``window_s`` x ``max_delay_s``: windows of :data:`WINDOW_LADDER` from half the shorter of the current and the
  closed-form window up to ``max_delay_limit_s``, plus those two; ``max_delay_s`` = the window or the limit. The
  limit defaults to the current ``max_delay_s``: the latency the stream promises (a record is published or
  suppressed within it), which the search never weakens unless told to. What twice the window and the limit
  would give is reported, never chosen;
- ``allowed_lateness_s`` in {current, closed form}; the coarsest H3 resolution in {current, closed form}, taken
  at equal NCP too (it publishes no cell larger than the domain);
- the stages repeat once when they changed something (coordinate descent: a strategy may favour another window).

Every figure is measured with the current config's quasi-identifier bounds, finest H3 resolution and k, so NCP is
one yardstick for every candidate. Deterministic: the engine's randomness comes from the config's seed, the audit
tokens from a fixed secret; the cut, the runs of windows and the grid from the sample alone.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import cast

import numpy as np

# windows a search may try (seconds): the usual divisors of a day and week, and a few multiples between them
WINDOW_LADDER = (300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200, 10800, 14400, 21600, 28800, 43200, 64800,
                 86400, 129600, 172800, 259200, 345600, 432000, 604800)
SECRET = b"stream-anon calibrate search"      # audit tokens only (never published): fixed for determinism
WINDOW = "anonymization.window_s"
MAX_DELAY = "anonymization.max_delay_s"
LATENESS = "stream.allowed_lateness_s"
STRATEGY = "anonymization.strategy"
STRATEGY_PARAMS = "anonymization.strategy_params"
# strategies that need no parameters of their own (the others name a sensitive field and its rules)
STRATEGY_CANDIDATES = ("mondrian", "heuristicmin", "utility-clustering")


@dataclass
class Figures:
    """What the engine did with one candidate's settings on a set of events (flushed at the end)."""
    events: int
    ncp: float | None             # mean over published and suppressed events (a suppressed event counts 1)
    suppression: float | None     # suppressed / (published + suppressed)
    published: int
    suppressed: int
    suppressed_by_reason: dict
    late: int                     # events for an already released window (published under an earlier class or
    late_suppressed: int          # suppressed as late)
    deferred: int                 # events a release left waiting at least once
    dead_letters: int             # events the engine rejected (duplicates, future_event_time, bad values)
    releases: int
    runtime_s: float
    # the release-delta attack's smallest candidate set: the fewest individuals a class gains in one release
    # (stream_anon.attacks.release_delta); below k a reader of the releases in order singles someone out
    min_candidates: int | None = None

    def brief(self) -> str:
        return (f"NCP {_f(self.ncp)}, suppressed {_pct(self.suppression)} ({self.suppressed}), late "
                f"{self.late} ({self.late_suppressed} suppressed), deferred {self.deferred}, dead letters "
                f"{self.dead_letters}, smallest candidate set {self.min_candidates}")


@dataclass
class Candidate:
    settings: dict                # key -> value, keys as in stream_anon.suggest.Suggestion
    part: str = "train"           # the events it ran on: "train" (the choosing part) or "strategy@<window_s>"
    figures: Figures | None = None    # (runs of its windows, :func:`spread_windows`)
    error: str | None = None      # the settings do not validate

    def label(self) -> str:
        return ", ".join(f"{k.split('.')[-1] if not k.startswith('quasi') else k.split('.')[1]}={v}"
                         for k, v in self.settings.items())


@dataclass
class SearchResult:
    current: dict                 # the current settings of every searched key
    chosen: dict
    candidates: list[Candidate]   # in the order run
    train: dict                   # the choosing part: events, to_time (the cut), strategy_events
    held_out: dict                # the held-out part: events, from_time, and "current", "chosen" Figures
    runtime_s: float
    notes: list[str] = field(default_factory=list)
    max_delay_limit_s: float | None = None
    beyond_limit: Candidate | None = None     # twice the chosen window and the limit: what latency would buy
    cpu_s: float | None = None                # CPU time of the search (runtime_s is wall time)

    def figures(self, settings: dict, part: str = "train") -> Figures | None:
        return next((c.figures for c in self.candidates if c.settings == settings and c.part == part), None)

    def to_dict(self) -> dict:
        return {"current": self.current, "chosen": self.chosen, "max_delay_limit_s": self.max_delay_limit_s,
                "train": self.train,
                "held_out": {k: (asdict(v) if isinstance(v, Figures) else v) for k, v in self.held_out.items()},
                "candidates": [{"settings": c.settings, "part": c.part, "error": c.error,
                                "figures": asdict(c.figures) if c.figures else None} for c in self.candidates],
                "beyond_limit": self.beyond_limit.settings if self.beyond_limit else None,
                "runtime_s": self.runtime_s, "cpu_s": self.cpu_s, "notes": self.notes}


def event_time(v) -> float:
    """Epoch seconds of an event time, NaN when unreadable."""
    from stream_anon.engine.space import parse_time
    try:
        x = parse_time(v)
    except (TypeError, ValueError):
        return math.nan
    return math.nan if x is None else float(x)


def apply_settings(raw: dict, settings: dict) -> dict:
    """The configuration document with ``settings`` (key of :class:`stream_anon.suggest.Suggestion` -> value)
    written in."""
    for key, value in settings.items():
        parts = key.split(".")
        if parts[0] == "quasi_identifiers":
            tables = [q for q in raw.get("quasi_identifiers", []) if q.get("name") == parts[1]]
        else:
            tables = [raw.setdefault(parts[0], {})]
        for t in tables:
            if value is None:           # None removes the key (another strategy's parameters)
                t.pop(parts[-1], None)
            else:
                t[parts[-1]] = value
    return raw


def with_settings(config, settings: dict):
    """A copy of ``config`` with the settings written in (keys of :class:`stream_anon.suggest.Suggestion`),
    re-validated (ConfigError when they do not validate)."""
    from pathlib import Path

    from stream_anon.config import parse_config

    raw = apply_settings(copy.deepcopy(config.raw), settings)
    return parse_config(raw, base_dir=config.source.parent if config.source else Path("."), source=config.source)


def run_settings(config, events: list[dict]) -> Figures:
    """Run the engine (one partition) over ``events`` in their order, flush, and count where every event went."""
    from stream_anon.engine import Engine
    from stream_anon.engine.decide import LATE

    engine = Engine(config, partition=0, secret=SECRET)
    t0 = time.perf_counter()
    res = engine.process(events)
    res.extend(engine.flush())
    runtime = time.perf_counter() - t0
    by_reason: dict[str, int] = {}
    ncp_sum, published, late, deferred = 0.0, 0, 0, set()
    entries = [c.individuals for rel in res.releases for c in rel.classes]
    for rel in res.releases:
        real = rel.record_ncp if rel.record_counterfeit is None else rel.record_ncp[~rel.record_counterfeit]
        ncp_sum += float(real.sum())
        published += len(real)
        for reason, tokens in rel.suppressed_tokens.items():
            by_reason[reason] = by_reason.get(reason, 0) + len(tokens)
        late += rel.late
        deferred.update(rel.deferred_tokens)
    suppressed = sum(by_reason.values())
    n = published + suppressed
    return Figures(events=len(events), ncp=(ncp_sum + suppressed) / n if n else None,
                   suppression=suppressed / n if n else None, published=published, suppressed=suppressed,
                   suppressed_by_reason=dict(sorted(by_reason.items())), late=late,
                   late_suppressed=by_reason.get(LATE, 0), deferred=len(deferred), dead_letters=len(res.rejected),
                   releases=len(res.releases), runtime_s=round(runtime, 3),
                   min_candidates=min(entries, default=None))


def split_by_time(config, events: list[dict], train_share: float) -> tuple[list[dict], list[dict], float]:
    """(earlier events, later events, cut): the cut is the ``train_share`` quantile of the event times; each part
    keeps the sample's order. Events without a readable time go with the earlier part (the engine rejects them)."""
    from stream_anon.engine import get_path

    times = np.array([event_time(get_path(e, config.stream.event_time)) for e in events], dtype=float)
    known = times[np.isfinite(times)]
    if len(known) < 2:
        return list(events), [], math.nan
    cut = float(np.quantile(known, train_share, method="lower"))
    later = np.isfinite(times) & (times > cut)
    return [e for e, x in zip(events, later) if not x], [e for e, x in zip(events, later) if x], cut


def window_candidates(current_w: float, current_d: float, closed_w: float | None, limit: float) -> list[tuple]:
    """(window_s, max_delay_s) pairs of the search (module docstring), current first."""
    lo = min(current_w, closed_w or current_w) / 2
    windows = {w for w in WINDOW_LADDER if lo <= w <= limit} | {current_w}
    if closed_w is not None and closed_w <= limit:
        windows.add(closed_w)
    pairs = [(current_w, current_d)]
    for w in sorted(windows):
        for d in sorted({w, limit}):
            if (w, d) not in pairs and w <= d <= limit:
                pairs.append((w, d))
    return pairs


def _admissible(f: Figures, base: Figures, k: int) -> bool:
    """No more suppression, late events suppressed or dead letters than the current settings on the same events,
    and no class gaining fewer than ``k`` individuals in a release (the release-delta attack's floor)."""
    return (f.ncp is not None and f.suppressed <= base.suppressed and f.late_suppressed <= base.late_suppressed
            and f.dead_letters <= base.dead_letters and (f.min_candidates is None or f.min_candidates >= k))


def spread_windows(config, events: list[dict], window_s: float, max_delay_s: float, count: int,
                   small: int = 2000) -> list[dict]:
    """The events of about ``count`` of the windows (of ``window_s``) that ``events`` occupy, in runs of
    consecutive windows spread evenly over them (a run spans ``max_delay_s``, so a record can wait for its class
    as in the whole stream), in the sample's order; all events when they occupy no more than ``count`` windows
    or are no more than ``small``."""
    from stream_anon.engine import event_windows, get_path

    times = np.array([event_time(get_path(e, config.stream.event_time)) for e in events], dtype=float)
    known = np.isfinite(times)
    wins = np.where(known, event_windows(np.where(known, times, 0.0), window_s), np.iinfo(np.int64).min)
    occupied = np.unique(wins[known])
    if len(occupied) <= count or len(events) <= small:
        return list(events)
    run = min(count, int(math.ceil(max_delay_s / window_s)) + 1)
    starts = np.linspace(0, len(occupied) - run, max(1, count // run)).round().astype(int)
    keep = {int(w) for s in starts.tolist() for w in occupied[s:s + run]}
    return [e for e, w in zip(events, wins.tolist()) if w in keep]


class _Runs:
    """Candidates run so far, by (settings, part): every candidate is judged against the current settings on the
    same events."""

    def __init__(self, config, parts: dict[str, list[dict]], progress):
        self.config, self.parts, self.progress = config, parts, progress
        self.done: list[Candidate] = []

    def __call__(self, settings: dict, part: str) -> Candidate:
        from stream_anon.config import ConfigError

        for c in self.done:
            if c.settings == settings and c.part == part:
                return c
        cand = Candidate(dict(settings), part=part)
        try:
            cand.figures = run_settings(with_settings(self.config, settings), self.parts[part])
        except (ConfigError, ValueError) as exc:
            cand.error = str(exc)
        self.done.append(cand)
        if self.progress:
            self.progress(cand)
        return cand


def search(config, events: list[dict], closed_form: dict, max_delay_limit_s: float | None = None,
           train_share: float = 0.5, max_events: int = 20000, strategy_windows: int = 12,
           strategies: tuple[str, ...] | None = None, rounds: int = 2, progress=None) -> SearchResult:
    """The search of the module docstring. ``closed_form``: key -> value of the closed-form suggestions;
    ``strategies``: default :data:`STRATEGY_CANDIDATES`, and ``h3-mondrian`` with an H3 geopoint."""
    t0, c0 = time.perf_counter(), time.process_time()
    a, s = config.anonymization, config.stream
    h3_keys = [f"quasi_identifiers.{q.name}.resolutions" for q in config.quasi_identifiers if getattr(q, "h3", None)]
    if strategies is None:      # h3-mondrian forms classes along the cells (docs/h3-positions.md)
        strategies = STRATEGY_CANDIDATES + (("h3-mondrian",) if h3_keys else ())
    current = {WINDOW: a.window_s, MAX_DELAY: a.max_delay_s, LATENESS: s.allowed_lateness_s, STRATEGY: a.strategy}
    current.update({k: list(q.h3) for k, q in zip(h3_keys, [q for q in config.quasi_identifiers
                                                            if getattr(q, "h3", None)])})
    if a.strategy_params:
        current[STRATEGY_PARAMS] = dict(a.strategy_params)
    current = {k: _plain(v) for k, v in current.items()}
    limit = float(max_delay_limit_s) if max_delay_limit_s is not None else float(a.max_delay_s)
    train, held, cut = split_by_time(config, events, train_share)
    notes = []
    if len(train) > max_events:
        notes.append(f"the choosing part is capped to its first {max_events} of {len(train)} events")
        train = train[:max_events]
    st = _Stages(config, current, _Runs(config, {"train": train}, progress), notes)
    params = {STRATEGY_PARAMS: None} if a.strategy_params else {}
    for _ in range(rounds):          # coordinate descent: a strategy may change which window is best, and back
        start = dict(st.best)
        st.strategy([{STRATEGY: name, **params} for name in strategies if name != current[STRATEGY]],
                    strategy_windows)
        st.stage([{WINDOW: _plain(w), MAX_DELAY: _plain(d)}
                  for w, d in window_candidates(current[WINDOW], current[MAX_DELAY], closed_form.get(WINDOW), limit)])
        if closed_form.get(LATENESS) is not None and closed_form[LATENESS] != current[LATENESS]:
            st.stage([{LATENESS: closed_form[LATENESS]}])
        # a coarsest resolution that publishes no cell larger than the domain is taken at equal NCP
        st.stage([{key: closed_form[key]} for key in h3_keys
                  if closed_form.get(key) is not None and closed_form[key] != current[key]], ties=True)
        if st.best == start:
            break
    best, runs = st.best, st.runs
    # what a longer latency would buy: twice the chosen window and the limit (reported, never chosen)
    beyond = runs({**best, WINDOW: _plain(2 * best[WINDOW]), MAX_DELAY: _plain(2 * limit)}, "train")
    held_out: dict[str, object] = {"events": len(held), "from_time": _iso(cut)}
    if held:
        held_out["current"] = run_settings(config, held)
        held_out["chosen"] = run_settings(with_settings(config, best), held) if best != current \
            else held_out["current"]
    else:
        notes.append("no held-out part: the sample spans no time")
    return SearchResult(current, best, runs.done, {"events": len(train), "to_time": _iso(cut),
                                                    "strategy_events": st.strategy_events},
                        held_out, round(time.perf_counter() - t0, 2), notes, limit, beyond,
                        round(time.process_time() - c0, 2))


class _Stages:
    """The best settings so far and the stages that improve them (:func:`search`)."""

    def __init__(self, config, current: dict, runs: _Runs, notes: list[str]):
        self.config, self.current, self.runs, self.notes = config, current, runs, notes
        self.best = dict(current)
        self.strategy_events = 0

    def stage(self, candidates: list[dict], part: str = "train", ties: bool = False) -> None:
        """Keep the best admissible candidate; ``ties``: one as good as the best so far is taken too."""
        base = self.runs(self.current, part).figures
        top = self.runs(self.best, part).figures
        for delta in candidates:
            f = self.runs({**self.best, **delta}, part).figures
            if f is not None and base is not None and _admissible(f, base, self.config.anonymization.k) and \
                    _ncp(f) < _ncp(top) + (1e-12 if ties else -1e-12):
                self.best, top = {**self.best, **delta}, f

    def strategy(self, candidates: list[dict], windows: int) -> None:
        """Strategies differ most in cost (a lattice search per window): judged on runs of windows spread over
        the part, then confirmed on the whole part (else the strategy stays)."""
        train = self.runs.parts["train"]
        spread = spread_windows(self.config, train, self.best[WINDOW], self.best[MAX_DELAY], windows)
        part = "train" if len(spread) == len(train) else f"strategy@{self.best[WINDOW]}"
        self.runs.parts[part] = spread
        self.strategy_events = max(self.strategy_events, len(spread))
        before = dict(self.best)
        self.stage(candidates, part)
        if self.best != before and part != "train":
            f = self.runs(self.best, "train").figures
            top, base = self.runs(before, "train").figures, self.runs(self.current, "train").figures
            # base: the current settings, which validate, on the part the search chooses on
            if f is None or not _admissible(f, cast(Figures, base), self.config.anonymization.k) or \
                    _ncp(f) >= _ncp(top) - 1e-12:
                self.notes.append(f"strategy {self.best[STRATEGY]} was better on the spread windows, not on the "
                                  "whole part")
                self.best = before


def _ncp(f: Figures | None) -> float:
    """The NCP of a run known to have one: an admissible run, or the best one so far on the same events."""
    return cast(float, cast(Figures, f).ncp)


def _plain(v):
    """A whole float as int (config values print as 21600, not 21600.0)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _iso(t: float) -> str | None:
    from stream_anon.engine.space import iso
    return iso(t) if t is not None and math.isfinite(t) else None


def _f(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2%}"
