"""Citi Bike Jersey City trips (2017-2018) -> vehicle events, one ``trip`` event per row.

Data quirks handled here (see ``/work/shared/data/citibike_jc/SOURCE.md``):

- ``starttime`` is New York local wall time without offset. It is localized with ``zoneinfo`` so the event
  time carries the offset in force (-05:00 in winter, -04:00 from 12 March 2017 / 11 March 2018). Times in the
  repeated hour of the autumn change take the first (daylight-time) reading; those in the skipped spring hour
  keep -05:00 (zoneinfo's ``fold=0`` rule). Jan-Apr 2017 times have minute precision only.
- ``birth year`` is missing in two spellings: empty (1,705 rows) and the literal ``NULL`` (4,621 rows, from
  April 2017 on; not in SOURCE.md); both become null. Implausible years (25 trips before 1920, min 1887) are
  kept as published. ``usertype`` may be empty (117 rows, null); ``gender`` is 0 unknown, 1 male, 2 female.
- ``bikeid`` is the vehicle, seen across many trips and months: the natural privacy unit.

The invariant sensitive attribute for m-invariance: ``payload.fleet_contract``
-----------------------------------------------------------------------------------------
m-invariance protects a property of the *vehicle* that never changes and is sensitive, like the fleet contract
type the issue names (owned, leased, sponsor, partner: the terms a fleet operator negotiates, or for a private car
its financing). The trip files publish nothing about a bike but its id, and every attribute derived from its trips
(how often it rides, where it is parked) is known to the adversary the attack models, who knows the target's
quasi-identifiers and the releases it appears in: it would protect nothing. So each REAL bike gets a contract type
from the master data a real deployment would join on the vehicle id; here that master data is simulated by a
fixed assignment from a hash of the bike id with the shares in ``FLEET_CONTRACT_SHARES`` (stable for the bike's
lifetime, independent of its trips and of the order the file is read in). Trips, bikes and times stay real.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import hashlib

import pandas as pd

NEW_YORK = ZoneInfo("America/New_York")
MISSING = ("", "NULL")
COLUMNS = ("tripduration", "starttime", "start station id", "start station name", "start station latitude",
           "start station longitude", "end station id", "end station name", "end station latitude",
           "end station longitude", "bikeid", "usertype", "birth year", "gender")


# simulated fleet master data: contract type shares over bikes (see the module docstring)
FLEET_CONTRACT_SHARES = (("owned", 0.35), ("leased", 0.30), ("sponsored", 0.20), ("partner", 0.15))


def fleet_contract(bike_id: str) -> str:
    """The contract type of a bike: a fixed function of its id (SHA-256 -> a point in [0, 1) -> the shares)."""
    u = int.from_bytes(hashlib.sha256(f"fleet-contract:{bike_id}".encode()).digest()[:8], "big") / 2 ** 64
    acc = 0.0
    for name, share in FLEET_CONTRACT_SHARES:
        acc += share
        if u < acc:
            return name
    return FLEET_CONTRACT_SHARES[-1][0]


def local_time(starttime: str) -> str:
    """``"2017-07-01 08:00:00"`` (New York wall time) -> ``"2017-07-01T08:00:00-04:00"``."""
    return datetime.fromisoformat(starttime).replace(tzinfo=NEW_YORK).isoformat()


def read_events(path: str | Path, limit: int | None = None) -> list[dict]:
    """Trip events from the raw trips CSV (full file or slice), in file (start time) order.

    ``event_id`` is ``cb-<row index>`` and ``trip_id`` ``cb-trip-<row index>`` (the source has no trip id);
    position is the start station, the end station goes to the payload.
    """
    df = pd.read_csv(path, dtype=str, keep_default_na=False, nrows=limit)
    events = []
    for i, (duration, start, start_id, start_name, start_lat, start_lon, end_id, end_name, end_lat, end_lon,
            bike, usertype, birth_year, gender) in enumerate(zip(*(df[c] for c in COLUMNS))):
        events.append({
            "event_id": f"cb-{i}",
            "kind": "vehicle",
            "event_type": "trip",
            "event_time": local_time(start),
            "vehicle_id": bike,
            "trip_id": f"cb-trip-{i}",
            "latitude": float(start_lat),
            "longitude": float(start_lon),
            "speed_kmh": None,
            "event_name": "trip",
            "signals": {
                "birth_year": None if birth_year in MISSING else float(birth_year),
                "trip_duration_s": float(duration),
            },
            "payload": {
                "start_station_id": int(start_id),
                "start_station": start_name,
                "end_station_id": int(end_id),
                "end_station": end_name,
                "end_latitude": float(end_lat),
                "end_longitude": float(end_lon),
                "usertype": usertype or None,
                "gender": int(gender),
                "fleet_contract": fleet_contract(bike),
            },
        })
    return events
