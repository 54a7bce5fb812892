"""The audit's health figures (loss, class sizes in individuals, suppression, deferred, dead letters, alerts),
``stream-anon audit --fail-on-alert``, and the worker's WARNING lines for release alerts (no broker)."""
from __future__ import annotations

import copy
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
    # real records: 2 at 0.1 (R1 c1), 1 at 0.1 (R2 c1), 2 at 0.5 (R2 c2): mean 1.3 / 5, p95 0.5
    assert h["ncp"] == {"records": 5, "mean": 0.26, "p95": 0.5}
    # individuals per (release, class): R1 c1 {J1001, J1002}, R2 c1 {J1003}, R2 c2 {J1001, J1004}; k = 2
    assert h["class_individuals"] == {"classes": 3, "min": 1, "p50": 2, "mean": 1.67, "p95": 2, "max": 2,
                                      "bins": {"< k": 1, "k": 2, "k+1 .. 2k-1": 0, "2k .. 4k-1": 0, ">= 4k": 0}}
    assert h["suppressed_by_reason"] == {"ncp": 1} and h["deferred"] == 1
    assert h["deadletters_by_reason"] == {"malformed_json": 1, "oversized payload": 1}
    assert h["alerts"] == {"loss_limit": 1, "suppression_limit_exceeded": 2}
    text = report.format_text()
    assert "health: NCP of published records mean=0.26 p95=0.5 (records=5)" in text
    assert "individuals per class: min=1 p50=2 mean=1.67 p95=2 max=2 over 3 classes; < k=1, k=2" in text
    assert "alerts on anon.metrics: loss_limit=1, suppression_limit_exceeded=2 (ALERT)" in text
    assert report.to_dict()["health"] == h


def test_health_without_metrics_says_not_read_and_counterfeits_are_no_records():
    raw, outputs = health_scenario()
    outputs["manifests"][1]["classes"][1]["counterfeit_records"] = 1      # one of c2's two records is counterfeit
    report = audit(raw, outputs, SECRET, cfg())
    assert report.health["alerts"] is None and "alerts on anon.metrics: not read" in report.format_text()
    assert report.health["ncp"] == {"records": 4, "mean": 0.2, "p95": 0.5}


def test_size_distribution_quantiles_and_empty():
    assert size_distribution([], 5) == {"classes": 0, "bins": {"< k": 0, "k": 0, "k+1 .. 2k-1": 0,
                                                               "2k .. 4k-1": 0, ">= 4k": 0}}
    d = size_distribution(range(1, 101), 10)
    assert (d["min"], d["p50"], d["p95"], d["max"], d["mean"]) == (1, 50, 95, 100, 50.5)


@pytest.mark.parametrize("alerts, fail_on_alert, code", [
    (None, False, 0), ({"suppression_limit_exceeded": 3}, False, 0), ({"suppression_limit_exceeded": 3}, True, 3),
    ({}, True, 0)])
def test_audit_command_exit_status_with_fail_on_alert(monkeypatch, capsys, tmp_path, alerts, fail_on_alert, code):
    from stream_anon import cli
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
    argv = ["audit", "--config", "oyster", "--broker", "127.0.0.1:9", "--report", str(tmp_path / "r.json")]
    assert cli.main(argv + (["--fail-on-alert"] if fail_on_alert else [])) == code
    out = capsys.readouterr()
    assert "AUDIT PASSED" in out.out and "health: NCP of published records mean=0.1 p95=0.2" in out.out
    assert ("--fail-on-alert: alerts on anon.metrics: suppression_limit_exceeded x3" in out.err) == (code == 3)
    assert seen["conn"].bootstrap == "127.0.0.1:9"
    assert '"health"' in (tmp_path / "r.json").read_text()


def _release(rid, suppressed, ratio, exceeded):
    manifest = {"release_id": rid, "seq": 1, "published": 10, "suppressed": suppressed, "deferred": 0,
                "ncp_mean": 0.1, "suppression_ratio": ratio, "suppression_limit_exceeded": exceeded}
    return types.SimpleNamespace(release_id=rid, partition=3, records=[], manifest=lambda: manifest,
                                 record_payloads=lambda dumps: [], late=0)


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
