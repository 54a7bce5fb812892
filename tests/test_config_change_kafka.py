"""Configuration changes on the real (embedded Tansu) broker, one after another on one stream: k lowered (5 -> 3),
then raised (3 -> 6), then ``window_s`` changed (900 -> 600), each between two runs of a worker.

Before each step the worker is started without the explicit step: every partition halts (one log line per partition
naming the setting, /readyz 503). With ``--accept-config-change`` every event is placed (0 dead-lettered), no
partition stalls (each one's last input offset committed), each change is written into the manifests, and the audit
judges each release by the k in force when it was made: it passes on the whole stream with the final config and
fails with the first one."""
from __future__ import annotations

import json
import sys
from datetime import timedelta
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _kafka_helpers import (START, committed_offsets, read_all, setup_stream, synthetic_fares, wait_for,  # noqa: E402
                            write_stream_config)

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


def _halted(path: Path, bootstrap: str, state: Path, app_id: str, log: Path) -> dict:
    """Start a worker without the step; wait until its 4 partitions are halted on /readyz; stop it."""
    port = free_port()
    w = start_worker_process(path, bootstrap, state, app_id, 1.0, log, extra=["--web-port", str(port)])
    try:
        def halted():
            code, body = _readyz(port)
            return body if code == 503 and len(body.get("halted", {})) == 4 else None
        return wait_for(halted, 60, "four halted partitions on /readyz")
    finally:
        stop_worker_process(w)


# each step: the settings written into the config, the one line the worker names it with
STEPS = (({"k": 3}, "anonymization.k 5 -> 3"), ({"k": 6}, "anonymization.k 3 -> 6"),
         ({"k": 6, "window_s": 600}, "anonymization.window_s 900.0 -> 600.0"))


def test_k_lowered_then_raised_then_window_changed_halts_each_time_and_is_judged_release_by_release(
        broker, tmp_path, secret_env):
    name = "kchain"
    path, cfg = setup_stream(tmp_path, broker.bootstrap, name)
    topic = cfg.stream.input_topic
    first_config = write_stream_config(tmp_path / "first", name, topic, k=5)
    state, app_id = tmp_path / "state", "kchain-app"
    sent = 600
    replay(broker.bootstrap, topic, synthetic_fares(sent, seed=31), "journey_id", progress=False)
    assert run_until_accounted(path, broker.bootstrap, state, sent, timeout_s=90, app_id=app_id, flush_when_idle_s=1.0,
                               log_path=tmp_path / "w0.log")["accounted"] == sent

    for i, (settings, line) in enumerate(STEPS, start=1):
        write_stream_config(tmp_path / "cfg", name, topic, **settings)           # the operator's edit
        later = synthetic_fares(400, seed=31 + i, start=START + timedelta(hours=5 * i))    # after the ones before
        replay(broker.bootstrap, topic, later, "journey_id", progress=False)
        sent += len(later)
        body = _halted(path, broker.bootstrap, state, app_id, tmp_path / f"halt{i}.log")
        assert {h["reason"] for h in body["halted"].values()} == {"config_changed"}, body
        named = [ln for ln in (tmp_path / f"halt{i}.log").read_text().splitlines() if "config changed on" in ln]
        assert all(ln.endswith(line) and "ERROR" in ln for ln in named), named       # one setting, one line
        assert {ln.split("config changed on partition ")[1].split(":")[0] for ln in named} == {"0", "1", "2", "3"}
        acc = run_until_accounted(path, broker.bootstrap, state, sent, timeout_s=90, app_id=app_id,
                                  flush_when_idle_s=1.0, log_path=tmp_path / f"run{i}.log",
                                  extra=["--accept-config-change"])
        assert acc["accounted"] == sent and acc["dead_lettered"] == 0 and acc["deferred"] == 0, (line, acc)

    # no stall: every partition's last input offset is committed (the input read back, not the broker's end offset)
    last = {}
    for _, _, partition, offset in read_all(broker.bootstrap, topic):
        last[partition] = max(offset, last.get(partition, -1))
    assert committed_offsets(broker.bootstrap, app_id, topic) == {p: o + 1 for p, o in last.items()}
    alerts = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.metrics", stream=name)
              if d.get("alert") == "config_change_accepted"]
    assert {(a["partition"], tuple(a["changes"])) for a in alerts} == {(p, (line,)) for _, line in STEPS
                                                                       for p in range(4)}

    code, report = _audit(path, broker.bootstrap, tmp_path / "final.json")
    assert code == 0 and report["verdict"] == "PASSED", report["verdict_reason"]
    s = report["summary"]
    assert s["events_in"] == sent == s["published"] + s["suppressed"] + s["dead_lettered"] + s["deferred"]
    assert s["dead_lettered"] == 0 and s["lost"] == 0
    changes = report["checks"]["consistency"]["k_changes"]
    assert sorted((c["partition"], c["change"]) for c in changes) == sorted(
        (p, line) for _, line in STEPS[:2] for p in range(4))
    code, report = _audit(first_config, broker.bootstrap, tmp_path / "first.json")
    violations = report["checks"]["consistency"]["violations_by_kind"]
    assert code != 0 and "manifest k differs from the k in force" in violations, violations
