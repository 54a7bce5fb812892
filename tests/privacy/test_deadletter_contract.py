"""A dead letter holds no more than the output contract (stream_anon/render.py, ``Renderer.deadletter``): of an
Oyster cards event, only the fields the output publishes (quasi-identifiers' and sensitive fields), the privacy
unit as a keyed pseudonym, times floored to the output's granularity, and a reason naming the field and the
problem without the raw value. ``--deadletter-raw-payload`` alone keeps the rest. (The same contract on every
bundled stream and field: :mod:`stream_anon.contract_checks.deadletters`, run by tests/cli/test_contract_checks.py.)"""
from __future__ import annotations

import orjson
import pytest

from stream_anon import contract, crypto
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.worker.core import WorkerCore
from stream_anon.render import TOPICS

SECRET = b"deadletter-contract-secret-0123456789"
HOSTILE = "Atlantis-<script>-0xDEADBEEF"


def _dead(raw_deadletters: bool = False, mutate=None):
    config = load_config(contract.config_path("oyster-cards"))
    events = load_events("oyster-cards", limit=300)
    bad = dict(events[5])
    bad["event_time"] = bad["event_time"][:17] + "17+00:00"          # an exact second the output never shows
    mutate(bad)
    events[5] = bad
    core = WorkerCore(config, "dl", SECRET, flush_when_idle_s=1e-9, raw_deadletters=raw_deadletters)
    out = core.handle([(0, i, orjson.dumps(e)) for i, e in enumerate(events)]) + core.flush_all()
    dead = [orjson.loads(v) for t, _, v in out if t == TOPICS.deadletter]
    return config, events[5], dead


def _published_fields(config) -> set[str]:
    return {f.split(".")[0] for q in config.quasi_identifiers for f in q.fields} | set(config.sensitive) | \
        {config.stream.privacy_unit, *config.pseudonymize}


def _station(e):
    e["station"] = HOSTILE
    e["bus_route"] = None


@pytest.mark.parametrize("mutate, field", [
    (_station, "location"),
    (lambda e: e.update(full_fare_pence=987654), "full_fare_pence"),
    (lambda e: e.update(event_time="2009-11-09 07:31:17 " + HOSTILE), "event_time"),
    (lambda e: e.update(product_category=HOSTILE), "product_category"),
])
def test_a_dead_letter_holds_only_what_the_output_publishes(mutate, field):
    config, event, dead = _dead(mutate=mutate)
    assert len(dead) == 1
    (d,) = dead
    assert field in d["reason"].split(":")[0] or field in d["reason"].split(":")[1], d["reason"]
    bad_value = str(event.get("station") if field == "location" else event[field])
    assert bad_value not in d["reason"] and HOSTILE not in d["reason"] and "987654" not in d["reason"]
    payload = orjson.loads(d["payload"])
    assert set(payload) <= _published_fields(config) | {config.stream.event_time}, set(payload)
    assert "fare_product" not in payload and "fare_product" in event      # kept out of the output on purpose
    assert "event_id" not in payload and event["event_id"] not in d["payload"]
    unit = config.stream.privacy_unit
    if unit in config.drop:                                     # oyster-cards drops card_id outright
        assert unit not in payload
    else:
        assert payload[unit] == "pseudonym:" + crypto.pseudonym(SECRET, str(event[unit]))[:20]
    for ident in config.identifiers:
        assert str(event[ident]) not in d["payload"]
    t = payload[config.stream.event_time]
    if field == "event_time":
        assert t == "unreadable"
    else:      # floored to time_granularity_s (60 s): the exact second never leaves
        assert event["event_time"].endswith(":17+00:00")
        assert t.endswith(":00+00:00") and t[:16] == event["event_time"][:16]
    assert d["audit_token"] == crypto.audit_token(SECRET, event["event_id"])


def test_the_raw_payload_only_with_the_operator_flag():
    config, event, dead = _dead(raw_deadletters=True, mutate=_station)
    payload = orjson.loads(dead[0]["payload"])
    assert payload["fare_product"] == event["fare_product"] and payload["station"] == HOSTILE
    assert config.stream.privacy_unit not in payload and "event_id" not in payload   # identifiers still redacted
    assert HOSTILE not in dead[0]["reason"]
