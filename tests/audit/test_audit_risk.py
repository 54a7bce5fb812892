"""The audit's re-identification risk per release (stream_anon/audit/risk.py) against hand-counted classes, the
worker's release metric against it, ``--max-prosecutor-risk`` on k = 10 output and on a release tampered to hold a
class of 5, and the cross-release candidate sets against the intersection attack of stream_anon.attacks."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from stream_anon.audit import AuditConfig, audit
from stream_anon.audit.inputs import build_context
from stream_anon.audit.risk import intersection_candidates, release_class_sizes
from stream_anon.risk import RiskSettings, release_risk

import test_audit as hand

SECRET = b"risk-audit-secret-0123456789abcdef"


# ------------------------------------------------------------------------------------------------ hand-built
def test_hand_built_releases():
    """test_audit.scenario: R1 holds class c1 of J1001, J1002 (2); R2 reuses c1 for J1003 and J1008 (so far 4
    individuals) and creates c2 of J1001, J1004 (2). R1: highest 1/2, average 1/2. R2's own individuals are J1003
    and J1008 (risk 1/4 each), J1001 and J1004 (1/2 each): 4 individuals, highest 1/2, average
    (1/4 + 1/4 + 1/2 + 1/2) / 4; at threshold 0.4 the 2 of c2 are at risk, 2 of 4 (not 2 of the 6 its classes hold
    over their releases)."""
    raw, outputs = hand.scenario()
    cfg = dataclasses.replace(hand.cfg(), risk=RiskSettings(threshold=0.4))
    report = audit(raw, outputs, hand.SECRET, cfg)
    per = {p["release_id"]: p for p in report.risk["per_release"]}
    assert per["test-p0-000001"]["prosecutor"] == {"highest": 0.5, "average": 0.5, "records_at_risk": 1.0}
    r2 = per["test-p0-000002"]
    assert r2["prosecutor"] == {"highest": 0.5, "average": round((1 / 4 + 1 / 4 + 1 / 2 + 1 / 2) / 4, 6),
                                "records_at_risk": round(2 / 4, 6)}
    assert (r2["classes"], r2["individuals"], r2["individuals_in_classes"]) == (2, 4, 6)
    s = report.risk["summary"]
    # the run: releases weighed by their own individuals, 2 and 4
    p1, p2 = per["test-p0-000001"]["prosecutor"], r2["prosecutor"]
    assert s["individuals"] == 6
    assert s["prosecutor"] == {"highest": 0.5, "average": round((2 * p1["average"] + 4 * p2["average"]) / 6, 6),
                               "records_at_risk": round((2 * 1.0 + 4 * p2["records_at_risk"]) / 6, 6)}
    assert "risk" not in report.checks
    text = report.format_text()
    assert "risk: prosecutor highest=0.5 (release test-p0-000001) average=" in text and "over 2 releases" in text
    # a share, written as one (a percentage), and the marketer risk named for what it is
    share = round(s["prosecutor"]["records_at_risk"] * 100, 1)
    assert 0 < share < 100 and f"records_at_risk={share:g}% of individuals (risk > 0.4)" in text
    assert "(= prosecutor average)" in text
    assert s["highest_release_id"] == "test-p0-000001"         # the first of the two at 0.5
    assert json.loads(json.dumps(report.to_dict()))["risk"]["per_release"][0]["release_id"] == "test-p0-000001"


def test_worker_metric_bounds_a_reused_class():
    """The worker knows only what a release adds to a reused class (R2 adds 2 to c1): it counts max(k, 2) = 2,
    an upper bound of the risk the audit counts (c1 holds 4 by then)."""
    from stream_anon.render import release_risk_figures
    raw, outputs = hand.scenario()
    report = audit(raw, outputs, hand.SECRET, hand.cfg())
    audit_r2 = report.risk["per_release"][1]
    worker_r2 = release_risk_figures(outputs["manifests"][1], RiskSettings())
    assert worker_r2["prosecutor"]["average"] == 0.5 > audit_r2["prosecutor"]["average"] == 0.375
    assert worker_r2["prosecutor"]["highest"] >= audit_r2["prosecutor"]["highest"]


def test_journalist_figures_follow_the_config(tmp_path):
    raw, outputs = hand.scenario()
    cfg = dataclasses.replace(hand.cfg(), risk=RiskSettings(population=100))
    per = audit(raw, outputs, hand.SECRET, cfg).risk["per_release"]
    assert per[1]["journalist"] == release_risk([4, 2], RiskSettings(population=100), [4, 4, 2, 2])["journalist"]
    assert per[1]["journalist"]["sampling_fraction"] == 0.06


# ------------------------------------------------------------------------------------------------ worker output
def _worker_outputs(config, events, partition: int = 0):
    """The worker core (no broker) over ``events``: raw messages and the output messages by topic."""
    from stream_anon.worker.core import WorkerCore
    from stream_anon.render import TOPICS
    core = WorkerCore(config, "risk-test", SECRET)
    msgs = [(partition, i, json.dumps(e).encode()) for i, e in enumerate(events)]
    out = core.handle(msgs) + core.flush_all()
    by_topic: dict[str, list] = {}
    for topic, _key, value in out:
        by_topic.setdefault(topic, []).append(json.loads(value))
    raw = [((config.stream.input_topic, p, off), v) for p, off, v in msgs]
    outputs = {"records": by_topic.get(TOPICS.records(config.stream.name), []),
               "manifests": by_topic.get(TOPICS.releases, []), "deadletters": by_topic.get(TOPICS.deadletter, [])}
    metrics = [m for m in by_topic.get(TOPICS.metrics, []) if m.get("type") == "release"]
    return raw, outputs, metrics


@pytest.fixture(scope="module")
def oyster():
    from stream_anon import contract
    from stream_anon.config import load_config
    from stream_anon.datasets import load_events
    config = load_config(contract.config_path("oyster"))
    raw, outputs, metrics = _worker_outputs(config, load_events("oyster", limit=4000))
    return config, raw, outputs, metrics, AuditConfig.from_toml(contract.config_path("oyster"))


def test_worker_release_metric_equals_the_audit_where_no_class_is_reused(oyster):
    _config, raw, outputs, metrics, cfg = oyster
    report = audit(raw, outputs, SECRET, cfg)
    assert report.passed, report.verdict_reason
    by_id = {p["release_id"]: p for p in report.risk["per_release"]}
    manifests = {m["release_id"]: m for m in outputs["manifests"]}
    compared = reused = 0
    for metric in metrics:
        mine, theirs = metric["risk"], by_id[metric["release_id"]]
        if any(c["reused"] for c in manifests[metric["release_id"]]["classes"]):
            reused += 1
            assert mine["prosecutor"]["highest"] >= theirs["prosecutor"]["highest"]
            assert mine["prosecutor"]["average"] >= theirs["prosecutor"]["average"]
        else:
            compared += 1
            assert {k: mine[k] for k in ("classes", "individuals", "prosecutor", "marketer")} == \
                {k: theirs[k] for k in ("classes", "individuals", "prosecutor", "marketer")}
    assert compared >= 5 and compared + reused == len(metrics) == len(report.risk["per_release"])
    # k = 10: no release above 1/10
    assert report.risk["summary"]["prosecutor"]["highest"] <= 0.1


@pytest.fixture(scope="module")
def oyster_late():
    """The oyster slice arriving out of order (each tap delayed by an exponential 300 s): late taps join classes
    published by earlier releases (reuse)."""
    import numpy as np

    from stream_anon import contract
    from stream_anon.config import load_config
    from stream_anon.datasets import load_events
    from stream_anon.engine.space import parse_time
    config = load_config(contract.config_path("oyster"))
    events = load_events("oyster", limit=4000)
    arrival = np.array([parse_time(e["event_time"]) for e in events]) + \
        np.random.default_rng(1).exponential(300, len(events))
    raw, outputs, metrics = _worker_outputs(config, [events[i] for i in np.argsort(arrival, kind="stable")])
    return config, raw, outputs, metrics, AuditConfig.from_toml(contract.config_path("oyster"))


def test_release_figures_count_the_release_own_individuals(oyster_late):
    """Recounted here from the records and the raw events: a release's individuals are the distinct journeys it
    publishes (the manifest's, the worker metric's and the audit's ``individuals``), and its prosecutor average is
    their mean risk, each at 1 / the individuals of its smallest class so far. Releases reusing classes hold more
    individuals in their classes than they publish; the worker, which counts a reused class at max(k, added), never
    states a lower risk."""
    from stream_anon import crypto
    config, raw, outputs, metrics, cfg = oyster_late
    unit = {}
    for _, payload in raw:
        e = json.loads(payload)
        unit[crypto.audit_token(SECRET, e["event_id"])] = e[config.stream.privacy_unit]
    so_far: dict = {}
    expected = {}
    for m in sorted(outputs["manifests"], key=lambda m: (m["partition"], m["seq"])):
        mine = [r for r in outputs["records"] if r["release_id"] == m["release_id"] and r["audit_token"] in unit]
        for r in mine:
            so_far.setdefault(r["class_id"], set()).add(unit[r["audit_token"]])
        smallest: dict = {}
        for r in mine:
            u = unit[r["audit_token"]]
            smallest[u] = min(smallest.get(u, len(so_far[r["class_id"]])), len(so_far[r["class_id"]]))
        held = sum(len(so_far[c]) for c in {r["class_id"] for r in mine})
        if smallest:
            expected[m["release_id"]] = (len(smallest), round(sum(1 / f for f in smallest.values()) / len(smallest),
                                                              6), held)
    per = {p["release_id"]: p for p in audit(raw, outputs, SECRET, cfg).risk["per_release"]}
    assert {rid: (p["individuals"], p["prosecutor"]["average"]) for rid, p in per.items()} == \
        {rid: e[:2] for rid, e in expected.items()}
    assert {rid: p["individuals_in_classes"] for rid, p in per.items()} == {rid: e[2] for rid, e in expected.items()}
    manifests = {m["release_id"]: m for m in outputs["manifests"]}
    reusing = [rid for rid, m in manifests.items() if any(c["reused"] for c in m["classes"])]
    assert len(reusing) >= 3 and all(expected[rid][2] > expected[rid][0] for rid in reusing)
    for metric in metrics:
        rid = metric["release_id"]
        assert metric["risk"]["individuals"] == manifests[rid]["individuals"] == per[rid]["individuals"]
        assert metric["risk"]["prosecutor"]["average"] >= per[rid]["prosecutor"]["average"]
        assert metric["risk"]["prosecutor"]["records_at_risk"] >= per[rid]["prosecutor"]["records_at_risk"]


def _tampered(outputs: dict, split: int = 5) -> tuple[dict, str]:
    """The outputs with the first class of >= 2 * split individuals of a release split: the records of ``split``
    of its individuals moved to a new class (same generalization), the manifest updated to match."""
    out = copy.deepcopy(outputs)
    for m in out["manifests"]:
        for c in m["classes"]:
            if c["individuals"] >= 2 * split and not c["reused"]:
                recs = [r for r in out["records"] if r["release_id"] == m["release_id"]
                        and r["class_id"] == c["class_id"]]
                return out, (m, c, recs)
    raise AssertionError("no class large enough")


def _split(outputs: dict, raw, cfg, split: int = 5) -> dict:
    out, (m, c, recs) = _tampered(outputs, split)
    ctx, _ = build_context(raw, out, SECRET, cfg)
    by_unit: dict = {}
    for r in recs:
        by_unit.setdefault(ctx.raw_of(r).unit, []).append(r)
    moved = [r for u in sorted(by_unit)[:split] for r in by_unit[u]]
    new_id = c["class_id"] + "x"
    for r in moved:
        r["class_id"] = new_id
    c["individuals"] -= split
    c["records"] -= len(moved)
    m["classes"].append({**copy.deepcopy(c), "class_id": new_id, "individuals": split, "records": len(moved)})
    return out


def test_max_prosecutor_risk_passes_on_k10_and_fails_on_a_class_of_five(oyster):
    _config, raw, outputs, _metrics, cfg = oyster
    ok = audit(raw, outputs, SECRET, cfg, max_prosecutor_risk=0.1)
    assert ok.passed and ok.checks["risk"]["passed"] and ok.checks["risk"]["highest"] <= 0.1
    tampered = _split(outputs, raw, cfg)
    # with the stream's k = 10 the k check fails too; with k = 5 every other check holds and only the risk fails
    bad = audit(raw, tampered, SECRET, cfg, max_prosecutor_risk=0.1)
    assert {"k", "risk"} <= {n for n, c in bad.checks.items() if not c["passed"]}
    tampered5 = copy.deepcopy(tampered)          # the same release from a stream declaring k = 5
    for m in tampered5["manifests"]:
        m["k"] = 5
    bad5 = audit(raw, tampered5, SECRET, dataclasses.replace(cfg, k=5), max_prosecutor_risk=0.1)
    assert [n for n, c in bad5.checks.items() if not c["passed"]] == ["risk"], bad5.verdict_reason
    assert bad5.verdict == "FAILED" and bad5.checks["risk"]["highest"] == 0.2
    assert "highest prosecutor risk 0.2 > 0.1 (a class of 5 individuals)" in bad5.format_text()
    from stream_anon.cli import audit_exit_status
    assert audit_exit_status(ok) == 0 and audit_exit_status(bad5) == 1
    # without the option the tampered release is still reported, never judged
    plain = audit(raw, tampered5, SECRET, dataclasses.replace(cfg, k=5))
    assert plain.passed and plain.risk["summary"]["prosecutor"]["highest"] == 0.2


def test_class_sizes_are_counted_from_raw_events_not_manifests(oyster):
    """A manifest that claims more individuals does not lower the audit's risk."""
    _config, raw, outputs, _metrics, cfg = oyster
    lying = copy.deepcopy(outputs)
    for m in lying["manifests"]:
        for c in m["classes"]:
            c["individuals"] = 1000
    ctx, _ = build_context(raw, lying, SECRET, cfg)
    ctx0, _ = build_context(raw, outputs, SECRET, cfg)
    assert [s[1:] for s in release_class_sizes(ctx)] == [s[1:] for s in release_class_sizes(ctx0)]


def test_a_manifest_stating_false_individuals_fails_consistency(oyster):
    """The audit recounts each manifest's individuals (of the release and of each class) from the records' tokens
    and the raw events: one raised by 10, or a class's by 1, fails ``consistency`` in a line naming the release."""
    _config, raw, outputs, _metrics, cfg = oyster
    assert audit(raw, outputs, SECRET, cfg).passed
    rid = outputs["manifests"][2]["release_id"]
    n = outputs["manifests"][2]["individuals"]
    assert n > 0
    inflated = copy.deepcopy(outputs)
    inflated["manifests"][2]["individuals"] = n + 10
    report = audit(raw, inflated, SECRET, cfg)
    assert [name for name, c in report.checks.items() if not c["passed"]] == ["consistency"]
    assert report.checks["consistency"]["violations_by_kind"] == {"release individuals differ from records": 1}
    assert f"release {rid}: the manifest states {n + 10} individuals, its real records hold {n}" in \
        report.format_text()
    one_class = copy.deepcopy(outputs)
    c = one_class["manifests"][2]["classes"][0]
    c["individuals"] += 1
    report = audit(raw, one_class, SECRET, cfg)
    assert report.checks["consistency"]["violations_by_kind"] == {"class individuals differ from records": 1}
    assert f"release {rid} class {c['class_id']}: the manifest states {c['individuals']} individuals, its real " \
           f"records hold {c['individuals'] - 1}" in report.format_text()


# ------------------------------------------------------------------------------------------------ m-invariance
def test_intersection_candidates_equal_the_attack():
    """On naive per-window k/l releases (no invariance: the attack narrows candidates), the audit's candidate sets
    equal stream_anon.attacks.intersection's with knowledge of the QIs, for the same targets."""
    from stream_anon import contract
    from stream_anon.attacks.intersection import intersection_attack, naive_kl_releases
    from stream_anon.datasets import load_events
    cfg = AuditConfig.from_toml(contract.config_path("oyster-cards"))
    events = load_events("oyster-cards", limit=3000)
    records, manifests = naive_kl_releases(events, k=4, l=2, secret=SECRET, privacy_unit="card_id",
                                           quasi_identifiers=cfg.quasi_identifiers, stream=cfg.stream)
    raw = [((cfg.input_topic, 0, i), json.dumps(e).encode()) for i, e in enumerate(events)]
    ctx, _ = build_context(raw, {"records": records, "manifests": manifests}, SECRET, cfg)
    mine = intersection_candidates(ctx, n_targets=60, seed=1)
    units = sorted({ctx.raw_of(r).unit for r in records})
    import random
    targets = sorted(random.Random(1).sample(units, 60))
    theirs = intersection_attack(records, events, SECRET, privacy_unit="card_id", invariant=cfg.invariant,
                                 knowledge="qi", quasi_identifiers=cfg.quasi_identifiers, targets=targets)
    assert mine["targets"] == theirs["targets"] == 60
    assert mine["min_candidates"] == theirs["min_candidates"]
    assert mine["mean_candidates"] == round(theirs["mean_candidates"], 4)
    assert mine["pinned"] == theirs["pinned"] and mine["true_value_missed"] == theirs["true_value_missed"]
    # the baseline publishes exact [first, last) time intervals: a target's last event falls outside its own
    # class, so some candidate sets lose the true value or empty out; both implementations see the same
    assert mine["true_value_missed"] > 0 and mine["mean_candidates"] < 8


def test_m_invariant_output_keeps_every_candidate_set_at_m_or_more():
    """The worker's m-invariant releases (oyster-cards, m = 3): the attacker who knows a card's QIs in every
    release it appears in keeps at least m candidate values: the audit's cross-release risk is at most 1/m."""
    from stream_anon import contract
    from stream_anon.config import load_config
    from stream_anon.datasets import load_events
    config = load_config(contract.config_path("oyster-cards"))
    raw, outputs, _metrics = _worker_outputs(config, load_events("oyster-cards", limit=3000))
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(contract.config_path("oyster-cards")))
    x = report.risk["intersection"]
    assert x["targets"] >= 100 and x["true_value_missed"] == 0
    assert x["min_candidates"] >= config.anonymization.m and x["risk"] <= round(1 / config.anonymization.m, 6)
    assert report.risk["summary"]["intersection_risk"] == x["risk"]
    assert "intersection attack (m-invariance): targets=" in report.format_text()
