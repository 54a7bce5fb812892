"""The audit's health figures (loss, class sizes in individuals, suppression, deferred, dead letters, alerts),
``stream-anon audit --fail-on-alert``, and the worker's WARNING lines for release alerts (no broker)."""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import types

import pytest
from test_audit import SECRET, cfg, scenario

from stream_anon.audit import audit
from stream_anon.audit.measures import size_distribution

ALERT = {"type": "alert", "stream": "test", "partition": 0, "alert": "suppression_limit_exceeded",
         "release_id": "test-p0-000002", "suppression_ratio": 0.2, "limit": 0.05}


def health_scenario():
    raw, outputs = scenario()
    outputs = copy.deepcopy(outputs)
    outputs["manifests"][1]["classes"][1]["ncp"] = 0.5          # c2 of release 2: 2 records at NCP 0.5
    outputs["deadletters"].append(copy.deepcopy(outputs["deadletters"][0]))     # a duplicate (restart)
    outputs["deadletters"].append({"reason": "oversized payload: 70000 bytes > limit 65536", "stream": "test",
                                   "source": {"topic": "raw.fare.test", "partition": 0, "offset": 99}})
    return raw, outputs


def test_health_figures_from_a_known_release_set():
    raw, outputs = health_scenario()
    alerts = [ALERT, dict(ALERT), {**ALERT, "release_id": "test-p0-000001"}, {**ALERT, "stream": "other"},
              {**ALERT, "alert": "loss_limit"}, {"type": "release", "stream": "test", "release_id": "x"}]
    report = audit(raw, outputs, SECRET, cfg(), alerts=alerts)
    h = report.health
    # real records: 2 at 0.1 (R1 c1), 2 at 0.1 (R2 c1), 2 at 0.5 (R2 c2): mean 1.4 / 6, p95 0.5
    assert h["ncp"] == {"records": 6, "mean": 0.233333, "p95": 0.5}
    # individuals per class over its releases (docs/privacy.md, Reuse of published classes): c1 {J1001, J1002}
    # in R1 and J1003, J1008 reusing it in R2, c2 {J1001, J1004}; k = 2
    assert h["class_individuals"] == {"classes": 2, "min": 2, "p50": 2, "mean": 3.0, "p95": 4, "max": 4,
                                      "bins": {"< k": 0, "k": 1, "k+1 .. 2k-1": 0, "2k .. 4k-1": 1, ">= 4k": 0}}
    assert h["suppressed_by_reason"] == {"ncp": 1} and h["deferred"] == 1
    assert h["deadletters_by_reason"] == {"malformed_json": 1, "oversized payload": 1}
    assert h["alerts"] == {"loss_limit": 1, "suppression_limit_exceeded": 2}
    text = report.format_text()
    assert "health: NCP of published records mean=0.233333 p95=0.5 (records=6)" in text
    assert "individuals per class: min=2 p50=2 mean=3.0 p95=4 max=4 over 2 classes; < k=0, k=1" in text
    assert "alerts on anon.metrics: loss_limit=1, suppression_limit_exceeded=2 (ALERT)" in text
    assert report.to_dict()["health"] == h


def test_summary_and_health_agree_on_a_class_reused_by_a_late_record():
    """R2 places the late records of J1003 and J1008 in c1, which R1 published with J1001 and J1002: one rule for
    both parts of the report (the class counts every individual published in it), and the class counts 4."""
    raw, outputs = health_scenario()
    reused = [c for m in outputs["manifests"] for c in m["classes"] if c["reused"]]
    assert [c["individuals"] for c in reused] == [2]        # the reusing release adds k individuals
    report = audit(raw, outputs, SECRET, cfg())
    assert report.summary["min_individuals"] == report.health["class_individuals"]["min"] == 2
    assert report.summary["classes"] == report.health["class_individuals"]["classes"] == 2
    assert report.health["class_individuals"]["max"] == 4
    # a class below k at creation still fails the k check whatever the reuse rule
    assert outputs["records"][0]["release_id"] == "test-p0-000001"
    outputs["records"] = outputs["records"][1:]             # c1 created with J1002 only
    report = audit(raw, outputs, SECRET, cfg())
    assert report.checks["k"]["violations_by_kind"].get("class below k at creation") == 1


def test_health_without_metrics_says_not_read_and_counterfeits_are_no_records():
    raw, outputs = health_scenario()
    outputs["manifests"][1]["classes"][1]["counterfeit_records"] = 1      # one of c2's two records is counterfeit
    report = audit(raw, outputs, SECRET, cfg())
    assert report.health["alerts"] is None and "alerts on anon.metrics: not read" in report.format_text()
    assert report.health["ncp"] == {"records": 5, "mean": 0.18, "p95": 0.5}


def test_size_distribution_quantiles_and_empty():
    assert size_distribution([], 5) == {"classes": 0, "bins": {"< k": 0, "k": 0, "k+1 .. 2k-1": 0,
                                                               "2k .. 4k-1": 0, ">= 4k": 0}}
    d = size_distribution(range(1, 101), 10)
    assert (d["min"], d["p50"], d["p95"], d["max"], d["mean"]) == (1, 50, 95, 100, 50.5)


@pytest.mark.parametrize("alerts, fail_on_alert, code", [
    (None, False, 0), ({"suppression_limit_exceeded": 3}, False, 0), ({"suppression_limit_exceeded": 3}, True, 3),
    ({}, True, 0)])
def test_audit_command_exit_status_with_fail_on_alert(monkeypatch, capsys, tmp_path, alerts, fail_on_alert, code):
    from stream_anon import cli, connection
    from stream_anon.audit import kafka_source
    from stream_anon.audit.report import AuditReport

    monkeypatch.setenv("STREAM_ANON_SECRET", "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c")
    seen = {}

    def fake(conn, config_path, secret, **kw):
        seen["conn"] = conn
        return AuditReport(True, {}, {k: 0 for k in ("events_in", "published", "suppressed", "dead_lettered",
                                                     "deferred", "lost", "duplicated", "releases", "classes",
                                                     "min_individuals", "k")},
                           health={"ncp": {"mean": 0.1, "p95": 0.2, "records": 3}, "class_individuals": {},
                                   "suppressed_by_reason": {}, "deferred": 0, "deadletters_by_reason": {},
                                   "alerts": alerts})

    monkeypatch.setattr(kafka_source, "audit_from_kafka", fake)
    monkeypatch.setattr(connection, "broker_unreachable", lambda conn, timeout_s: None)   # no broker: the fake reads
    argv = ["audit", "--config", "oyster", "--broker", "127.0.0.1:9", "--report", str(tmp_path / "r.json")]
    assert cli.main(argv + (["--fail-on-alert"] if fail_on_alert else [])) == code
    out = capsys.readouterr()
    assert "AUDIT PASSED" in out.out and "health: NCP of published records mean=0.1 p95=0.2" in out.out
    assert ("--fail-on-alert: alerts on anon.metrics: suppression_limit_exceeded x3" in out.err) == (code == 3)
    assert seen["conn"].bootstrap == "127.0.0.1:9"
    assert '"health"' in (tmp_path / "r.json").read_text()


FIRST = {"type": "alert", "stream": "test", "alert": "lineage_started", "lineage": "L1", "supersedes": [],
         "reason": "first lineage of the stream: no state, no local state cache and no manifest names an earlier "
                   "lineage"}


@pytest.mark.parametrize("later", [None, {**FIRST, "lineage": "L2", "supersedes": ["L1"]},
                                   {**FIRST, "lineage": "L2"}])
def test_a_streams_first_lineage_is_expected_and_a_later_one_stays_an_alert(monkeypatch, capsys, later):
    """Every new stream declares a first lineage: no ALERT in a passing audit and no exit 3 with --fail-on-alert.
    A lineage declared after it (--new-lineage after a lost state, or a first lineage declared again after a
    reset) stays an alert."""
    from stream_anon import cli, connection
    from stream_anon.audit import kafka_source

    raw, outputs = scenario()
    alerts = [FIRST, dict(FIRST)] + ([later] if later else [])       # a copy: the same alert read twice
    report = audit(raw, outputs, SECRET, cfg(), alerts=alerts)
    assert report.passed and report.health["expected"] == {"lineage_started": 1}
    assert report.health["alerts"] == ({"lineage_started": 1} if later else {})
    text = report.format_text()
    assert ("(ALERT)" in text) == bool(later)
    assert "expected: lineage_started=1 (a new stream's first lineage: no alert)" in text
    monkeypatch.setenv("STREAM_ANON_SECRET", "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c")
    monkeypatch.setattr(kafka_source, "audit_from_kafka", lambda *a, **kw: report)
    monkeypatch.setattr(connection, "broker_unreachable", lambda conn, timeout_s: None)   # no broker: the fake reads
    assert cli.main(["audit", "--config", "oyster", "--broker", "127.0.0.1:9", "--fail-on-alert"]) == \
        (3 if later else 0)
    assert ("--fail-on-alert: alerts on anon.metrics: lineage_started x1" in capsys.readouterr().err) == bool(later)

def _timed(outputs):
    """The scenario's releases with real window bounds: R1 closes 07:00-07:15, R2 07:15-07:30."""
    for m, (start, end) in zip(outputs["manifests"], (("07:00", "07:15"), ("07:15", "07:30"))):
        m["window_start"], m["window_end"] = f"2009-11-09T{start}:00+00:00", f"2009-11-09T{end}:00+00:00"
    return outputs


def _add_raw(raw, eid, minute, partition=0, unit="J2001"):
    from test_audit import TOPIC, ev
    offset = 1 + max(src[2] for src, _ in raw if src[1] == partition) if any(
        src[1] == partition for src, _ in raw) else 0
    raw.append(((TOPIC, partition, offset), json.dumps(ev(eid, unit, "Bank", minute)).encode()))


def test_events_of_windows_still_open_are_open_not_lost():
    raw, outputs = scenario()
    outputs = _timed(copy.deepcopy(outputs))
    _add_raw(raw, "e8", 50)                       # after R2's window: its window is still open
    _add_raw(raw, "e9", 45)
    _add_raw(raw, "e10", 5, partition=1)          # a partition that released nothing yet
    report = audit(raw, outputs, SECRET, cfg())
    assert report.passed, report.format_text()
    s = report.summary
    assert (s["open"], s["lost"], s["open_oldest"]) == (3, 0, "2009-11-09T07:05:00+00:00")
    assert "open: 3 events in windows not released yet (oldest event time 2009-11-09T07:05:00+00:00)" in \
        report.format_text()
    # an unplaced event of a window already released is lost, open windows or not
    _add_raw(raw, "e11", 10)
    report = audit(raw, outputs, SECRET, cfg())
    assert not report.passed and (report.summary["lost"], report.summary["open"]) == (1, 3)
    # e6 waited (deferred) in R1 and R2; dropped from R2's list it is lost although its time is open
    raw, outputs = scenario()
    outputs = _timed(copy.deepcopy(outputs))
    outputs["manifests"][1]["deferred_tokens"], outputs["manifests"][1]["deferred"] = [], 0
    report = audit(raw, outputs, SECRET, cfg())
    assert (report.summary["lost"], report.summary["open"]) == (1, 0)


def test_a_run_that_publishes_nothing_or_suppresses_too_much_is_not_passed():
    raw, outputs = scenario()
    outputs = copy.deepcopy(outputs)
    strict = dataclasses.replace(cfg(), max_suppression_ratio=0.05)
    report = audit(raw, outputs, SECRET, strict)      # 1 of 7 placed events suppressed: 14.3%
    assert all(c["passed"] for c in report.checks.values())
    assert (report.passed, report.verdict) == (False, "NOT PASSED")
    assert report.format_text().startswith("AUDIT NOT PASSED: 14.3% of the placed events suppressed")
    assert audit(raw, outputs, SECRET, dataclasses.replace(cfg(), max_suppression_ratio=0.2)).passed
    # every event suppressed: nothing published
    tokens = [r["audit_token"] for r in outputs["records"]]
    outputs["records"] = []
    outputs["manifests"][0]["suppressed_tokens"]["fewer_than_k"] = tokens
    for m in outputs["manifests"]:
        m["classes"], m["published"] = [], 0
    report = audit(raw, outputs, SECRET, dataclasses.replace(cfg(), max_suppression_ratio=1.0))
    assert report.checks["accounting"]["passed"], report.format_text()
    assert report.verdict == "NOT PASSED" and report.verdict_reason.startswith("nothing published")
    assert report.to_dict()["verdict"] == "NOT PASSED"



def test_an_audit_before_any_worker_ran_says_nothing_has_consumed_the_topic():
    """Raw events on the input topic and not one release, record or dead letter of the stream: the verdict says
    that no worker has consumed the topic yet (not that windows are still open)."""
    raw = [m for m in scenario()[0] if m[1] != b"{not json"]     # events only: no message without a time
    report = audit(raw, {"records": [], "manifests": [], "deadletters": []}, SECRET, cfg())
    assert report.verdict == "NOT PASSED" and report.summary["lost"] == 0, report.format_text()
    assert report.verdict_reason.startswith(f"nothing published ({report.summary['events_in']} events in, 0 "
                                            "suppressed): nothing has consumed the input topic yet"), \
        report.verdict_reason
    assert "start the worker with this config" in report.format_text()


def test_k_beyond_the_individuals_of_any_window_says_what_to_change():
    """k far too large for the data: every event suppressed, and the verdict says that no window holds k
    individuals, how many the largest holds and what to change (not the reason the last flush gave)."""
    raw, outputs = scenario()
    outputs = _timed(copy.deepcopy(outputs))
    tokens = [r["audit_token"] for r in outputs["records"]]
    outputs["records"] = []
    outputs["manifests"][0]["suppressed_tokens"]["fewer_than_k"] = tokens
    for m in outputs["manifests"]:
        m["classes"], m["published"], m["k"] = [], 0, 50
    report = audit(raw, outputs, SECRET, dataclasses.replace(cfg(), k=50, max_suppression_ratio=1.0))
    most = report.summary["window_individuals"]
    assert most["window_s"] == 900 and 2 <= most["individuals"] < 50
    assert report.verdict == "NOT PASSED" and report.verdict_reason.endswith(
        f"k = 50 is more than the distinct individuals of any window (at most {most['individuals']} in one window "
        f"of 900 s of one input partition): no class of k can form; lower anonymization.k to at most "
        f"{most['individuals']}, or lengthen anonymization.window_s and max_delay_s until a window holds k "
        "individuals, or read the input on fewer partitions (`stream-anon calibrate --suggest` proposes a window)"), \
        report.verdict_reason
    # a k the windows can reach: the dominant suppression reason, as before
    for m in outputs["manifests"]:
        m["k"] = 2
    report = audit(raw, outputs, SECRET, dataclasses.replace(cfg(), max_suppression_ratio=1.0))
    assert "k = 2 is more" not in report.verdict_reason and report.verdict_reason.startswith("nothing published")

@pytest.mark.parametrize("verdict, n_open, flags, code", [
    ("PASSED", 0, [], 0), ("FAILED", 0, [], 1), ("NOT PASSED", 0, [], 4), ("NOT PASSED", 0, ["--fail-on-alert"], 4),
    ("PASSED", 7, [], 0), ("PASSED", 7, ["--fail-on-alert"], 0), ("PASSED", 7, ["--fail-on-open"], 5)])
def test_audit_command_exit_status_by_verdict_and_open_events(monkeypatch, capsys, verdict, n_open, flags, code):
    from stream_anon import cli, connection
    from stream_anon.audit import kafka_source
    from stream_anon.audit.report import AuditReport

    monkeypatch.setenv("STREAM_ANON_SECRET", "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c")
    summary = {k: 0 for k in ("events_in", "published", "suppressed", "dead_lettered", "deferred", "lost",
                              "duplicated", "releases", "classes", "min_individuals", "k")}
    summary.update(open=n_open, open_oldest="2009-11-09T07:05:00+00:00" if n_open else None)
    report = AuditReport(verdict == "PASSED", {}, summary, health={"alerts": {}}, verdict=verdict,
                         verdict_reason=None if verdict == "PASSED" else "why")
    monkeypatch.setattr(kafka_source, "audit_from_kafka", lambda *a, **kw: report)
    monkeypatch.setattr(connection, "broker_unreachable", lambda conn, timeout_s: None)
    assert cli.main(["audit", "--config", "oyster", "--broker", "127.0.0.1:9", *flags]) == code
    out = capsys.readouterr()
    assert out.out.startswith(f"AUDIT {verdict}")
    assert ("--fail-on-open: 7 events in windows not released yet" in out.err) == (code == 5)


def _release(rid, suppressed, ratio, exceeded):
    manifest = {"release_id": rid, "seq": 1, "published": 10, "suppressed": suppressed, "deferred": 0,
                "ncp_mean": 0.1, "suppression_ratio": ratio, "suppression_limit_exceeded": exceeded}
    return types.SimpleNamespace(release_id=rid, partition=3, records=[],
                                 manifest=lambda extra=None: {**manifest, **(extra or {})},
                                 record_payloads=lambda dumps: [], late=0, own_class_sizes=())


def test_worker_logs_release_alerts_as_rate_limited_warnings(tmp_path, caplog):
    from stream_anon.config import load_config
    from stream_anon.contract import config_path
    from stream_anon.render import Renderer

    core = Renderer(load_config(config_path("oyster")), b"s" * 32)
    with caplog.at_level(logging.WARNING, logger="stream_anon.worker"):
        core.release(_release("r1", {}, 0.0, False))
        assert not caplog.records                               # no alert, no line
        docs, _, _ = core.release(_release("r2", {"fewer_than_k_individuals_by_deadline": 3}, 0.23, True))
        core.release(_release("r3", {"class_loss_above_limit": 4}, 0.29, True))
        core.release(_release("r4", {"class_loss_above_limit": 1}, 0.09, True))
    lines = [r.getMessage() for r in caplog.records]
    assert any(b'"alert":"suppression_limit_exceeded"' in v for _, _, v in docs)
    assert len(lines) == 2, lines                                # r3/r4's suppression alert held back (10 s)
    assert lines[0].startswith("alert suppression_limit_exceeded: stream oyster partition 3 release r2: 23.0% of "
                               "its records suppressed (limit 5.0%)")
    assert lines[1].startswith("alert loss_limit: stream oyster partition 3 release r3: 4 records suppressed")
    core.alert_log.last = {k: v - 60 for k, v in core.alert_log.last.items()}     # 60 s later
    with caplog.at_level(logging.WARNING, logger="stream_anon.worker"):
        core.release(_release("r5", {"class_loss_above_limit": 2}, 0.2, True))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-2].endswith("(+2 more since the last line)") and "release r5" in lines[-2]
    assert lines[-1].endswith("(+1 more since the last line)")


def test_a_run_over_its_suppression_limit_names_the_dominant_cause_and_the_setting():
    """Issue 46: the verdict of a run that suppresses too much, or publishes nothing, says why and what to change."""
    raw, outputs = scenario()
    outputs = copy.deepcopy(outputs)
    outputs["manifests"][0]["suppressed_tokens"] = {"fewer_than_k_individuals_by_deadline":
                                                    outputs["manifests"][0]["suppressed_tokens"]["ncp"]}
    report = audit(raw, outputs, SECRET, dataclasses.replace(cfg(), max_suppression_ratio=0.05))
    assert report.verdict == "NOT PASSED"
    assert "mostly fewer_than_k_individuals_by_deadline (1 of 1 suppressed): classes of k distinct individuals " \
           "did not form by the deadline: lengthen anonymization.window_s" in report.verdict_reason
    assert "lower anonymization.k" in report.verdict_reason
    outputs["records"], tokens = [], [r["audit_token"] for r in outputs["records"]]
    outputs["manifests"][0]["suppressed_tokens"]["late"] = tokens
    for m in outputs["manifests"]:
        m["classes"], m["published"] = [], 0
    report = audit(raw, outputs, SECRET, dataclasses.replace(cfg(), max_suppression_ratio=1.0))
    assert report.verdict_reason.startswith("nothing published") and "mostly late (6 of 7 suppressed)" in \
        report.verdict_reason and "allowed_lateness_s" in report.verdict_reason, report.verdict_reason
