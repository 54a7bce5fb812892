"""The shipped dashboard and alert rules (stream_anon/monitoring) against Prometheus itself: ``promtool check
rules`` and ``promtool test rules`` (tests/monitoring/alerts_test.yml, one test per alert), and a real Prometheus
(Debian's ``prometheus`` package; .ci/run installs it) scraping a running DP worker, in which every dashboard
panel's and every rule's expression returns at least one series."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import wait_for  # noqa: E402
from _metrics_helpers import across_midnight, start_dp_worker  # noqa: E402

from stream_anon.broker import free_port  # noqa: E402
from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.kafka.supervise import stop_worker_process  # noqa: E402
from stream_anon.monitoring import paths  # noqa: E402

pytestmark = pytest.mark.one_broker        # its broker tests on one broker (tests/conftest.py)

TESTS = Path(__file__).resolve().parents[1]
RULES, DASHBOARD = paths()["prometheus_rules"], paths()["grafana_dashboard"]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} not installed (.ci/run installs Debian's prometheus package)")
        pytest.skip(f"{name} not installed: apt-get install -y prometheus")
    return path


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _panel_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"].replace('"$stream"', '".*"')) for p in dash["panels"] for t in p["targets"]]


COMPARISON = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.eE+-]+\s*$")


def _alert_parts(expr: str) -> list[str]:
    """An alert's expression without its thresholds: each side of an ``and``, its trailing comparison removed."""
    return [COMPARISON.sub("", part).strip() for part in re.split(r"\band(?:\s+on\s*\([^)]*\))?", expr)]


def test_promtool_checks_and_unit_tests_every_alert():
    promtool = _tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = yaml.safe_load((TESTS / "monitoring" / "alerts_test.yml").read_text())
    tested = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"] if case["exp_alerts"]}
    assert tested == {r["alert"] for r in _rules() if "alert" in r}, "an alert without a firing unit test"
    run = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=TESTS / "monitoring",
                         capture_output=True, text=True)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_alert_parts_strip_thresholds():
    assert _alert_parts("a:b > 3 and on (stream) c:d > 0") == ["a:b", "c:d"]
    assert _alert_parts("x == 1") == ["x"]


def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)
    assert doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


def test_every_dashboard_and_rule_expression_returns_series_from_a_running_worker(broker, tmp_path, monkeypatch):
    prometheus = _tool("prometheus")
    monkeypatch.setenv("STREAM_ANON_SECRET", "monitoring-test-secret-0123456789abcdef")
    # across midnight: a day closes, so the closed period's series (a panel's, a rule's) exist
    proc, port, _ = start_dp_worker(broker.bootstrap, tmp_path, "monitored",
                                    across_midnight(load_events("oyster", limit=4000)))
    prom_port = free_port()
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
           "scrape_configs": [{"job_name": "stream-anon", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                            cwd=tmp_path, stdout=open(tmp_path / "prometheus.log", "wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _query(prom_port, "up")[0]["value"][1] == "1" if _ready(prom_port) and
                 _query(prom_port, "up") else None, 60, "Prometheus scraping the worker")
        # rate() and deriv() need two samples in their range; the recording rules one evaluation after that
        wait_for(lambda: float(_query(prom_port, "count_over_time(stream_anon_events_in_total[1m])")[0]["value"][1])
                 >= 4 and _query(prom_port, "stream_anon:events_in:rate5m"), 60, "samples and recorded series")
        time.sleep(2.0)
        empty = []
        for title, expr in _panel_exprs():
            if not _query(prom_port, expr):
                empty.append(("panel", title, expr))
        for rule in _rules():
            exprs = [rule["expr"]] if "record" in rule else _alert_parts(rule["expr"])
            for expr in exprs:
                if not _query(prom_port, expr):
                    empty.append(("rule", rule.get("record") or rule["alert"], expr))
            if "record" in rule and not _query(prom_port, rule["record"]):
                empty.append(("recorded", rule["record"], rule["record"]))
        with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=10) as r:
            health = {x["name"]: x["health"] for g in json.load(r)["data"]["groups"] for x in g["rules"]}
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        stop_worker_process(proc)
    assert empty == []
    assert len(health) == len(_rules()) and set(health.values()) == {"ok"}, health


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
