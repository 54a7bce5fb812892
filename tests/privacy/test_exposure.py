"""Less exposure in outputs (issue 10 item 7): snapped time bounds, rounded watermarks, sensitive domains, dead
letters with pseudonyms and the key id."""
from __future__ import annotations

from pathlib import Path
import copy

import orjson
import pytest

from stream_anon import crypto
from stream_anon.audit.primitives import QISpec, cover_test
from stream_anon.config import load_config, parse_config
from stream_anon.datasets import load_events
from stream_anon.engine import Engine
from stream_anon.engine.space import parse_time
from stream_anon.errors import ConfigError
from stream_anon.worker.core import WorkerCore
from stream_anon.render import TOPICS

# this checkout's bundled config (an installed stream_anon.configs may belong to another checkout)
OYSTER = Path(__file__).resolve().parents[2] / "configs" / "oyster.toml"
SECRET = b"exposure-secret-3c9e1f0a7b2d4e6f8a1c3e5b7d9f0a2c"


def oyster(**changes):
    """The bundled Oyster config with raw-document changes: {"anonymization": {...}} merged one level deep."""
    cfg = load_config(OYSTER)
    raw = copy.deepcopy(cfg.raw)
    for table, values in changes.items():
        raw[table] = {**raw.get(table, {}), **values}
    return parse_config(raw, base_dir=cfg.source.parent, source=cfg.source)


def run(cfg, events):
    engine = Engine(cfg, secret=SECRET)
    res = engine.process(events)
    return res.extend(engine.flush()), engine


def one_minute_events(n=12, minute="2009-11-09T07:31:00+00:00"):
    base = load_events("oyster", limit=2000)
    rail = [e for e in base if e.get("station") == "Bank"][:1] or base[:1]
    return [dict(rail[0], event_id=f"m{i}", journey_id=f"j{i}", event_time=minute) for i in range(n)]


# ---------------------------------------------------------------------------------------------- time bounds
def test_a_class_of_one_exact_minute_publishes_that_minute_half_open():
    res, _ = run(oyster(), one_minute_events())
    (rel,) = [r for r in res.releases if r.published]
    (cls,) = rel.classes
    assert cls.generalization["time"] == {"from": "2009-11-09T07:31:00+00:00", "to": "2009-11-09T07:32:00+00:00"}


@pytest.mark.parametrize("g", [1, 300, 3600])
def test_time_bounds_snap_outward_to_the_configured_granularity(g):
    events = load_events("oyster", limit=3000)
    res, _ = run(oyster(anonymization={"time_granularity_s": g}), events)
    times = {e["event_id"]: parse_time(e["event_time"]) for e in events}
    by_token = {crypto.audit_token(SECRET, eid): t for eid, t in times.items()}
    iso = {crypto.audit_token(SECRET, e["event_id"]): e["event_time"] for e in events}
    q = QISpec("time", ["event_time"], "timestamp")
    widths = set()
    for rel in res.releases:
        for r in rel.records:
            lo, hi = parse_time(r["qi"]["time"]["from"]), parse_time(r["qi"]["time"]["to"])
            assert lo % g == 0 and hi % g == 0 and hi > lo
            widths.add(hi - lo)
            t = by_token[r["audit_token"]]
            assert lo <= t < hi
            assert cover_test(q, r["qi"]["time"], r["qi"]["time"]["to"]) == (False, "time interval [from, to)")
            assert cover_test(q, r["qi"]["time"], iso[r["audit_token"]])[0]     # the audit agrees
    assert min(widths) >= g


def test_time_granularity_must_be_positive():
    for bad in (0, -60):
        with pytest.raises(ConfigError, match="anonymization.time_granularity_s"):
            oyster(anonymization={"time_granularity_s": bad})


def test_manifest_watermark_is_the_window_start_not_the_latest_event_time():
    events = load_events("oyster", limit=3000)
    res, _ = run(oyster(), events)
    assert res.releases
    for rel in res.releases:
        m = rel.manifest()
        assert m["watermark"] == m["window_start"]
        assert rel.watermark != rel.window_start or rel.watermark % 900 == 0   # the exact value stays internal


# ---------------------------------------------------------------------------------------------- sensitive domains
def test_free_text_outside_its_domain_is_never_published():
    events = one_minute_events()
    hostile = ["<script>alert(1)</script>", "'; DROP TABLE fares; --", "PAYG\x00", "x" * 500]
    for e, v in zip(events, hostile):
        e["fare_product"] = v
    res, _ = run(oyster(), events)
    published = [r["sensitive"]["fare_product"] for rel in res.releases for r in rel.records]
    assert len(published) == len(events) and not set(hostile) & set(published)
    assert published.count("Other") == len(hostile)


def test_values_outside_a_domain_without_other_are_dead_lettered_with_a_reason():
    events = one_minute_events()
    events[0]["full_fare_pence"] = 10 ** 12
    events[1]["daily_capping"] = "yes"
    events[2]["full_fare_pence"] = 12.5
    events[3]["discounted_fare_pence"] = {"$gt": 0}
    res, _ = run(oyster(), events)
    reasons = {r.event["event_id"]: r.reason for r in res.rejected}
    assert reasons == {
        "m0": "sensitive full_fare_pence: number outside its domain [0, 2000]",
        "m1": "sensitive daily_capping: a string is not a boolean",
        "m2": "sensitive full_fare_pence: number is not an integer",
        "m3": "sensitive discounted_fare_pence: a object is not a number"}


def test_undeclared_sensitive_fields_get_the_safe_scalar_domain():
    raw = copy.deepcopy(load_config(OYSTER).raw)
    raw["sensitive"].pop("domains")
    cfg = parse_config(raw, base_dir=load_config(OYSTER).source.parent)
    events = one_minute_events()
    events[0]["fare_product"] = "<b>"
    events[1]["fare_product"] = "LUL Travelcard-7 Day"
    events[2]["full_fare_pence"] = 2 ** 60
    res, _ = run(cfg, events)
    assert {r.event["event_id"] for r in res.rejected} == {"m0", "m2"}


@pytest.mark.parametrize("domain, message", [
    ({"type": "colour"}, "type: must be one of"),
    ({"type": "category", "values": []}, "values: expected a non-empty list"),
    ({"type": "category", "values": ["a"], "other": "b"}, "other: 'b' must be one of"),
    ({"type": "number", "lower": 5, "upper": 1}, r"lower: must not be above upper \(1.0\), got 5.0"),
    ({"type": "number", "lower": float("nan"), "upper": 1}, "lower: expected a finite number"),
    ({"type": "text", "charset": "a-"}, None),
    ({"type": "text", "max_length": 0}, r"max_length: must be in \[1, 65536\], got 0"),
    ({"type": "number", "lower": 0, "upper": 1, "values": [1]}, "values: not a key of a number domain"),
])
def test_domain_errors_name_the_key(domain, message):
    if message is None:
        oyster(sensitive={"domains": {"fare_product": domain}})     # a valid character class
        return
    with pytest.raises(ConfigError, match=f"sensitive.domains.fare_product.*{message}"):
        oyster(sensitive={"domains": {"fare_product": domain}})
    with pytest.raises(ConfigError, match="sensitive.domains.journey_x: not one of sensitive.fields"):
        oyster(sensitive={"domains": {"journey_x": {"type": "boolean"}}})


# ---------------------------------------------------------------------------------------------- dead letters, kid
def _worker(cfg, tmp_path, messages):
    core = WorkerCore(cfg, "exp", SECRET, flush_when_idle_s=1e-9)
    out = core.handle(messages) + core.flush_all()
    return [(topic, orjson.loads(value)) for topic, _, value in out]


def test_dead_letters_carry_pseudonyms_for_pseudonymized_identifiers_and_the_key_id(tmp_path):
    cfg = oyster(identifiers={"drop": ["event_id"], "pseudonymize": ["card_id"]})
    assert cfg.pseudonymize == ("card_id",)
    events = one_minute_events()
    for i, e in enumerate(events):
        e["card_id"] = f"card-{i:04d}"
    events[0]["full_fare_pence"] = -5          # dead-lettered by the reader
    sent = _worker(cfg, tmp_path, [(0, i, orjson.dumps(e)) for i, e in enumerate(events)])
    dead = [d for t, d in sent if t == TOPICS.deadletter]
    assert len(dead) == 1
    (d,) = dead
    payload = orjson.loads(d["payload"])
    assert payload["card_id"] == "pseudonym:" + crypto.pseudonym(SECRET, "card-0000")[:20]
    assert payload["journey_id"] == "pseudonym:" + crypto.pseudonym(SECRET, "j0")[:20]   # the privacy unit
    assert "event_id" not in payload and "card-0000" not in d["payload"] and '"j0"' not in d["payload"]
    assert d["kid"] == crypto.key_id(SECRET) and d["audit_token"] == crypto.audit_token(SECRET, "m0")
    assert d["source"] == {"topic": cfg.stream.input_topic, "partition": 0, "offset": 0}
    manifests = [m for t, m in sent if t == TOPICS.releases]
    assert manifests and all(m["kid"] == crypto.key_id(SECRET) for m in manifests)
