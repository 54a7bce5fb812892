"""A configuration change on the real (embedded Tansu) broker: k lowered between two runs of a worker.

Without the explicit step every partition halts (log line naming the setting, /readyz 503); with
``--accept-config-change`` every event is placed, the change is written into the manifests, and the audit judges
each release by the k in force when it was made: it passes with the new config and fails with the old one."""
from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _kafka_helpers import START, setup_stream, synthetic_fares, wait_for, write_stream_config  # noqa: E402

from stream_anon import cli  # noqa: E402
from stream_anon.broker import free_port  # noqa: E402
from stream_anon.kafka.replay import replay  # noqa: E402
from stream_anon.kafka.supervise import run_until_accounted, start_worker_process, stop_worker_process  # noqa: E402

pytestmark = pytest.mark.kafka


def _readyz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except urllib.error.URLError:
        return 0, {}


def _audit(config: Path, bootstrap: str, report: Path) -> tuple[int, dict]:
    code = cli.main(["audit", "--config", str(config), "--broker", bootstrap, "--idle", "1.0",
                     "--report", str(report)])
    return code, json.loads(report.read_text())


def test_k_lowered_halts_without_the_step_and_is_judged_release_by_release_with_it(broker, tmp_path, secret_env):
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "kdown")
    old = write_stream_config(tmp_path / "old", "kdown", cfg.stream.input_topic, k=5)
    state, app_id = tmp_path / "state", "kdown-app"
    first = synthetic_fares(800, seed=31)
    replay(broker.bootstrap, cfg.stream.input_topic, first, "journey_id", progress=False)
    assert run_until_accounted(path, broker.bootstrap, state, 800, timeout_s=90, app_id=app_id,
                               log_path=tmp_path / "w1.log")["accounted"] == 800

    write_stream_config(tmp_path / "cfg", "kdown", cfg.stream.input_topic, k=3)        # the operator's edit
    second = [{**e, "event_id": "N" + e["event_id"], "journey_id": "N" + e["journey_id"]}
              for e in synthetic_fares(600, seed=32, start=START + timedelta(hours=5))]     # after the first
    replay(broker.bootstrap, cfg.stream.input_topic, second, "journey_id", progress=False)
    port = free_port()
    w = start_worker_process(path, broker.bootstrap, state, app_id, 1.0, tmp_path / "w2.log",
                             extra=["--web-port", str(port)])
    try:
        def halted():
            code, body = _readyz(port)
            return body if code == 503 and len(body.get("halted", {})) == 4 else None
        body = wait_for(halted, 60, "four halted partitions on /readyz")
        assert {h["reason"] for h in body["halted"].values()} == {"config_changed"}, body
        time.sleep(1)
    finally:
        stop_worker_process(w)
    logged = (tmp_path / "w2.log").read_text()
    assert logged.count("anonymization.k 5 -> 3") >= 4, logged[-2000:]

    acc = run_until_accounted(path, broker.bootstrap, state, 1400, timeout_s=90, app_id=app_id,
                              log_path=tmp_path / "w3.log", extra=["--accept-config-change"])
    assert acc["accounted"] == 1400 and acc["dead_lettered"] == 0, acc

    code, report = _audit(path, broker.bootstrap, tmp_path / "new.json")
    assert code == 0 and report["verdict"] == "PASSED", report["verdict_reason"]
    changes = report["checks"]["consistency"]["k_changes"]
    assert {c["partition"] for c in changes} == {0, 1, 2, 3}
    assert {c["change"] for c in changes} == {"anonymization.k 5 -> 3"}
    code, report = _audit(old, broker.bootstrap, tmp_path / "old.json")
    assert code != 0 and "manifest k differs from the k in force" in report["checks"]["consistency"]["violations_by_kind"]
