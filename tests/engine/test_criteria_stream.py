"""Criteria through the worker and the independent audit (issue 27, "Done when"): Mondrian + distinct 3-diversity of
the fare product on the bundled Oyster slice runs in ``WorkerCore``; the audit's own l-diversity and severity checks
pass on its output and fail on a release tampered to break them; the homogeneity attack that discloses riders' user
type from a naive k-only release learns nothing from an l-diverse one, and the severity rule keeps a severe value out
of a class smaller than its severity (seed 003's penalty at most 1)."""
from __future__ import annotations

import copy
import json
from collections import defaultdict

import numpy as np
import orjson
import pytest

from stream_anon import contract, crypto
from stream_anon.audit import AuditConfig, audit
from stream_anon.audit.primitives import audit_token, covers, qi_value
from stream_anon.config import load_config
from stream_anon.datasets import load_events
from stream_anon.engine import Engine
from stream_anon.worker.core import WorkerCore
from stream_anon.kafka.replay import replay
from stream_anon.kafka.supervise import run_until_accounted
from stream_anon.kafka.topics import ensure_topics
from test_criteria import stream_config

pytestmark = pytest.mark.one_broker        # its broker tests on one broker (tests/conftest.py)

SECRET = b"criteria-stream-secret-0123456789"
PARTITIONS = 2
L3 = [{"kind": "distinct_l_diversity", "field": "fare_product", "l": 3}]
SEVERITY = [{"kind": "severity", "field": "fare_product", "default_severity": 2,
             "severity": {"Freedom Pass (Disabled)": 12, "Freedom Pass (Elderly)": 6, "PAYG": 1}}]


def worker_run(path, events) -> tuple[list, dict]:
    """The events through ``WorkerCore`` (no broker; partitions keyed by the unit's pseudonym as the replay keys
    them; batches of 1,000; every partition flushed): the raw messages and the outputs as the audit reads them."""
    config = load_config(path)
    core = WorkerCore(config, "criteria-test", SECRET)
    msgs, raw, offsets = [], [], [0] * PARTITIONS
    for event in events:
        value = json.dumps(event).encode()
        p = int(crypto.pseudonym(SECRET, str(event[config.stream.privacy_unit]))[:8], 16) % PARTITIONS
        msgs.append((p, offsets[p], value))
        raw.append(((config.stream.input_topic, p, offsets[p]), value))
        offsets[p] += 1
    out = []
    for i in range(0, len(msgs), 1000):
        out += core.handle(msgs[i:i + 1000])
    out += core.flush_all()
    names = contract.topics()
    outputs = {"records": [], "manifests": [], "deadletters": []}
    for topic, _key, value in out:
        key = {names.records(config.stream.name): "records", names.releases: "manifests",
               names.deadletter: "deadletters"}.get(topic)
        if key:
            outputs[key].append(orjson.loads(value))
    return raw, outputs


@pytest.fixture(scope="module")
def oyster_l3(tmp_path_factory):
    path = stream_config(tmp_path_factory.mktemp("l3"), "oyster-l3", criteria=L3)
    raw, outputs = worker_run(path, load_events("oyster"))
    return path, raw, outputs


def failures(report) -> dict:
    return {c: r["violations_by_kind"] for c, r in report.checks.items() if not r["passed"]}


def class_with_values(records, field: str, at_least: int) -> str:
    """A class whose records show at least ``at_least`` distinct values of ``field``."""
    values = defaultdict(set)
    for r in records:
        values[r["class_id"]].add(json.dumps(r["sensitive"].get(field)))
    return next(c for c, v in values.items() if len(v) >= at_least)


def tampered(outputs: dict, class_id: str, field: str, value) -> dict:
    out = copy.deepcopy(outputs)
    for r in out["records"]:
        if r["class_id"] == class_id:
            r["sensitive"][field] = value
    return out


def test_mondrian_with_distinct_3_diversity_runs_in_the_worker_and_passes_the_audit(oyster_l3):
    path, raw, outputs = oyster_l3
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(path))
    assert report.passed, failures(report)
    lv = report.checks["l_diversity"]
    assert lv["classes"] > 500 and lv["lowest"] == {"distinct_l_diversity:fare_product": 3.0}
    # nearly every tap is published: merging repaired the classes Mondrian formed without l
    assert report.summary["published"] >= 0.99 * report.summary["events_in"]


def test_the_audits_l_check_fails_a_release_tampered_to_homogeneity(oyster_l3):
    path, raw, outputs = oyster_l3
    cid = class_with_values(outputs["records"], "fare_product", 3)
    bad = audit(raw, tampered(outputs, cid, "fare_product", "PAYG"), SECRET, AuditConfig.from_toml(path))
    lv = bad.checks["l_diversity"]
    assert not bad.passed and not lv["passed"]
    assert {e["class_id"] for e in lv["examples"]} == {cid}
    assert set(lv["violations_by_kind"]) == {"class below distinct_l_diversity (all releases)",
                                             "class below distinct_l_diversity (at creation)"}


def test_the_audits_severity_check_passes_the_worker_and_fails_a_tampered_release(tmp_path):
    path = stream_config(tmp_path, "oyster-severity", criteria=SEVERITY)
    raw, outputs = worker_run(path, load_events("oyster", limit=12000))
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(path))
    assert report.passed, failures(report)
    assert report.checks["severity"]["classes"] > 100
    # a class where a severe value now sits among too few individuals and breaks AS_e <= l_e
    cid = class_with_values(outputs["records"], "fare_product", 1)
    bad = audit(raw, tampered(outputs, cid, "fare_product", "Freedom Pass (Disabled)"), SECRET,
                AuditConfig.from_toml(path))
    assert not bad.checks["severity"]["passed"] and bad.checks["k"]["passed"]
    assert "average severity above distinct values (all releases)" in bad.checks["severity"]["violations_by_kind"]


# ----------------------------------------------------------------------------------------- homogeneity attack
def homogeneity_attack(records, events, view: AuditConfig, field: str, n_targets: int = 300, seed: int = 0) -> float:
    """Machanavajjhala et al. (TKDD 2007), Sec. 3.1: the adversary knows a target's quasi-identifiers for one event
    and that it is published; every class whose generalization covers them is a candidate; when all their records
    carry one value of ``field`` the target's value is disclosed. Returns the share of targets disclosed."""
    by_token = {audit_token(SECRET, e["event_id"]): e for e in events}
    classes: dict[str, tuple[dict, set]] = {}
    published = []
    for r in records:
        classes.setdefault(r["class_id"], (r["qi"], set()))[1].add(json.dumps(r["sensitive"].get(field)))
        published.append(by_token[r["audit_token"]])
    rng = np.random.default_rng(seed)
    disclosed = 0
    picks = rng.choice(len(published), size=min(n_targets, len(published)), replace=False)
    for i in picks:
        known = [qi_value(q, published[i]) for q in view.quasi_identifiers]
        values = set()
        for qi, vs in classes.values():
            if all(covers(q, qi.get(q.name), v) for q, v in zip(view.quasi_identifiers, known)):
                values |= vs
        disclosed += len(values) == 1
    return disclosed / len(picks)


def test_homogeneity_attack_discloses_a_naive_k_release_and_not_an_l_diverse_one(tmp_path):
    events = load_events("citibike", limit=6000)
    field = "payload.usertype"          # subscriber or customer: most classes of a k-only release hold one
    rates, published = {}, {}
    for name, criteria in (("naive", []), ("ours", [{"kind": "distinct_l_diversity", "field": field, "l": 2}])):
        path = stream_config(tmp_path, name, criteria=criteria, dataset="citibike")
        engine = Engine(load_config(path), secret=SECRET)
        result = engine.process(events)
        result.extend(engine.flush())
        records = [r for rel in result.releases for r in rel.records]
        published[name] = len(records)
        rates[name] = homogeneity_attack(records, events, AuditConfig.from_toml(path), field)
    assert rates["naive"] > 0.5 and rates["ours"] == 0.0, rates
    # the cost: windows without a customer cannot be 2-diverse (5,992 and 3,707 records published)
    assert published["ours"] > 0.5 * published["naive"], published


def test_the_worker_on_a_broker_enforces_l_diversity_and_the_audit_agrees(broker, tmp_path, secret_env):
    from stream_anon.audit.kafka_source import audit_from_kafka

    name = "oysterl3"
    path = stream_config(tmp_path, name, criteria=L3, stream={"name": name, "input_topic": f"raw.test.{name}"})
    cfg = load_config(path)
    ensure_topics(broker.bootstrap, names=[cfg.stream.input_topic, f"anon.{name}.records", "anon.releases",
                                           "anon.deadletter", "anon.metrics"],
                  default_partitions={cfg.stream.input_topic: 2, f"anon.{name}.records": 1})
    events = load_events("oyster", limit=3000)
    replay(broker.bootstrap, cfg.stream.input_topic, events, cfg.stream.privacy_unit, progress=False)
    acc = run_until_accounted(path, broker.bootstrap, tmp_path / "state", len(events), timeout_s=180,
                              log_path=tmp_path / "worker.log")
    assert acc["accounted"] == len(events) and acc["published"] > 0.9 * len(events)
    report = audit_from_kafka(broker.bootstrap, path, secret_env)
    assert report.passed, failures(report)
    assert report.checks["l_diversity"]["lowest"] == {"distinct_l_diversity:fare_product": 3.0}


def worst_severity_penalty(records, events, field: str, severity: dict, default: float) -> float:
    """Seed 003's attack measure (Eq. 5): the largest S(value) / individuals of its class over published records; above
    1 an adversary narrows a severe record (a disability pass) to fewer people than its severity asks."""
    unit_of = {audit_token(SECRET, e["event_id"]): e["journey_id"] for e in events}
    units, worst = defaultdict(set), defaultdict(float)
    for r in records:
        units[r["class_id"]].add(unit_of[r["audit_token"]])
        worst[r["class_id"]] = max(worst[r["class_id"]], severity.get(r["sensitive"].get(field), default))
    return max(worst[c] / len(units[c]) for c in units)


def test_severity_rule_keeps_severe_values_out_of_small_classes(tmp_path):
    events = load_events("oyster", limit=12000)
    (rule,) = SEVERITY
    penalty = {}
    for name, criteria in (("naive", []), ("ours", SEVERITY)):
        path = stream_config(tmp_path, name, criteria=criteria)
        engine = Engine(load_config(path), secret=SECRET)
        result = engine.process(events)
        result.extend(engine.flush())
        records = [r for rel in result.releases for r in rel.records]
        penalty[name] = worst_severity_penalty(records, events, "fare_product", rule["severity"],
                                               rule["default_severity"])
    assert penalty["naive"] > 1.0 >= penalty["ours"], penalty
