"""OBD-II telemetry of one car driven by 19 drivers (Natal, Brazil, 2017) -> vehicle ``telemetry`` events.

The CSV went through a Brazilian-locale spreadsheet (see ``/work/shared/data/obd2/SOURCE.md``); every reading is
kept and its cells parsed, never dropped. A cell that is present but cannot be parsed (e.g. a raw OBD response
``1:6032000007E803`` leaked into BAROMETRIC_PRESSURE) becomes null and is counted in ``stats``.

- Numbers carry glued units and decimal commas: ``100kPa``, ``82C``, ``48km/h``, ``2124RPM``, ``"24,77g/s"``,
  ``"74,50%"``, ``-3C``.
- LATITUDE/LONGITUDE lost their decimal point to thousands dots: ``-58.321.307`` is -5.8321307 and
  ``-3.520.429.461`` is -35.20429461. Rule: strip the dots, then put the decimal point after the first digit
  for latitude and after the first two for longitude (Natal is at about -5.8, -35.2, so |lat| < 10 and
  10 <= |lon| < 100). ``0.0`` in both is "no GPS fix" (859 rows): position and altitude become null.
- TIME is epoch milliseconds in scientific notation (``1,51336E+12``): only 5-6 significant digits survive,
  a resolution of 1e7 ms (about 2.8 hours). Event time per driver (rows of a driver are contiguous and in
  recording order) is built as: ``base`` = the coarse epoch of the driver's first row; a row with an
  ENGINE_RUNTIME ``r`` (HH:MM:SS since engine start) is at ``base + offset + r``, at least one second after the
  previous row; ``offset`` starts at 0 and, when the runtime goes backwards (an engine restart, which also
  starts a new ``trip_id``), is raised so the new run continues one second after the previous row; a row
  without a runtime is one second after the previous row. Times are thus strictly increasing per driver,
  spaced as recorded, but their absolute position is only good to the ~1e7 ms of the coarse epoch.
- Columns that are empty in every row (FUEL_ECONOMY, FUEL_TYPE, FUEL_PRESSURE, three fuel-trim columns,
  TROUBLE_CODES) carry nothing and are not mapped to signals; TROUBLE_CODES and DTC_NUMBER (which holds the
  MIL status text, e.g. ``MIL is OFF0 codes``) go to the payload raw.
"""
from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

NUMBER = re.compile(r"(-?\d+(?:[.,]\d+)?)(?:kPa|C|%|km/h|RPM|g/s)?")
RUNTIME = re.compile(r"(\d+):(\d{2}):(\d{2})")
COORD = re.compile(r"(-?)(\d[\d.]*)")

# source column -> signal name (units in the name; TIMING_ADVANCE and EQUIV_RATIO carry a spurious "%")
SIGNALS = {
    "ALTITUDE": "altitude_m",
    "BAROMETRIC_PRESSURE(KPA)": "barometric_pressure_kpa",
    "ENGINE_COOLANT_TEMP": "coolant_temp_c",
    "FUEL_LEVEL": "fuel_level_pct",
    "ENGINE_LOAD": "engine_load_pct",
    "AMBIENT_AIR_TEMP": "ambient_air_temp_c",
    "ENGINE_RPM": "engine_rpm",
    "INTAKE_MANIFOLD_PRESSURE": "intake_manifold_pressure_kpa",
    "MAF": "maf_g_s",
    "AIR_INTAKE_TEMP": "air_intake_temp_c",
    "SHORT TERM FUEL TRIM BANK 1": "short_term_fuel_trim_bank1_pct",
    "THROTTLE_POS": "throttle_pos_pct",
    "TIMING_ADVANCE": "timing_advance",
    "EQUIV_RATIO": "equiv_ratio",
}


def parse_number(cell: str) -> float | None:
    """``"2124RPM"`` -> 2124.0, ``"24,77g/s"`` -> 24.77, ``"-3C"`` -> -3.0; ValueError if not a number."""
    m = NUMBER.fullmatch(cell.strip())
    if not m:
        raise ValueError(f"not a number: {cell!r}")
    return float(m[1].replace(",", "."))


def parse_coordinate(cell: str, int_digits: int) -> float:
    """Undo the thousands dots: ``("-58.321.307", 1)`` -> -5.8321307, ``("-3.520.429.461", 2)`` -> -35.20429461."""
    m = COORD.fullmatch(cell.strip())
    if not m:
        raise ValueError(f"not a coordinate: {cell!r}")
    digits = m[2].replace(".", "")
    return float(f"{m[1]}{digits[:int_digits]}.{digits[int_digits:] or '0'}")


def parse_epoch_ms(cell: str) -> float:
    """``"1,51336E+12"`` -> 1513360000000.0 (decimal comma in scientific notation)."""
    return float(cell.replace(",", "."))


def parse_runtime(cell: str) -> int | None:
    m = RUNTIME.fullmatch(cell.strip())
    return int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) if m else None


def read_events(path: str | Path, limit: int | None = None, stats: Counter | None = None) -> list[dict]:
    """Telemetry events, one per reading, in event-time order (as a live feed of the 19 vehicles arrives; the file
    holds one vehicle after another, which replayed as it is would make most readings late); ``event_id`` is
    ``obd-<row index in the file>``.

    ``stats`` (optional) receives per-column counts of present-but-unparseable cells (``"<COLUMN>"``) and of
    readings without a GPS fix (``"no_gps_fix"``).
    """
    stats = Counter() if stats is None else stats
    df = pd.read_csv(path, dtype=str, keep_default_na=False, nrows=limit)
    events = []
    driver, base, offset, last_t, last_r, trip = None, 0.0, 0.0, 0.0, None, 0
    for i, row in enumerate(df.to_dict("records")):
        if row["VEHICLE_ID"] != driver:
            driver, offset, last_r, trip = row["VEHICLE_ID"], 0.0, None, 1
            base = parse_epoch_ms(row["TIME"]) / 1000
            last_t = base - 1
        runtime = _cell(row, "ENGINE_RUNTIME", parse_runtime, stats)
        if runtime is None:
            t = last_t + 1
        else:
            if last_r is not None and runtime < last_r:
                trip += 1
                offset = last_t + 1 - base - runtime
            t = max(base + offset + runtime, last_t + 1)
            last_r = runtime
        last_t = t
        signals = {name: _cell(row, col, parse_number, stats) for col, name in SIGNALS.items()}
        signals["engine_runtime_s"] = None if runtime is None else float(runtime)
        lat = _cell(row, "LATITUDE", lambda c: parse_coordinate(c, 1), stats)
        lon = _cell(row, "LONGITUDE", lambda c: parse_coordinate(c, 2), stats)
        if lat == 0 and lon == 0:
            stats["no_gps_fix"] += 1
            lat = lon = signals["altitude_m"] = None
        events.append({
            "event_id": f"obd-{i}",
            "kind": "vehicle",
            "event_type": "telemetry",
            "event_time": datetime.fromtimestamp(t, tz=timezone.utc).isoformat(),
            "vehicle_id": driver,
            "trip_id": f"obd-{driver}-{trip}",
            "latitude": lat,
            "longitude": lon,
            "speed_kmh": _cell(row, "SPEED", parse_number, stats),
            "event_name": "obd_reading",
            "signals": signals,
            "payload": {
                "trouble_codes": row["TROUBLE_CODES"] or None,
                "dtc_status": row["DTC_NUMBER"] or None,
                "time_raw": row["TIME"],
            },
        })
    events.sort(key=lambda e: e["event_time"])     # ISO times in UTC: text order is time order; stable
    return events


def _cell(row: dict, column: str, parse, stats: Counter):
    """Parse one cell: empty -> None; unparseable -> None and counted under the column name."""
    cell = row[column]
    if not cell.strip():
        return None
    try:
        value = parse(cell)
    except ValueError:
        value = None
    if value is None:
        stats[column] += 1
    return value
