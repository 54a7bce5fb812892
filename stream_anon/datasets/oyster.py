"""TfL Oyster 5% sample (Monday, November 2009) -> fare events; and the Oyster location hierarchy.

Data quirks handled here (see ``/work/shared/data/oyster/SOURCE.md`` and ``data/ATTRIBUTION.md``):

- Only a weekday (``Mon``) and ``HH:MM`` are given, with hours >= 24 meaning the next day's early hours. Events
  are placed on the *nominal* date 2009-11-09 (a Monday of the sample's November 2009 week; the true date is not
  in the data) plus the HH:MM offset, in UTC (London is on GMT in November, so UTC is also local time).
- ``final_product`` is set on ENDTRIP and BUSTRIP rows but not on BEGINTRIP: a tap-in takes the product of its
  journey's ENDTRIP (``journey_id`` links them), looked up in a pre-pass over the whole file. In a slice cut
  before the ENDTRIP the tap-in's product stays null.
- 88 raw station spellings do not match ``london_stations.csv`` verbatim (``Kings Cross T``, tram stops in
  capitals with a trailing space, ...): ``configs/lookups/oyster_station_aliases.csv`` maps each one to its
  canonical name, by inspection. The one name that is no station (``Not Applicable``, a single LUL tap-out) maps to itself and sits
  under "Other rail" in the hierarchy. No event is ever dropped.
"""
from __future__ import annotations

import csv
import json
import re
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path

import networkx as nx
import pandas as pd

from stream_anon import contract

# one table for the adapter and the mapped config (configs/inputs/oyster-csv.toml reads it as a lookup)
ALIASES_PATH = contract.configs_dir() / "lookups" / "oyster_station_aliases.csv"
STATIONS_PATH = contract.data_path("london_stations.csv")
SLICE_PATH = contract.data_path("oyster_slice.csv.gz")     # bundled Monday prefix (data/ATTRIBUTION.md)
HIERARCHY_PATH = contract.configs_dir() / "hierarchies" / "oyster_location.json"

NOMINAL_DATE = datetime(2009, 11, 9, tzinfo=timezone.utc)   # a Monday; nominal, see module docstring
EVENT_TYPES = {"BEGINTRIP": "tap_in", "ENDTRIP": "tap_out", "BUSTRIP": "bus_boarding"}
CHILD_MARKERS = ("child", "under", "16+", "zip", "student")   # none but "(Child Free)" occur on Monday


def product_category(product: str | None) -> str | None:
    """``final_product`` string -> category (docs/contracts.md section 1).

    The Monday data holds 21 distinct products. Child products: only ``Bus & Tram Pass (Child Free)`` (the
    other markers are kept for other weeks' "Under 16"/"Zip"/"16+"/"Student" names), so the child test
    comes before the bus & tram test. ``Bus & Tram Pass - B&T Discount-*`` are bus & tram passes bought at a
    discount, hence ``bus_tram_pass``. ``Tfl Travel - Free`` is ``other``.
    """
    if not product:
        return None
    lower = product.lower()
    if product == "PAYG":
        return "payg"
    if lower.startswith("staff pass"):
        return "staff"
    if product == "Freedom Pass (Elderly)":
        return "freedom_pass_elderly"
    if product == "Freedom Pass (Disabled)":
        return "freedom_pass_disabled"
    if any(marker in lower for marker in CHILD_MARKERS):
        return "child"
    if "travelcard" in lower:
        return "travelcard"
    if lower.startswith("bus & tram pass"):
        return "bus_tram_pass"
    return "other"


@lru_cache(maxsize=None)
def station_aliases(path: Path = ALIASES_PATH) -> dict[str, str]:
    """Raw spelling -> canonical station name (raw names keep their trailing spaces)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return {row["raw_name"]: row["canonical_name"] for row in csv.DictReader(fh)}


@lru_cache(maxsize=None)
def station_zones(path: Path = STATIONS_PATH) -> dict[str, int | None]:
    """Canonical station -> fare zone. Boundary stations (``"2,3"``, ``"3,4,5,6"``) take the lowest zone,
    the zone a fare is cheapest in; an empty zone (stations beyond the zonal area, e.g. Reading) is None."""
    with open(path, newline="", encoding="utf-8") as fh:
        return {row["Station"]: (min(int(z) for z in row["Zone"].split(",")) if row["Zone"].strip() else None)
                for row in csv.DictReader(fh)}


def canonical_station(raw: str) -> str | None:
    if not raw:
        return None
    return station_aliases().get(raw, raw)


@lru_cache(maxsize=None)
def event_time(hhmm: str) -> str:
    """``"28:30"`` -> ``"2009-11-10T04:30:00+00:00"`` (nominal date + offset; hours may exceed 23)."""
    hours, minutes = hhmm.split(":")
    return (NOMINAL_DATE + timedelta(hours=int(hours), minutes=int(minutes))).isoformat()


def _read_raw(path: str | Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _pence(value: str) -> int | None:
    return int(value) if value else None


def read_events(path: str | Path, limit: int | None = None) -> list[dict]:
    """Fare events from the raw Monday CSV (full file or slice), one per row, in file order.

    ``event_id`` is ``oy-mon-<row index>`` (0-based data row), so a slice cut from the start of the file
    yields the same ids as the full file. ``card_id`` is null: the public sample has no card id. ``limit`` caps
    the events returned; the whole file is still read so that early tap-ins find their tap-out's product.
    """
    df = _read_raw(path)
    ends = df[df["event_type"] == "ENDTRIP"]
    journey_product = dict(zip(ends["journey_id"], ends["final_product"]))
    rows = df if limit is None else df.iloc[:limit]
    events = []
    for i, r in enumerate(rows.itertuples(index=False)):
        product = r.final_product or (journey_product.get(r.journey_id) if r.event_type == "BEGINTRIP" else None)
        events.append({
            "event_id": f"oy-mon-{i}",
            "kind": "fare",
            "event_type": EVENT_TYPES[r.event_type],
            "event_time": event_time(r.time),
            "journey_id": r.journey_id,
            "card_id": None,
            "subsystem": r.subsystem,
            "station": canonical_station(r.station),
            "bus_route": r.bus_route or None,
            "fare_product": product or None,
            "product_category": product_category(product),
            "full_fare_pence": _pence(r.ffare),
            "discounted_fare_pence": _pence(r.dfare),
            "daily_capping": {"Y": True, "N": False}.get(r.daily_capping),
        })
    return events


# -- location hierarchy ------------------------------------------------------------------------------------------
ZONE_BANDS = (("Zones 1-2", (1, 2)), ("Zones 3-4", (3, 4)), ("Zones 5-9", (5, 6, 7, 8, 9)))
OTHER_RAIL, UNKNOWN_ZONE = "Other rail", "Zone unknown"


def route_group(route: str) -> tuple[str, str]:
    """Bus route -> (band, group): day routes by hundreds ("15H" and "370D" go with 15 and 370), night routes
    ``N<digits>`` by hundreds, lettered routes (``C1``, ``RV1``, ``T031``) by their letters, anything else
    (``ELW``) under "Other routes"."""
    m = re.fullmatch(r"(N?)(\d+)[A-Z]?", route)
    if m:
        lo = int(m[2]) // 100 * 100
        if m[1]:
            return "Night routes", f"Night routes N{max(lo, 1)}-N{lo + 99}"
        return "Day routes", f"Bus routes {max(lo, 1)}-{lo + 99}"
    m = re.fullmatch(r"([A-Z]+)\d+[A-Z]?", route)
    if m:
        return "Lettered routes", f"Routes {m[1]}*"
    return "Other routes", "Unclassified routes"


def _natural(label: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label))


def location_tree(stations: set[str], routes: set[str]) -> nx.DiGraph:
    """The location tree as a networkx DiGraph: every leaf at depth 4 (value, zone, band, network, root).

    Rail: zone band -> fare zone -> station, over every station of ``london_stations.csv`` plus ``stations``
    (those absent from it go under "Other rail" / "Zone unknown"). Bus: band -> group -> route over ``routes``.
    Children are inserted in display order (zones and routes numerically, stations alphabetically) because
    leaf codes follow insertion order (docs/contracts.md section 3).
    """
    zones = station_zones()
    graph = nx.DiGraph()
    by_zone: dict[int | None, list[str]] = {}
    for station in sorted(set(zones) | stations):
        by_zone.setdefault(zones.get(station), []).append(station)
    graph.add_edge("*", "Rail")
    for band, band_zones in ZONE_BANDS:
        for zone in band_zones:
            for station in by_zone.get(zone, []):
                graph.add_edge("Rail", band)
                graph.add_edge(band, f"Zone {zone}")
                graph.add_edge(f"Zone {zone}", station)
    for station in by_zone.get(None, []):
        graph.add_edge("Rail", OTHER_RAIL)
        graph.add_edge(OTHER_RAIL, UNKNOWN_ZONE)
        graph.add_edge(UNKNOWN_ZONE, station)
    graph.add_edge("*", "Bus")
    bands = ("Day routes", "Night routes", "Lettered routes", "Other routes")
    placed = sorted(((route_group(r), r) for r in routes),
                    key=lambda x: (bands.index(x[0][0]), _natural(x[0][1]), _natural(x[1])))
    for (band, group), route in placed:
        for parent, child in (("Bus", band), (band, group), (group, route)):
            if graph.has_node(child) and not graph.has_edge(parent, child):
                raise ValueError(f"location label {child!r} would appear twice (route vs station/node label)")
            graph.add_edge(parent, child)
    return graph


def tree_to_nested(graph: nx.DiGraph, node: str = "*"):
    """DiGraph -> the nested JSON form: internal nodes are objects, a node whose children are leaves a list."""
    children = list(graph.successors(node))
    if all(graph.out_degree(c) == 0 for c in children):
        return children
    return {c: tree_to_nested(graph, c) for c in children}


def build_location_hierarchy(events_path: str | Path, out_path: str | Path = HIERARCHY_PATH) -> dict:
    """Write ``configs/hierarchies/oyster_location.json`` from the full Monday data (committed, regenerable).

    Station and route leaves are exactly the values ``read_events`` emits, so every event's location is a leaf.
    """
    df = _read_raw(events_path)
    stations = {c for c in map(canonical_station, df["station"].unique()) if c is not None}    # None: no station
    routes = {r for r in df["bus_route"].unique() if r}
    graph = location_tree(stations, routes)
    doc = {"name": "oyster_location",
           "levels": ["value", "zone", "band", "network", "*"],
           "tree": {"*": tree_to_nested(graph)}}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return doc

