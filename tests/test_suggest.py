"""``stream-anon calibrate --suggest`` (stream_anon/suggest.py): the suggestions follow from the sample's figures."""
from __future__ import annotations

from pathlib import Path

import pytest

from stream_anon.config import load_config
from stream_anon.suggest import apply, suggest

ROOT = Path(__file__).resolve().parents[1]


def _events(n_units, per_unit, step_s, lat0=40.70, span_deg=0.05, shuffle_lag_s=0):
    out = []
    for i in range(per_unit):
        for u in range(n_units):
            t = 1_500_000_000 + i * step_s + u
            if shuffle_lag_s and i % 10 == 5:
                t -= shuffle_lag_s           # every 10th round arrives late
            out.append({"vehicle_id": f"v{u}", "event_time": t,
                        "latitude": lat0 + span_deg * ((u * 7 + i) % 13) / 13,
                        "longitude": -74.0 + span_deg * ((u * 5 + i) % 11) / 11})
    return out


def _by_key(suggestions):
    return {s.key: s for s in suggestions}


def test_h3_resolution_window_and_lateness_follow_the_sample():
    cfg = load_config(ROOT / "configs" / "citibike-h3.toml")
    q = next(q for q in cfg.quasi_identifiers if q.h3)
    small = _by_key(suggest(cfg, [{**e, "vehicle_id": e["vehicle_id"]} for e in _events(30, 40, 600)]))
    wide = _by_key(suggest(cfg, _events(30, 40, 600, span_deg=2.0)))
    r_small = small[f"quasi_identifiers.{q.name}.resolutions"].value
    r_wide = wide[f"quasi_identifiers.{q.name}.resolutions"].value
    assert r_small[1] == r_wide[1] == q.h3[1] and r_wide[0] < r_small[0]     # a larger domain: coarser cells fit
    import h3
    area_small = (0.05 * 111.32) * (0.05 * 111.32 * 0.757)
    assert h3.average_hexagon_area(r_small[0], "km^2") <= 0.02 * area_small * 1.05
    assert h3.average_hexagon_area(r_small[0] - 1, "km^2") > 0.02 * area_small * 0.9
    # 30 units every 600 s: 2k distinct units within the shortest candidate holding them
    many = _by_key(suggest(cfg, _events(30, 40, 600)))["anonymization.window_s"].value
    few = _by_key(suggest(cfg, _events(4, 40, 600)))["anonymization.window_s"].value
    assert many <= 900 and few > many       # fewer units than 2k: no short window reaches the target
    late = _by_key(suggest(cfg, _events(30, 40, 600, shuffle_lag_s=3000)))["stream.allowed_lateness_s"]
    # round 5 is sent 3000 s early in time, after round 4 (whose last event is at +4*600+29 s): lags up to 2429 s
    assert late.value == 2460 and "p99" in late.figures and "10.0% of the sample arrives later" in late.figures
    on_time = _by_key(suggest(cfg, _events(30, 40, 600)))["stream.allowed_lateness_s"]
    assert on_time.value <= 60


def test_apply_writes_the_suggestions():
    import tomllib
    raw = tomllib.loads((ROOT / "configs" / "citibike-h3.toml").read_text())
    cfg = load_config(ROOT / "configs" / "citibike-h3.toml")
    s = suggest(cfg, _events(30, 40, 600))
    out = apply(raw, s)
    by = _by_key(s)
    assert out["anonymization"]["window_s"] == by["anonymization.window_s"].value
    assert out["stream"]["allowed_lateness_s"] == by["stream.allowed_lateness_s"].value
    assert any(q.get("resolutions") == by[f"quasi_identifiers.{q['name']}.resolutions"].value
               for q in out["quasi_identifiers"] if q.get("hierarchy") == "h3")
