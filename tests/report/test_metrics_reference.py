"""The metrics reference (docs/operations.md) against what a running DP worker's ``/metrics`` exports, and the
epsilon it shows against the ledger charge stated on the committed ``anon.aggregates`` rows."""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _metrics_helpers import RETENTION_S, across_midnight, families, get, reference, start_dp_worker  # noqa: E402

from stream_anon.datasets import load_events  # noqa: E402
from stream_anon.kafka.aggregates_view import ledger_charge_by_period, read_rows  # noqa: E402
from stream_anon.kafka.supervise import stop_worker_process  # noqa: E402


pytestmark = pytest.mark.one_broker        # its broker tests on one broker (tests/conftest.py)

def test_the_reference_table_is_complete_rows():
    ref = reference()
    assert len(ref) >= 25
    for name, row in ref.items():
        assert row["type"] in ("counter", "gauge", "histogram") and row["meaning"] and row["unit"], name
        assert name.endswith("_total") == (row["type"] == "counter"), name


@pytest.fixture(scope="module")
def dp_worker(module_broker, tmp_path_factory):
    import os
    os.environ.setdefault("STREAM_ANON_SECRET", "metrics-reference-secret-0123456789abcdef")
    tmp = tmp_path_factory.mktemp("metricsref")
    # across midnight: the first day closes, so every budget series has samples
    proc, port, cfg = start_dp_worker(module_broker.bootstrap, tmp, "metricsref",
                                      across_midnight(load_events("oyster", limit=6000)))
    try:
        status, text = get(port, "/metrics")
        assert status == 200
        rows = read_rows(module_broker.bootstrap, cfg.stream.name, idle_s=2.0)
        yield text, rows, cfg, port
    finally:
        stop_worker_process(proc)


def test_every_exported_series_is_in_the_reference_and_every_listed_one_is_exported(dp_worker):
    text = dp_worker[0]
    fams, ref = families(text), reference()
    exported = {(n + "_total" if f["type"] == "counter" and not n.endswith("_total") else n): f
                for n, f in fams.items()}
    assert sorted(set(exported) - set(ref)) == [], "exported but not documented"
    assert sorted(set(ref) - set(exported)) == [], "documented but not exported"
    for name, f in exported.items():
        assert f["type"] == ref[name]["type"], name
        if f["samples"]:
            assert f["labels"] - {"stream"} == ref[name]["labels"], name


def test_the_retention_guard_finds_the_raw_topic_within_its_declaration(dp_worker):
    """The worker created its raw topic with the declared retention: the guard reports it within, no alert."""
    text, _rows, cfg, port = dp_worker
    fams = families(text)
    topic = cfg.stream.input_topic
    value = {n: v for fam in fams.values() for n, lab, v in fam["samples"] if lab.get("topic") == topic}
    assert value == {"stream_anon_raw_retention_exceeded": 0.0, "stream_anon_raw_retention_seconds": RETENTION_S,
                     "stream_anon_raw_retention_declared_seconds": RETENTION_S}
    alerts = {lab["alert"]: v for _, lab, v in fams["stream_anon_alerts_total"]["samples"]}
    assert alerts["raw_retention_exceeded"] == 0
    import json
    guard = json.loads(get(port, "/readyz")[1])["raw_retention"]
    assert guard["exceeded"] is False and guard["cause"] is None and guard["retention_ms"] == RETENTION_S * 1000


def test_a_one_off_alert_is_counted_and_its_time_exported(dp_worker):
    """The worker declared the stream's first lineage: counted once, with its time (which a restart or a counter at
    1 before the first scrape would not hide); the operator's steps it did not take are 0."""
    import time
    fams = families(dp_worker[0])
    alerts = {lab["alert"]: v for _, lab, v in fams["stream_anon_alerts_total"]["samples"]}
    last = {lab["alert"]: v for _, lab, v in fams["stream_anon_alert_last_timestamp_seconds"]["samples"]}
    assert alerts["lineage_started"] == 1 and alerts["config_change_accepted"] == alerts["key_rotated"] == 0
    assert set(last) == {"lineage_started", "config_change_accepted", "key_rotated"}
    assert time.time() - 600 < last["lineage_started"] < time.time() and last["key_rotated"] == 0
    assert last["config_change_accepted"] == 0


def test_epsilon_spent_is_the_ledger_charge_of_the_period_on_the_committed_rows(dp_worker):
    text, rows, cfg, _ = dp_worker
    fams = families(text)
    assert rows, "the DP worker published aggregate rows"
    by_period = ledger_charge_by_period(rows.values())
    current = max(p for p in by_period if p is not None)
    period_spent = {lab["partition"]: v for _, lab, v in fams["stream_anon_epsilon_period_spent"]["samples"]}
    assert {lab["period"] for _, lab, _ in fams["stream_anon_epsilon_period_spent"]["samples"]} == {current}
    # per partition: the charge /metrics shows is the one the partition's latest rows of the period state
    for p, v in period_spent.items():
        stated = ledger_charge_by_period(r for r in rows.values() if str(r["partition"]) == p and
                                         r.get("period") == current).get(current, 0.0)
        assert v == pytest.approx(stated, abs=1e-9), p
    assert max(period_spent.values()) == pytest.approx(by_period[current], abs=1e-9)
    # per aggregate: at most its share of the period, and summing to the partition's charge
    share = {a.name: a.epsilon for a in cfg.dp.aggregates}
    per_agg: dict[str, float] = {}
    for _, lab, v in fams["stream_anon_epsilon_spent"]["samples"]:
        assert 0 <= v <= share[lab["aggregate"]] + 1e-9, lab
        per_agg[lab["partition"]] = per_agg.get(lab["partition"], 0.0) + v
    assert per_agg == pytest.approx(period_spent)
    budget = cfg.dp.epsilon_budget
    for _, lab, v in fams["stream_anon_epsilon_left"]["samples"]:
        assert v == pytest.approx(budget - period_spent[lab["partition"]])


def test_the_closed_day_s_charge_is_the_one_its_rows_state(dp_worker):
    """The worker's final idle flush releases the 10th to its last window (the schedule's clock closes the period
    the latest event is in: docs/privacy.md, Which DP rows exist): the closed period's series show the 10th's whole
    charge as its rows state it, the current period is the 10th with all its windows released."""
    text, rows, cfg, _ = dp_worker
    fams = families(text)
    by_period = ledger_charge_by_period(rows.values())
    day9, day10 = sorted(p for p in by_period if p is not None)
    closed = {lab["partition"]: (lab["period"], v)
              for _, lab, v in fams["stream_anon_epsilon_closed_period_spent"]["samples"]}
    assert closed and {p for p, _ in closed.values()} == {day10}
    for p, (_, v) in closed.items():
        mine = [r for r in rows.values() if str(r["partition"]) == p]
        assert v == pytest.approx(ledger_charge_by_period(r for r in mine if r["period"] == day10)[day10], abs=1e-9)
        last = int(datetime(2009, 11, 11, tzinfo=timezone.utc).timestamp() // cfg.anonymization.window_s) - 1
        assert max(r["window"] for r in mine) == last          # the whole day, whatever the partition's data
        assert ({lab["period"]: v for _, lab, v in fams["stream_anon_period_elapsed_ratio"]["samples"]
                 if lab["partition"] == p} == {day10: pytest.approx(1.0)})
    assert max(v for _, v in closed.values()) == pytest.approx(by_period[day10], abs=1e-9)
    assert by_period[day9] == pytest.approx(cfg.dp.epsilon_budget)
    per_agg: dict[str, float] = {}
    for _, lab, v in fams["stream_anon_epsilon_closed_period_aggregate_spent"]["samples"]:
        assert lab["period"] == day10
        per_agg[lab["partition"]] = per_agg.get(lab["partition"], 0.0) + v
    assert per_agg == pytest.approx({p: v for p, (_, v) in closed.items()})
    projected = fams["stream_anon_epsilon_period_projected"]["samples"]
    assert len(projected) == len(closed)
    assert all(lab["period"] == day10 and v == pytest.approx(cfg.dp.epsilon_budget) for _, lab, v in projected)


def _health_commands() -> dict[str, list[str]]:
    """The Dockerfile's HEALTHCHECK (liveness) and the compose workers' healthcheck (readiness), as argv."""
    import json
    import re

    import yaml

    root = Path(__file__).resolve().parents[2]
    text = re.sub(r"\\\n\s*", " ", (root / "Dockerfile").read_text())
    line = next(ln for ln in text.splitlines() if ln.startswith("HEALTHCHECK"))
    image = json.loads(line[line.index("CMD ") + 4:])
    port = re.search(r"^ENV STREAM_ANON_WEB_PORT=(\d+)$", text, re.M).group(1)
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    workers = [s for s in compose["services"].values() if s.get("command", [None])[0] == "worker"]
    assert workers and all(s["command"][s["command"].index("--web-port") + 1] == port for s in workers)
    return {"image /livez": image, "compose /readyz": workers[0]["healthcheck"]["test"][1:]}


def test_the_image_and_compose_health_checks_pass_on_a_running_worker_and_fail_without_one(dp_worker):
    import os
    import subprocess

    from stream_anon.broker import free_port
    port = dp_worker[3]
    for name, argv in _health_commands().items():
        assert "/livez" in " ".join(argv) if "image" in name else "/readyz" in " ".join(argv)
        cmd = [sys.executable if a == "python" else a for a in argv]
        ok = subprocess.run(cmd, env={**os.environ, "STREAM_ANON_WEB_PORT": str(port)}, capture_output=True)
        assert ok.returncode == 0, (name, ok.stderr)
        down = subprocess.run(cmd, env={**os.environ, "STREAM_ANON_WEB_PORT": str(free_port())}, capture_output=True)
        assert down.returncode != 0, name
