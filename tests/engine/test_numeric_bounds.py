"""No exact member value in a numeric bound: a numeric quasi-identifier's published bounds are snapped outward to its
granularity (stream_anon/engine/space.py, ``snap_numeric``), and the audit's leak check fails a bound off the grid
that equals a member's value. Run on the bundled Citi Bike slice with birth years made real-valued (an odometer-like
reading), as the engine publishes it."""
from __future__ import annotations

import copy
import json

import pytest

from stream_anon import contract
from stream_anon.audit import AuditConfig, audit
from stream_anon.config import load_config, parse_config
from stream_anon.datasets import load_events
from stream_anon.engine import Engine
from stream_anon.errors import ConfigError
from stream_anon.render import Renderer

SECRET = b"numeric-bounds-secret-0123456789abcd"
TOPIC = "raw.vehicle.citibike"


def _config(tmp_path, granularity=None):
    base = load_config(contract.config_path("citibike"))
    raw = copy.deepcopy(base.raw)
    for q in raw["quasi_identifiers"]:
        if q["name"] == "birth_year":
            q["lower"], q["upper"] = 1931.0, 1999.5
            if granularity is not None:
                q["granularity"] = granularity
    cfg = parse_config(raw, base_dir=base.source.parent, source=base.source)
    return cfg, raw


def _events():
    events = load_events("citibike", limit=4000)
    out = []
    for i, e in enumerate(events):
        e = copy.deepcopy(e)
        if e["signals"].get("birth_year") is not None:
            e["signals"]["birth_year"] = float(e["signals"]["birth_year"]) + (i % 97) / 100 + 0.003
        out.append(e)
    return out


def _publish(cfg, events):
    engine = Engine(cfg, partition=0, secret=SECRET)
    render = Renderer(cfg, SECRET)
    records, manifests = [], []
    for rel in [*engine.process(events).releases, *engine.flush().releases]:
        msgs, _, _ = render.release(rel)
        for topic, _, value in msgs:
            doc = json.loads(value)
            if "class_id" in doc and "audit_token" in doc:
                records.append(doc)
            elif "classes" in doc:
                manifests.append(doc)
    return records, manifests


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    cfg, raw = _config(tmp_path_factory.mktemp("nb"), granularity=0.5)
    events = _events()
    records, manifests = _publish(cfg, events)
    raw_msgs = [((TOPIC, 0, i), json.dumps(e).encode()) for i, e in enumerate(events)]
    return cfg, events, records, manifests, raw_msgs


def _audit_cfg(granularity):
    acfg = AuditConfig.from_toml(contract.config_path("citibike"))
    for q in acfg.quasi_identifiers:
        if q.name == "birth_year":
            q.lower, q.upper, q.granularity = 1931.0, 1999.5, granularity
    return acfg


def test_no_numeric_bound_is_a_members_exact_value(published):
    cfg, events, records, _, _ = published
    values = {e["signals"]["birth_year"] for e in events if e["signals"].get("birth_year") is not None}
    bounds = [b for r in records for b in (r["qi"]["birth_year"]["from"], r["qi"]["birth_year"]["to"])]
    assert len(records) > 1000 and len(set(bounds)) > 10
    assert not values & set(bounds)
    assert all(float(b * 2).is_integer() for b in bounds)                       # on the 0.5 grid
    for r in records:           # closed intervals that still cover their members, never zero width
        assert r["qi"]["birth_year"]["from"] < r["qi"]["birth_year"]["to"]


def test_the_audit_passes_on_snapped_bounds_and_fails_exact_ones(published):
    _, _, records, manifests, raw_msgs = published
    acfg = _audit_cfg(0.5)
    report = audit(raw_msgs, {"records": records, "manifests": manifests}, SECRET, acfg)
    leaks = report.checks["leaks"]
    assert leaks["passed"] and leaks["numeric_bounds_checked"] == 2 * len(records), leaks["examples"]
    assert report.checks["coverage"]["passed"]
    # the naive release: a class's bounds at its members' exact extremes (what the engine published before)
    by_token = {}
    for src, payload in raw_msgs:
        e = json.loads(payload)
        from stream_anon.audit.primitives import audit_token
        by_token[audit_token(SECRET, e["event_id"])] = e["signals"].get("birth_year")
    naive = copy.deepcopy(records)
    per_class: dict = {}
    for r in naive:
        v = by_token[r["audit_token"]]
        if v is not None:
            per_class.setdefault(r["class_id"], []).append(v)
    for r in naive:
        vals = per_class.get(r["class_id"])
        if vals:
            r["qi"]["birth_year"] = {"from": min(vals), "to": max(vals)}
    leaks = audit(raw_msgs, {"records": naive, "manifests": manifests}, SECRET, acfg).checks["leaks"]
    assert not leaks["passed"]
    assert leaks["violations_by_kind"]["numeric bound equals a member's value"] >= len(per_class)
    # without a granularity the audit cannot tell a grid from a member's value: not checked
    assert audit(raw_msgs, {"records": naive, "manifests": manifests}, SECRET,
                 _audit_cfg(None)).checks["leaks"]["passed"]


def test_granularity_key_is_validated(tmp_path):
    assert _config(tmp_path)[0].quasi_identifiers[-1].granularity == 0.1     # 1% of 68.5, a power of ten
    with pytest.raises(ConfigError, match="granularity"):
        _config(tmp_path, granularity=0)
    with pytest.raises(ConfigError, match="granularity"):
        _config(tmp_path, granularity=1000)
