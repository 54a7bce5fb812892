"""Unit tests of the independent audit (no broker): a correct release passes, each broken variant fails."""
from __future__ import annotations

import copy
import hashlib
import hmac
import json

import pytest

from stream_anon.audit import AuditConfig, AuditOutputs, QISpec, audit

SECRET = b"test-secret-0123456789abcdef"
TOPIC = "raw.fare.test"
HIER = {"name": "loc", "levels": ["value", "zone", "network", "*"],
        "tree": {"*": {"Rail": {"Zone 1": ["Aldgate", "Bank"], "Zone 3": ["Ealing"]}, "Bus": {"Routes 1-99": ["7"]}}}}


def tok(event_id: str) -> str:
    return hmac.new(SECRET, b"audit:" + event_id.encode(), hashlib.sha256).hexdigest()


def pseud(unit: str) -> str:
    return hmac.new(SECRET, b"unit:" + unit.encode(), hashlib.sha256).hexdigest()


def cfg() -> AuditConfig:
    return AuditConfig(
        k=2, privacy_unit="journey_id", identifier_fields=["journey_id", "card_id"],
        quasi_identifiers=[("time", "event_time", "timestamp", None),
                           QISpec("location", ["station", "bus_route"], "station", HIER),
                           QISpec("age", "signals.birth_year", "numeric", None, 1900, 2020)],
        sensitive_fields=["fare_pence"], stream="test",
        max_suppression_ratio=0.5)      # the hand-made releases suppress 1 of 6-8 events on purpose


def ev(eid, journey, station, minute, card="CARD-77777", birth=1980):
    return {"event_id": eid, "kind": "fare", "event_type": "tap_in", "journey_id": journey, "card_id": card,
            "station": station, "bus_route": None, "event_time": f"2009-11-09T07:{minute:02d}:00+00:00",
            "fare_pence": 240, "signals": {"birth_year": birth}}


def rec(rid, cid, eid, t0, t1, label="Zone 1", age=(1970, 1989)):
    return {"release_id": rid, "class_id": cid,
            "qi": {"time": {"from": f"2009-11-09T07:{t0:02d}:00+00:00", "to": f"2009-11-09T07:{t1:02d}:00+00:00"},
                   "location": {"label": label}, "age": {"from": age[0], "to": age[1]}},
            "sensitive": {"fare_pence": 240}, "audit_token": tok(eid)}


def scenario():
    """Two releases of partition 0; class c1 created in R1 and reused in R2 (two new individuals); c2 created in
    R2."""
    events = [ev("e1", "J1001", "Aldgate", 1), ev("e2", "J1002", "Bank", 3), ev("e3", "J1003", "Bank", 5),
              ev("e4", "J1001", "Aldgate", 20), ev("e5", "J1005", "Ealing", 2), ev("e6", "J1006", "Bank", 40),
              ev("e7", "J1004", "Bank", 22)]
    raw = [((TOPIC, 0, i), json.dumps(e).encode()) for i, e in enumerate(events)]
    raw.append(((TOPIC, 0, len(raw)), b"{not json"))
    raw.append(((TOPIC, 0, len(raw)), json.dumps(ev("e8", "J1008", "Bank", 6)).encode()))
    r1, r2 = "test-p0-000001", "test-p0-000002"
    c1, c2 = "test-p0-000001-c0001", "test-p0-000002-c0001"
    records = [rec(r1, c1, "e1", 0, 10), rec(r1, c1, "e2", 0, 10),
               rec(r2, c1, "e3", 0, 10), rec(r2, c1, "e8", 0, 10), rec(r2, c2, "e4", 15, 29),
               rec(r2, c2, "e7", 15, 29)]
    gen = {c: next(r["qi"] for r in records if r["class_id"] == c) for c in (c1, c2)}

    def manifest(rid, seq, classes, suppressed, deferred):
        return {"release_id": rid, "stream": "test", "partition": 0, "seq": seq, "k": 2,
                "window_start": "x", "window_end": "y", "watermark": "z",
                "classes": [{"class_id": c, "generalization": gen[c], "individuals": n, "records": n,
                             "ncp": 0.1, "reused": reused} for c, n, reused in classes],
                "published": sum(n for _, n, _ in classes),
                "suppressed": {r: len(t) for r, t in suppressed.items()},
                "suppressed_tokens": suppressed, "deferred": len(deferred), "deferred_tokens": deferred,
                "ncp_mean": 0.1, "suppression_ratio": 0.0, "suppression_limit_exceeded": False,
                "created_at": "2024-01-01T00:00:00+00:00"}

    manifests = [manifest(r1, 1, [(c1, 2, False)], {"ncp": [tok("e5")]}, [tok("e3"), tok("e6")]),
                 manifest(r2, 2, [(c1, 2, True), (c2, 2, False)], {}, [tok("e6")])]
    deadletters = [{"reason": "malformed_json", "stream": "test", "source": {"topic": TOPIC, "partition": 0,
                                                                             "offset": 7},
                    "payload": "{not json", "received_at": "now"}]
    return raw, {"records": records, "manifests": manifests, "deadletters": deadletters}


def run(raw, outputs):
    return audit(raw, outputs, SECRET, cfg())


def failed(report):
    return sorted(name for name, c in report.checks.items() if not c["passed"])


def set_raw(raw, eid, **changes):
    for i, (src, payload) in enumerate(raw):
        try:
            e = json.loads(payload)
        except ValueError:
            continue
        if e["event_id"] == eid:
            e.update(changes)
            raw[i] = (src, json.dumps(e).encode())
            return
    raise KeyError(eid)


def test_correct_release_passes():
    raw, out = scenario()
    report = run(raw, out)
    assert report.passed, report.format_text()
    s = report.summary
    assert (s["events_in"], s["published"], s["suppressed"], s["dead_lettered"], s["deferred"]) == (9, 6, 1, 1, 1)
    assert s["lost"] == s["duplicated"] == 0
    assert s["suppressed_by_reason"] == {"ncp": 1}
    assert s["min_individuals"] == 2 and s["classes"] == 2
    assert report.checks["accounting"]["balanced"]
    assert json.dumps(report.to_dict())  # JSON-serializable
    assert "AUDIT PASSED" in report.format_text()


def test_outputs_object_accepted():
    raw, out = scenario()
    assert run(raw, AuditOutputs(**out)).passed


def test_class_with_k_minus_1_individuals_fails():
    raw, out = scenario()
    set_raw(raw, "e7", journey_id="J1001")  # c2 keeps 2 records, but both are journey J1001
    out["manifests"][1]["classes"][1]["individuals"] = 1      # as a manifest of that release states it
    report = run(raw, out)
    assert failed(report) == ["k"]
    assert report.checks["k"]["min_individuals"] == 1
    assert "class below k at creation" in report.checks["k"]["violations_by_kind"]


def test_class_reaching_k_only_later_fails_at_creation():
    raw, out = scenario()
    set_raw(raw, "e2", journey_id="J1001")  # c1 has J1001 only in R1; J1003 joins it in R2
    out["manifests"][0]["classes"][0]["individuals"] = 1      # as a manifest of that release states it
    report = run(raw, out)
    assert failed(report) == ["k"]
    assert report.checks["k"]["violations_by_kind"] == {"class below k at creation": 1}


def test_time_interval_not_covering_fails():
    raw, out = scenario()
    set_raw(raw, "e1", event_time="2009-11-09T06:50:00+00:00")
    assert failed(run(raw, out)) == ["coverage"]


def test_station_label_not_ancestor_fails():
    raw, out = scenario()
    set_raw(raw, "e2", station="Ealing")  # Ealing is in Zone 3, published as Zone 1
    report = run(raw, out)
    assert failed(report) == ["coverage"]
    assert "location" in report.checks["coverage"]["examples"][0]["violation"]


def test_numeric_and_null_values():
    raw, out = scenario()
    set_raw(raw, "e1", signals={"birth_year": 1995})  # outside [1970, 1989]
    assert failed(run(raw, out)) == ["coverage"]
    raw, out = scenario()
    set_raw(raw, "e1", station=None)  # null raw value under a non-root label
    assert failed(run(raw, out)) == ["coverage"]
    for r in out["records"] + [c for m in out["manifests"] for c in m["classes"]]:
        qi = r["qi"] if "qi" in r else r["generalization"]
        if r["class_id"].endswith("000001-c0001"):
            qi["location"] = {"label": "*"}
    assert run(raw, out).passed  # "*" covers the null station (and Aldgate/Bank)


def test_leaked_raw_journey_id_fails():
    raw, out = scenario()
    out["records"][0]["sensitive"]["note"] = "journey J1002 tapped"
    report = run(raw, out)
    assert failed(report) == ["leaks"]
    assert "leaked raw journey_id" in report.checks["leaks"]["violations_by_kind"]


def test_leaked_card_id_in_manifest_key_fails():
    raw, out = scenario()
    out["manifests"][0]["suppressed_tokens"]["CARD-77777"] = []
    assert "leaks" in failed(run(raw, out))


@pytest.mark.parametrize("cut", [64, 32, 16])
def test_leaked_pseudonym_fails(cut):
    raw, out = scenario()
    out["records"][1]["sensitive"]["ref"] = "key=" + pseud("J1002")[:cut]
    report = run(raw, out)
    assert failed(report) == ["leaks"]


def test_no_false_positive_for_short_or_hierarchy_values():
    raw, out = scenario()
    set_raw(raw, "e1", card_id="7")  # short id equal to a hierarchy leaf "7": not a leak
    set_raw(raw, "e2", card_id="Zone 1")  # id equal to a hierarchy label: published legitimately
    assert run(raw, out).passed


def test_lost_event_fails():
    raw, out = scenario()
    out["manifests"][1]["deferred_tokens"] = []  # e6 only deferred in the older manifest: lost
    out["manifests"][1]["deferred"] = 0
    report = run(raw, out)
    assert failed(report) == ["accounting"]
    assert report.summary["lost"] == 1
    assert not report.checks["accounting"]["balanced"]


def test_malformed_raw_not_deadlettered_is_lost():
    raw, out = scenario()
    out["deadletters"] = []
    report = run(raw, out)
    assert failed(report) == ["accounting"] and report.summary["lost"] == 1


def test_published_and_suppressed_is_duplicated():
    raw, out = scenario()
    out["manifests"][1]["suppressed_tokens"] = {"deadline": [tok("e1")]}
    out["manifests"][1]["suppressed"] = {"deadline": 1}
    report = run(raw, out)
    assert failed(report) == ["accounting"]
    assert report.summary["duplicated"] == 1


def test_record_of_unknown_event_fails():
    raw, out = scenario()
    out["records"][0]["audit_token"] = tok("ghost")
    assert {"accounting", "k"} <= set(failed(run(raw, out)))


def test_manifest_count_mismatch_fails():
    raw, out = scenario()
    out["manifests"][0]["published"] = 3
    assert failed(run(raw, out)) == ["consistency"]
    raw, out = scenario()
    del out["records"][2]  # R2's reused class c1 claims 1 record, none published
    assert "consistency" in failed(run(raw, out))


def test_identical_duplicate_releases_are_deduped():
    raw, out = scenario()
    again = copy.deepcopy(out["manifests"][0])
    again["created_at"] = "2024-01-01T00:05:00+00:00"  # wall clock of the restarted worker
    out["manifests"].append(again)
    out["records"] += copy.deepcopy([r for r in out["records"] if r["release_id"] == "test-p0-000001"])
    out["manifests"].append(copy.deepcopy(out["manifests"][1]))
    report = run(raw, out)
    assert report.passed, report.format_text()
    assert report.summary["published"] == 6 and report.summary["duplicated"] == 0
    assert report.checks["duplicates"]["duplicate_manifests"] == 2
    assert report.checks["duplicates"]["duplicate_records"] == 2


def test_conflicting_duplicate_release_fails():
    raw, out = scenario()
    again = copy.deepcopy(out["manifests"][0])
    again["classes"][0]["ncp"] = 0.5
    out["manifests"].append(again)
    assert "duplicates" in failed(run(raw, out))
    raw, out = scenario()
    dup = copy.deepcopy(out["records"][0])
    dup["qi"]["time"]["from"] = "2009-11-09T07:01:00+00:00"
    out["records"].append(dup)
    report = run(raw, out)
    assert "duplicates" in failed(report)
    assert "conflicting duplicate release" in report.checks["duplicates"]["violations_by_kind"]


def test_other_stream_outputs_ignored():
    raw, out = scenario()
    other = copy.deepcopy(out["manifests"][0])
    other.update(stream="other", release_id="other-p0-000001")
    out["manifests"].append(other)
    assert run(raw, out).passed


def test_from_toml(tmp_path):
    (tmp_path / "hierarchies").mkdir()
    (tmp_path / "hierarchies" / "loc.json").write_text(json.dumps(HIER))
    (tmp_path / "test.toml").write_text("""
[stream]
name = "test"
kind = "fare"
input_topic = "raw.fare.test"
privacy_unit = "journey_id"
event_time = "event_time"
[anonymization]
k = 2
max_suppression_ratio = 0.5
[[quasi_identifiers]]
name = "time"
field = "event_time"
kind = "timestamp"
lower = "2009-11-09T00:00:00+00:00"
upper = "2009-11-10T06:00:00+00:00"
[[quasi_identifiers]]
name = "location"
field = ["station", "bus_route"]
kind = "station"
hierarchy = "hierarchies/loc.json"
[[quasi_identifiers]]
name = "age"
field = "signals.birth_year"
kind = "numeric"
lower = 1900
upper = 2020
[sensitive]
fields = ["fare_pence"]
[identifiers]
drop = ["journey_id", "card_id"]
""")
    c = AuditConfig.from_toml(tmp_path / "test.toml")
    assert c.k == 2 and c.stream == "test" and c.identifier_fields == ["journey_id", "card_id"]
    assert c.input_topic == "raw.fare.test" and c.m is None and c.invariant is None
    assert c.quasi_identifiers[1].hierarchy.covers("Rail", "Bank")
    assert not c.quasi_identifiers[1].hierarchy.covers("Zone 3", "Bank")
    raw, out = scenario()
    assert audit(raw, out, SECRET, c).passed


def test_geopoint_box_coverage():
    c = AuditConfig(k=1, privacy_unit="vehicle_id", quasi_identifiers=[("pos", ["latitude", "longitude"], "geopoint", None)])
    event = {"event_id": "v1", "event_type": "trip", "vehicle_id": "BIKE-12345", "latitude": 40.7123,
             "longitude": -74.0412}
    raw = [((TOPIC, 0, 0), json.dumps(event))]

    def outputs(box):
        r = {"release_id": "t-p0-000001", "class_id": "t-p0-000001-c0001",
             "qi": {"pos": box}, "sensitive": {}, "audit_token": tok("v1")}
        m = {"release_id": "t-p0-000001", "stream": "t", "partition": 0, "seq": 1, "published": 1,
             "classes": [{"class_id": r["class_id"], "generalization": r["qi"], "records": 1, "reused": False}],
             "suppressed_tokens": {}, "deferred_tokens": []}
        return {"records": [r], "manifests": [m], "deadletters": []}

    assert audit(raw, outputs({"lat": [40.712, 40.713], "lon": [-74.042, -74.041]}), SECRET, c).passed
    bad = audit(raw, outputs({"lat": [40.713, 40.714], "lon": [-74.042, -74.041]}), SECRET, c)
    assert failed(bad) == ["coverage"]


def test_raw_event_type_beside_class_fails():
    """A raw event type published next to a class box splits the class for an adversary who knows it."""
    raw, out = scenario()
    out["records"][0]["event_type"] = "tap_in"
    assert "coverage" in failed(run(raw, out))


def test_m_without_invariant_fails_the_m_invariance_check():
    raw, out = scenario()
    c = cfg()
    c.m = 2
    report = audit(raw, out, SECRET, c)
    assert failed(report) == ["m_invariance"]
    assert report.checks["m_invariance"]["violations_by_kind"] == {
        "anonymization.m is set but sensitive.invariant is not": 1}


def test_hierarchy_keeps_the_tree_order():
    """Labels in pre-order as written: the naive baseline orders leaves by it."""
    h = QISpec("location", "station", "station", HIER).hierarchy
    assert list(h.parent) == ["*", "Rail", "Zone 1", "Aldgate", "Bank", "Zone 3", "Ealing", "Bus", "Routes 1-99", "7"]
    assert h.roots == {"*"} and h.parent["Bank"] == "Zone 1" and h.parent["7"] == "Routes 1-99"


# ----------------------------------------------------------------------------------------------- hostile input
DEPTH = 100_000


def with_raw(raw, out, payload, dead_lettered: bool):
    """The scenario plus one raw message at the next offset, dead-lettered by the engine or not."""
    offset = len(raw)
    raw = [*raw, ((TOPIC, 0, offset), payload)]
    if dead_lettered:
        out["deadletters"].append({"reason": "malformed_json", "stream": "test", "payload": "...",
                                   "source": {"topic": TOPIC, "partition": 0, "offset": offset}})
    return raw, out


@pytest.mark.parametrize("dead_lettered", [True, False])
def test_deeply_nested_raw_json_is_reported_not_a_crash(dead_lettered):
    nested = b'{"event_id": "e9", "journey_id": "J1009", "x": ' + b"[" * DEPTH + b"]" * DEPTH + b"}"
    raw, out = with_raw(*scenario(), nested, dead_lettered)
    report = run(raw, out)
    assert report.summary["events_in"] == 10
    if dead_lettered:      # the worker's decoder refuses it too: one more dead letter, nothing lost
        assert report.passed, report.format_text()
        assert report.summary["dead_lettered"] == 2
    else:                  # unparseable for the audit and found nowhere: lost
        assert failed(report) == ["accounting"] and report.summary["lost"] == 1


@pytest.mark.parametrize("dead_lettered", [True, False])
def test_lone_surrogate_event_id_is_reported_not_a_crash(dead_lettered):
    event = ev("e9\ud800", "J10\udc09", "Bank", 30)           # JSON escapes may carry lone surrogates
    raw, out = with_raw(*scenario(), json.dumps(event).encode(), dead_lettered)
    report = run(raw, out)
    assert report.summary["events_in"] == 10
    if dead_lettered:
        assert report.passed, report.format_text()
        assert report.summary["dead_lettered"] == 2
    else:
        assert failed(report) == ["accounting"] and report.summary["lost"] == 1


def test_deeply_nested_output_record_is_malformed_not_a_crash():
    raw, out = scenario()
    deep: list = []
    for _ in range(DEPTH):
        deep = [deep]
    out["records"].append({**copy.deepcopy(out["records"][0]), "audit_token": tok("e9"), "extra": deep})
    report = run(raw, out)
    assert failed(report) == ["consistency"]
    assert report.checks["consistency"]["violations_by_kind"] == {"malformed output message": 1}
    assert report.summary["records"] == 6              # the other records are audited as before


# ---------------------------------------------------------------------- one event id on several raw messages
def test_record_stands_for_the_copy_not_dead_lettered():
    """A hostile copy of e2 (another journey, another station) arrives first and is dead-lettered; the worker then
    publishes the real e2. The record is the real e2's: counting the copy's journey (J1001, already in the class)
    made the class one individual short and its station (Ealing) uncovered by "Zone 1"."""
    raw, out = scenario()
    raw = [((TOPIC, 0, off + 1), payload) for (_, _, off), payload in raw]       # room for the copy at offset 0
    for d in out["deadletters"]:
        d["source"]["offset"] += 1
    copy_ = ev("e2", "J1001", "Ealing", 3)
    raw.insert(0, ((TOPIC, 0, 0), json.dumps(copy_).encode()))
    out["deadletters"].append({"reason": "schema: ...", "stream": "test", "payload": "...", "audit_token": tok("e2"),
                               "source": {"topic": TOPIC, "partition": 0, "offset": 0}})
    report = run(raw, out)
    assert report.passed, report.format_text()
    assert report.summary["min_individuals"] == 2 and report.summary["dead_lettered"] == 2


def test_record_stands_for_the_copy_on_its_release_partition():
    """e1 arrives on partitions 0 and 1 with different journeys and stations (the worker's duplicate check is per
    partition): each partition publishes its own copy, and each record is judged against its own partition's."""
    raw, out = scenario()
    p1 = [ev("e1", "J2001", "Ealing", 2), ev("e8", "J2008", "Ealing", 4)]
    raw += [((TOPIC, 1, i), json.dumps(e).encode()) for i, e in enumerate(p1)]
    rid, cid = "test-p1-000001", "test-p1-000001-c0001"
    recs = [rec(rid, cid, "e1", 0, 10, label="Zone 3"), rec(rid, cid, "e8", 0, 10, label="Zone 3")]
    out["records"] += recs
    out["manifests"].append({**copy.deepcopy(out["manifests"][0]), "release_id": rid, "partition": 1, "seq": 1,
                             "classes": [{"class_id": cid, "generalization": recs[0]["qi"], "individuals": 2,
                                          "records": 2, "ncp": 0.1, "reused": False}],
                             "published": 2, "suppressed": {}, "suppressed_tokens": {}, "deferred": 0,
                             "deferred_tokens": []})
    report = run(raw, out)
    assert report.passed, report.format_text()
    assert report.summary["published"] == 8


# ---------------------------------------------------------------------- reading a topic from the broker
class _Msg:
    def __init__(self, offset):
        self.topic, self.partition, self.offset, self.value, self.timestamp = "raw.t", 0, offset, b"{}", 0


class _FakeConsumer:
    """A kafka-python consumer of one partition delivering ``total`` messages (None: a topic that keeps growing),
    ``per_poll`` at a time."""

    total: int | None = None
    per_poll = 50

    def __init__(self, **_):
        self.next = 0

    def partitions_for_topic(self, topic):
        return {0}

    def assign(self, tps):
        self.tps = tps

    def seek(self, tp, offset):
        pass

    def poll(self, timeout_ms=0):
        end = self.next + self.per_poll if self.total is None else min(self.total, self.next + self.per_poll)
        msgs = [_Msg(o) for o in range(self.next, end)]
        self.next = end
        return {self.tps[0]: msgs} if msgs else {}

    def close(self):
        pass


@pytest.mark.parametrize("total", [120, None])
def test_read_topic_complete_raises_instead_of_returning_a_prefix(monkeypatch, total):
    """A raw topic still delivering when the time bound ran out was audited as if it ended there (a 700 MB fuzzed
    topic lost its last 972 messages at 120 s: their dead letters were "of unknown source")."""
    import kafka

    from stream_anon.audit import kafka_source
    monkeypatch.setattr(kafka, "KafkaConsumer", type("C", (_FakeConsumer,), {"total": total}))
    if total is not None:          # a topic that goes quiet is read whole, complete or not
        assert len(kafka_source.read_topic("localhost:9", "raw.t", idle_s=0.05, max_wait_s=5, complete=True)) == 120
        return
    prefix = kafka_source.read_topic("localhost:9", "raw.t", idle_s=0.05, max_wait_s=0.3)
    assert len(prefix) > 0                                   # without ``complete``: what was read (live topics)
    with pytest.raises(kafka_source.IncompleteRead, match="more still arriving"):
        kafka_source.read_topic("localhost:9", "raw.t", idle_s=0.05, max_wait_s=0.3, complete=True)


def test_reused_class_gaining_one_individual_in_a_release_fails_release_delta():
    """A reader of the releases in order sees R2's additions to c1 apart from its members of R1: one individual
    there is singled out, though the class holds three over its releases."""
    raw, out = scenario()
    out["records"] = [r for r in out["records"] if r["audit_token"] != tok("e8")]
    out["manifests"][1]["classes"][0].update(individuals=1, records=1)
    out["manifests"][1]["published"] -= 1
    out["manifests"][1]["deferred_tokens"].append(tok("e8"))
    out["manifests"][1]["deferred"] += 1
    report = run(raw, out)
    assert failed(report) == ["release_delta"], report.format_text()
    chk = report.checks["release_delta"]
    assert chk["examples"][0] == {"violation": "release adds fewer than k individuals to a reused class",
                                  "release_id": "test-p0-000002", "class_id": "test-p0-000001-c0001",
                                  "individuals": 1, "k": 2}
    assert (chk["min_candidates"], chk["singled_out"]) == (1, 1)


def test_health_states_the_share_of_records_published_as_the_whole_domain():
    raw, out = scenario()
    c2 = "test-p0-000002-c0001"
    for r in out["records"]:
        if r["class_id"] == c2:
            r["qi"]["age"] = {"from": 1900, "to": 2020}          # the declared bounds of age
    for c in out["manifests"][1]["classes"]:
        if c["class_id"] == c2:
            c["generalization"] = out["records"][-1]["qi"]
    report = run(raw, out)
    assert report.passed, report.format_text()
    whole = report.health["whole_domain"]
    assert whole["run"] == {"location": 0.0, "age": round(2 / 6, 6)}
    assert whole["releases"] == {"test-p0-000001": {"location": 0.0, "age": 0.0},
                                 "test-p0-000002": {"location": 0.0, "age": 0.5}}
    assert "published as the whole domain (share of records): location=0.0, age=0.333333; highest in one release: " \
        "location=0.0, age=0.5" in report.format_text()
