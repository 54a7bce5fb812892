"""Explicit calibration: derive fixed domain bounds from a sample and write them into a configuration file.

Bounds are fixed before the stream runs and never move with it: a scale that drifted with the data would make
information loss incomparable across releases (and would itself leak the extremes of the stream). Run this
once on a representative sample, review the written file, then deploy it.
"""
from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from pathlib import Path

from stream_anon.config import ConfigError, load_config, with_files_beside
from stream_anon.engine import get_path
from stream_anon.engine.space import parse_time


def calibrate(config_path: str | Path, events: list[dict], out_path: str | Path, margin: float = 0.0,
              allow_outside_paths: bool = False) -> dict:
    """Write a copy of the configuration with lower/upper of every numeric, timestamp and geopoint QI set to
    the sample's range (widened by ``margin`` of the range on each side). The files it names stay in the copy's
    directory tree (copied beside it when they are not: :func:`~stream_anon.config.with_files_beside`), so the copy
    loads without ``--allow-outside-paths``. Returns the bounds written."""
    import tomlkit

    config_path, out_path = Path(config_path), Path(out_path)
    load_config(config_path, allow_outside_paths)           # its files are where they may be before any is copied
    # tomlkit keeps what the author wrote (comments, inline tables, key order) around the values written here
    raw = with_files_beside(tomlkit.parse(config_path.read_text()), config_path.parent, out_path.parent)
    bounds = {}
    for qi in raw.get("quasi_identifiers", []):
        kind = qi.get("kind")
        fields = qi["field"] if isinstance(qi.get("field"), list) else [qi.get("field")]
        if kind in ("numeric", "timestamp"):
            parse = parse_time if kind == "timestamp" else _number
            values = [parse(get_path(e, fields[0])) for e in events]
            lo, hi = _range([v for v in values if v is not None], margin, qi["name"])
            if kind == "timestamp":
                lo, hi = math.floor(lo / 3600) * 3600, math.ceil(hi / 3600) * 3600   # whole hours
                qi["lower"], qi["upper"] = _iso(lo), _iso(hi)
            else:
                qi["lower"], qi["upper"] = math.floor(lo), math.ceil(hi)
        elif kind == "geopoint":
            los, his = [], []
            for f in fields:
                lo, hi = _range([v for v in (_number(get_path(e, f)) for e in events) if v is not None], margin,
                                qi["name"])
                los.append(math.floor(lo * 1000) / 1000)
                his.append(math.ceil(hi * 1000) / 1000)
            qi["lower"], qi["upper"] = los, his
        else:
            continue
        bounds[qi["name"]] = (qi["lower"], qi["upper"])
    body = [line for line in tomlkit.dumps(raw).splitlines(keepends=True)
            if not line.startswith((CALIBRATED, SUGGESTED))]     # an earlier calibration's notes, replaced
    out_path.write_text(f"{CALIBRATED} from {len(events)} events on {datetime.now(timezone.utc).date()}; source "
                        f"config {config_path.name}.\n" + "".join(body))
    try:
        load_config(out_path)
    except ConfigError as exc:
        raise ConfigError(f"calibrated config {out_path} does not validate: {exc}") from None
    return bounds


CALIBRATED = "# Calibrated by `stream-anon calibrate`"
SUGGESTED = "# Settings suggested from the sample (stream-anon calibrate --apply-suggestions)."


def write_suggestions(path: str | Path, edit) -> None:
    """``edit(document)`` applied to the calibrated config at ``path`` in place, keeping what its author wrote
    (comments, inline tables, key order), with a note under the calibration's first line."""
    import tomlkit

    path = Path(path)
    lines = tomlkit.dumps(edit(tomlkit.parse(path.read_text()))).splitlines(keepends=True)
    lines = [line for line in lines if not line.startswith(SUGGESTED)]
    lines.insert(1 if lines and lines[0].startswith(CALIBRATED) else 0, SUGGESTED + "\n")
    path.write_text("".join(lines))


def _number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _range(values, margin, name):
    if not values:
        raise ConfigError(f"quasi_identifiers.{name}: no values in the calibration sample")
    lo, hi = min(values), max(values)
    pad = (hi - lo) * margin
    if hi - lo + 2 * pad <= 0:
        pad = 1.0
    return lo - pad, hi + pad


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def toml_text(doc: dict) -> str:
    """A small TOML writer for configuration documents (tables, arrays of tables, scalars, lists)."""
    lines: list[str] = []

    def scalar(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        if isinstance(v, datetime):
            return v.isoformat()
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    def key(k):      # a bare key, else quoted: "signals.engine_rpm", "Bus & Tram Pass-7 Day"
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else scalar(k)

    def table(name, t, array=False):
        lines.append(f"\n[[{name}]]" if array else f"\n[{name}]")
        subs = []
        for k, v in t.items():
            if isinstance(v, dict):
                subs.append((f"{name}.{key(k)}", v, False))
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                subs.extend((f"{name}.{key(k)}", x, True) for x in v)    # nested [[a.b]] follows its [[a]]
            else:
                lines.append(f"{key(k)} = {scalar(v)}")
        for sub_name, sub, is_array in subs:
            table(sub_name, sub, array=is_array)

    for k, v in doc.items():
        if isinstance(v, dict):
            table(key(k), v)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for item in v:
                table(key(k), item, array=True)
        else:
            lines.insert(0, f"{key(k)} = {scalar(v)}")
    return "\n".join(lines).lstrip("\n") + "\n"
