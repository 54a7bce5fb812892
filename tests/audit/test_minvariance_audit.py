"""The independent audit on m-invariant releases: counterfeit records are recognised by the secret holder, kept out
of k and of the accounting equation, and the m-invariance checker runs on every release (issue 3)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from stream_anon.audit import AuditConfig, audit
from stream_anon.audit.primitives import audit_token, counterfeit_token
from stream_anon.config import load_config
from stream_anon.datasets import oyster_cards
from stream_anon.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
CARDS_CONFIG = ROOT / "configs" / "oyster-cards.toml"
SECRET = b"test-secret-minvariance-audit"
N_EVENTS = 6000


@pytest.fixture(scope="module")
def run():
    events = oyster_cards.read_events()[:N_EVENTS]
    engine = Engine(load_config(CARDS_CONFIG), secret=SECRET)
    releases = engine.process(events).releases + engine.flush().releases
    raw = [(("raw.fare.oyster-cards", 0, i), json.dumps(e).encode()) for i, e in enumerate(events)]
    outputs = {"records": [r for rel in releases for r in rel.records],
               "manifests": [rel.manifest() for rel in releases], "deadletters": []}
    return events, raw, outputs


def run_audit(raw, outputs):
    return audit(raw, outputs, SECRET, AuditConfig.from_toml(CARDS_CONFIG))


def fakes(outputs, raw_events):
    real = {json.loads(p)["event_id"] for _, p in raw_events}
    tokens = {audit_token(SECRET, e) for e in real}
    return [i for i, r in enumerate(outputs["records"]) if r["audit_token"] not in tokens]


def test_audit_passes_and_counterfeits_stay_out_of_the_equation(run):
    events, raw, outputs = run
    report = run_audit(raw, outputs)
    assert report.passed, report.format_text()
    s = report.summary
    n_fake = sum(m["counterfeit_records"] for m in outputs["manifests"])
    assert n_fake > 0 and s["counterfeit_records"] == n_fake
    assert s["events_in"] == N_EVENTS == s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"]
    assert s["records"] == s["published"] + n_fake
    assert report.checks["m_invariance"]["passed"] and s["signature_changes"] == 0 and s["m"] == 3
    assert report.checks["k"]["min_individuals"] >= 10           # real individuals only
    assert "m_invariance" in report.format_text()


def test_a_fabricated_record_still_fails(run):
    events, raw, outputs = run
    bad = copy.deepcopy(outputs)
    rec = copy.deepcopy(bad["records"][0])
    rec["audit_token"] = "ab" * 32                                # no raw event, announced by no manifest
    bad["records"].append(rec)
    report = run_audit(raw, bad)
    assert not report.passed
    assert "record of unknown event" in report.checks["k"]["violations_by_kind"]
    assert "token of no raw event" in report.checks["accounting"]["violations_by_kind"]


def test_a_counterfeit_in_the_wrong_class_or_miscounted_fails(run):
    events, raw, outputs = run
    idx = fakes(outputs, raw)[0]
    moved = copy.deepcopy(outputs)
    rec = moved["records"][idx]
    other = next(r for r in moved["records"] if r["release_id"] == rec["release_id"]
                 and r["class_id"] != rec["class_id"])
    rec["class_id"], rec["qi"] = other["class_id"], other["qi"]   # its token was made for another class
    report = run_audit(raw, moved)
    assert not report.passed
    assert "record of unknown event" in report.checks["k"]["violations_by_kind"]
    assert "class counterfeit records differ from manifest" in report.checks["consistency"]["violations_by_kind"]
    # a manifest that under-reports its counterfeits
    miscounted = copy.deepcopy(outputs)
    m = next(m for m in miscounted["manifests"] if m["counterfeit_records"])
    c = next(c for c in m["classes"] if c["counterfeit_records"])
    c["counterfeit_records"] -= 1
    report = run_audit(raw, miscounted)
    assert not report.passed and not report.checks["consistency"]["passed"]
    assert not report.checks["m_invariance"]["passed"]


def test_a_dropped_counterfeit_breaks_m_uniqueness_or_counts(run):
    events, raw, outputs = run
    dropped = copy.deepcopy(outputs)
    idx = fakes(outputs, raw)[0]
    del dropped["records"][idx]
    report = run_audit(raw, dropped)
    assert not report.passed
    assert not report.checks["m_invariance"]["passed"] and not report.checks["consistency"]["passed"]


def test_a_signature_change_is_caught(run):
    events, raw, outputs = run
    changed = copy.deepcopy(outputs)
    # publish a different product category on one real record: its class's value set changes in that release
    idx = next(i for i in range(len(changed["records"])) if i not in set(fakes(outputs, raw)))
    rec = changed["records"][idx]
    rec["sensitive"]["product_category"] = "other" if rec["sensitive"]["product_category"] != "other" else "payg"
    report = run_audit(raw, changed)
    assert not report.checks["m_invariance"]["passed"]
    kinds = report.checks["m_invariance"]["checks"]["m_uniqueness"]["violations_by_kind"]
    assert "published invariant value differs from raw" in kinds


def test_counterfeit_token_format_is_the_engines():
    from stream_anon.formers.counterfeits import counterfeit_token as engine_token
    assert counterfeit_token(SECRET, "s-p0-000001", "s-p0-000001-c0003", 2) == \
        engine_token(SECRET, "s-p0-000001", "s-p0-000001-c0003", 2)


def test_demo_report_keys_from_audited_outputs(run, tmp_path):
    """The m part of `stream-anon demo --m M`'s report, built from audited outputs (the demo reads the same from
    the broker)."""
    from stream_anon.cli import build_parser
    from stream_anon.demo import derived_config
    from stream_anon.evaluate.stream_figures import minvariance_report

    args = build_parser().parse_args(["demo", "--dataset", "oyster-cards", "--m", "3"])
    assert (args.dataset, args.m) == ("oyster-cards", 3)
    events, raw, outputs = run
    path = derived_config("oyster-cards", tmp_path, dp=False, m=3)
    config = load_config(path)
    report = audit(raw, outputs, SECRET, AuditConfig.from_toml(path))
    out = minvariance_report(config, path, report, outputs["records"], events, SECRET)
    assert {"m", "m_invariance_passed", "signature_changes", "counterfeit_individuals", "counterfeit_lower_bound",
            "counterfeit_records", "intersection_attack"} <= set(out)
    assert {"naive_success_rate", "naive_mean_candidates", "success_rate", "mean_candidates"} <= \
        set(out["intersection_attack"])
    assert out["m"] == 3 and out["m_invariance_passed"] and out["signature_changes"] == 0
    assert out["counterfeit_records"] == sum(m["counterfeit_records"] for m in outputs["manifests"]) > 0
    attack = out["intersection_attack"]
    assert attack["success_rate"] == 0 and attack["min_candidates"] >= 3 and attack["naive_success_rate"] > 0
    json.dumps(out)                                               # the report is JSON


def test_a_dead_lettered_copy_of_a_published_event_id_is_not_its_raw_event(run):
    """A hostile copy of a published event (same event id, another card and invariant value) arrives first and is
    dead-lettered: the m-invariance check judges the record against the copy the worker published."""
    events, raw, outputs = run
    tokens = {r["audit_token"] for r in outputs["records"]}
    target = next(e for e in events if audit_token(SECRET, e["event_id"]) in tokens)
    other = next(e["product_category"] for e in events if e["product_category"] != target["product_category"])
    copy_ = {**target, "card_id": "CARD-HOSTILE", "product_category": other}
    topic = raw[0][0][0]
    shifted = [((topic, 0, 0), json.dumps(copy_).encode())] + [((t, p, o + 1), v) for (t, p, o), v in raw]
    out = {**outputs, "deadletters": [{"reason": "schema: ...", "stream": "oyster-cards", "payload": "...",
                                       "source": {"topic": topic, "partition": 0, "offset": 0}}]}
    report = run_audit(shifted, out)
    assert report.passed, report.format_text()
    assert report.summary["dead_lettered"] == 1
