"""``oyster-cards``: a stream of persistent synthetic fare cards built from REAL Oyster journeys (demo dataset).

The public Oyster sample (:mod:`stream_anon.datasets.oyster`) has no card id, so no individual appears in more
than one journey. m-invariance is about individuals that come back release after release, so this
module groups real journeys into synthetic cards. Every event it emits is a real tap of the Monday file (or of
the committed slice): only ``card_id``, ``event_id``, ``journey_id`` and the date are synthetic.

Generator (all parameters in :class:`OysterCardsParams`, deterministic for a seed)
---------------------------------------------------------------------------------
1. **Journey pool.** Real events are grouped by ``journey_id`` (a tap-in and its tap-out; a bus boarding is a
   one-event journey). A journey's ``product_category`` is that of its events. Journeys whose category is
   unknown are left out: in the slice (cut at 07:30) a tap-in whose tap-out lies after the cut has no product
   (about 16% of the slice's journeys); the full Monday file has none. A journey's *origin* is the location of
   its first event (station for rail, route for bus); its *area* is the origin's parent in the location
   hierarchy (fare zone for a station, route group for a bus route).
2. **Cards and their product.** ``cards`` cards are split over the product categories in proportion to the
   categories' share of real journeys (largest remainders, at least one card per category present), so the
   product shares of journeys stay those of the real data (Monday: PAYG 35.0%, travelcard 27.4%, bus & tram
   pass 18.3%, Freedom Pass elderly 10.3%, child 5.2%, Freedom Pass disabled 2.9%, staff 1.0%, other 0.04%).
   A card keeps ONE category for ever (its ``fare_product`` may vary between journeys within the category:
   the pool is per category, not per product).
3. **Journeys per card per day**: ``1 + Poisson(mean_journeys_per_card_per_day - 1)``, a shifted Poisson. Why:
   a card counted on a day has made at least one journey; the typical Oyster day is an out-and-back pair with
   a tail of extra trips (with the default mean 2.4: P(1) = 0.25, P(2) = 0.35, P(3) = 0.24, P(>=4) = 0.16),
   which matches the usual 2-3 journeys per active card and day reported for London. Every card travels every
   day (day-to-day absence is not modelled: it would only make the stream sparser).
4. **Home-station bias.** A card's *home* is the origin of its first journey (drawn uniformly from its
   category's pool on day 0). Each further journey starts at home with probability ``home_bias``; when no
   unused journey of the category starts there, one starting in the home's area ("near": same zone / route
   group) is taken; otherwise (and with probability ``1 - home_bias``) any journey of the category.
5. **No overlap, no reuse within a day.** A card's journeys never overlap in time (a gap of at least
   ``MIN_GAP_S`` between them, checked across days too), and a real journey is used at most once per day.
   A draw that fails after ``MAX_TRIES`` attempts is dropped, so the realised mean is slightly below the
   parameter when the pool is small (the slice); :func:`stats` reports the realised figures.
6. **Days.** Day ``d`` re-uses the same cards (same category, same home) with journeys drawn again from the
   real Monday pool, shifted by ``d`` days. Ids are made unique per day: ``event_id = "oyc-<day>-<source
   row>"`` (the source row of ``oy-mon-<row>``), ``journey_id = "<source journey id>-d<day>"``,
   ``card_id = "oyc-card-<n>"`` (the number does not reveal the category: cards are numbered after a seeded
   shuffle).

Events are sorted by (event_time, event_id). ``read_events(path=None)`` reads the committed slice
(``data/oyster_slice.csv.gz``), so the result does not depend on whether ``../shared/data`` exists; pass
``DATASETS["oyster"].full_path`` for the whole Monday pool. The timestamp QI bounds of
``configs/oyster-cards.toml`` cover ``days = 3`` (2009-11-09T00:00 to 2009-11-12T06:00); more days need wider
bounds there.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from stream_anon.datasets import oyster

MIN_GAP_S = 300          # a card's journeys are at least 5 minutes apart
MAX_TRIES = 30           # attempts per journey draw before it is dropped


@dataclass(frozen=True)
class OysterCardsParams:
    """Parameters of the synthetic card population (see the module docstring)."""

    days: int = 3
    cards: int = 2000
    mean_journeys_per_card_per_day: float = 2.4
    home_bias: float = 0.6
    seed: int = 0

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ValueError(f"days: must be at least 1, got {self.days}")
        if self.cards < 1:
            raise ValueError(f"cards: must be at least 1, got {self.cards}")
        if self.mean_journeys_per_card_per_day < 1:
            raise ValueError("mean_journeys_per_card_per_day: must be at least 1 (every card travels daily), "
                             f"got {self.mean_journeys_per_card_per_day}")
        if not 0 <= self.home_bias <= 1:
            raise ValueError(f"home_bias: must be in [0, 1], got {self.home_bias}")


@dataclass
class _Journey:
    rows: list[int]          # source event indices (into the real events), in time order
    category: str
    origin: str | None
    start: float             # epoch seconds (Monday)
    end: float


def _location_parents() -> dict[str, str]:
    doc = json.loads(oyster.HIERARCHY_PATH.read_text())
    parents: dict[str, str] = {}

    def walk(node, parent):
        if isinstance(node, dict):
            for key, sub in node.items():
                if parent is not None:
                    parents[key] = parent
                walk(sub, key)
        else:
            for leaf in node:
                parents[leaf] = parent

    walk(doc["tree"], None)
    return parents


def _ts(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def _journeys(events: list[dict]) -> list[_Journey]:
    rows_of: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        rows_of[e["journey_id"]].append(i)
    out = []
    for rows in rows_of.values():
        rows.sort(key=lambda i: (events[i]["event_time"], events[i]["event_type"] != "tap_in", i))
        cats = {events[i]["product_category"] for i in rows} - {None}
        if len(cats) != 1:
            continue              # unknown product (tap-in cut from its tap-out); never ambiguous on Monday
        first = events[rows[0]]
        out.append(_Journey(rows, cats.pop(), first["station"] or first["bus_route"],
                            _ts(first["event_time"]), _ts(events[rows[-1]]["event_time"])))
    out.sort(key=lambda j: j.rows[0])
    return out


def _allocate(cards: int, shares: dict[str, int]) -> dict[str, int]:
    """Cards per category in proportion to journeys (largest remainders, >= 1 per category if cards allow)."""
    total = sum(shares.values())
    cats = sorted(shares)
    quota = {c: cards * shares[c] / total for c in cats}
    alloc = {c: int(quota[c]) for c in cats}
    for c in sorted(cats, key=lambda c: (-(quota[c] - alloc[c]), c))[: cards - sum(alloc.values())]:
        alloc[c] += 1
    for c in cats:                 # every category present gets a card, taken from the largest
        if alloc[c] == 0 and cards >= len(cats):
            big = max(cats, key=lambda x: (alloc[x], x))
            alloc[big] -= 1
            alloc[c] = 1
    return alloc


def generate(real_events: list[dict], params: OysterCardsParams = OysterCardsParams()) -> list[dict]:
    """Persistent-card events from real Oyster events (as returned by ``oyster.read_events``)."""
    rng = np.random.default_rng(params.seed)
    journeys = _journeys(real_events)
    parents = _location_parents()
    pool: dict[str, list[int]] = defaultdict(list)
    by_origin: dict[tuple[str, str], list[int]] = defaultdict(list)
    by_area: dict[tuple[str, str], list[int]] = defaultdict(list)
    for j_idx, j in enumerate(journeys):
        pool[j.category].append(j_idx)
        if j.origin is not None:
            by_origin[(j.category, j.origin)].append(j_idx)
            by_area[(j.category, parents.get(j.origin, "?"))].append(j_idx)
    alloc = _allocate(params.cards, {c: len(v) for c, v in pool.items()})
    card_cats = [c for c in sorted(alloc) for _ in range(alloc[c])]
    order = rng.permutation(len(card_cats))
    card_cats = [card_cats[i] for i in order]                     # card number does not reveal the category
    homes: list[str | None] = [None] * len(card_cats)
    busy: list[list[tuple[float, float]]] = [[] for _ in card_cats]   # absolute intervals across days
    day_s = 86400.0
    out: list[dict] = []
    for day in range(params.days):
        used: set[int] = set()
        counts = 1 + rng.poisson(params.mean_journeys_per_card_per_day - 1, size=len(card_cats))
        for card, (cat, n) in enumerate(zip(card_cats, counts)):
            for _ in range(int(n)):
                j_idx = _draw(rng, journeys, cat, homes[card], parents, pool, by_origin, by_area, used,
                              busy[card], day * day_s, params.home_bias)
                if j_idx is None:
                    continue
                j = journeys[j_idx]
                used.add(j_idx)
                busy[card].append((j.start + day * day_s, j.end + day * day_s))
                if homes[card] is None:
                    homes[card] = j.origin
                for row in j.rows:
                    e = dict(real_events[row])
                    e["event_id"] = f"oyc-{day}-{_source_row(e['event_id'], row)}"
                    e["journey_id"] = f"{e['journey_id']}-d{day}"
                    e["card_id"] = f"oyc-card-{card:05d}"
                    e["event_time"] = (datetime.fromisoformat(e["event_time"]) + timedelta(days=day)).isoformat()
                    out.append(e)
    out.sort(key=lambda e: (e["event_time"], e["event_id"]))
    return out


def _source_row(event_id: str, fallback: int) -> str:
    prefix = "oy-mon-"
    return event_id[len(prefix):] if event_id.startswith(prefix) else str(fallback)


def _draw(rng, journeys, cat, home, parents, pool, by_origin, by_area, used, intervals, offset, home_bias):
    """One journey index for a card, or None (see the module docstring, steps 4 and 5)."""
    def free(j_idx: int) -> bool:
        if j_idx in used:
            return False
        j = journeys[j_idx]
        s, e = j.start + offset, j.end + offset
        return all(s >= b + MIN_GAP_S or e <= a - MIN_GAP_S for a, b in intervals)

    def pick(cands: list[int]) -> int | None:
        if not cands:
            return None
        for _ in range(MAX_TRIES):
            j_idx = cands[int(rng.integers(len(cands)))]
            if free(j_idx):
                return j_idx
        return None

    if home is not None and rng.random() < home_bias:
        got = pick(by_origin.get((cat, home), []))
        if got is None:
            got = pick(by_area.get((cat, parents.get(home, "?")), []))
        if got is not None:
            return got
    return pick(pool[cat])


def read_events(path: str | Path | None = None, params: OysterCardsParams = OysterCardsParams(),
                limit: int | None = None) -> list[dict]:
    """The oyster-cards stream: real Oyster journeys from ``path`` (default: the committed slice) grouped into
    ``params.cards`` persistent cards over ``params.days`` days, sorted by event time. ``limit`` caps the
    events returned (the first ``limit`` in time order; the whole pool is always used)."""
    real = oyster.read_events(path if path is not None else oyster.SLICE_PATH)
    events = generate(real, params)
    return events if limit is None else events[:limit]


def stats(events: list[dict], window_s: float = 900.0) -> dict:
    """Realised figures of a generated stream: cards, events, journeys, product shares (of journeys), journeys
    per card per day, share of journeys starting at the card's home (the origin of its first journey), windows
    (releases) a card appears in."""
    journeys: dict[str, tuple[str, str, str]] = {}     # journey -> (card, product category, day)
    for e in events:
        journeys.setdefault(e["journey_id"], (e["card_id"], e["product_category"], e["event_time"][:10]))
    cards = {c for c, _, _ in journeys.values()}
    per_card_day = Counter((c, d) for c, _, d in journeys.values())
    cats = Counter(cat for _, cat, _ in journeys.values())
    windows: dict[str, set] = defaultdict(set)
    for e in events:
        windows[e["card_id"]].add(int(_ts(e["event_time"]) // window_s))
    first_origin: dict[str, str | None] = {}
    at_home = n_j = 0
    seen_j: set = set()
    for e in sorted(events, key=lambda e: (e["event_time"], e["event_id"])):
        if e["journey_id"] in seen_j:
            continue
        seen_j.add(e["journey_id"])
        origin = e["station"] or e["bus_route"]
        home = first_origin.setdefault(e["card_id"], origin)
        n_j += 1
        at_home += origin == home
    per_card_windows = np.array([len(v) for v in windows.values()]) if windows else np.array([0])
    jpd = np.array(list(per_card_day.values())) if per_card_day else np.array([0])
    return {
        "cards": len(cards), "events": len(events), "journeys": len(journeys),
        "product_shares": {c: round(n / max(1, len(journeys)), 4) for c, n in cats.most_common()},
        "journeys_per_card_day_mean": round(float(jpd.mean()), 3),
        "journeys_per_card_day_hist": {int(k): int(v) for k, v in sorted(Counter(jpd.tolist()).items())},
        "journeys_from_home_share": round(at_home / max(1, n_j), 3),
        "windows_per_card_mean": round(float(per_card_windows.mean()), 2),
        "windows_per_card_min": int(per_card_windows.min()),
        "windows_per_card_max": int(per_card_windows.max()),
    }
