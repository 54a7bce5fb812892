"""The worker as a service on a real broker (Tansu and Apache Kafka) (issue 12): ``/metrics`` shows the same figures as
``anon.metrics`` (one source), ``/livez`` and ``/readyz`` answer, and SIGTERM stops the worker cleanly in the
middle of a stream (no partial commit, the group left) so that a restart loses and duplicates nothing."""
from __future__ import annotations

import json
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from _kafka_helpers import (account, collect, read_all, setup_stream, state_offsets,  # noqa: E402
                            synthetic_fares, wait_for)

from stream_anon.broker import free_port  # noqa: E402
from stream_anon.kafka.supervise import (OutputReader, run_until_accounted, start_worker_process,  # noqa: E402
                                         stop_worker_process)
from stream_anon.kafka.replay import replay  # noqa: E402


pytestmark = pytest.mark.one_broker        # its broker tests on one broker (tests/conftest.py)

def _get(port: int, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except urllib.error.URLError:
        return 0, ""


def _metric(text: str, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_metrics_endpoint_shows_the_figures_of_anon_metrics(broker, tmp_path, secret_env):
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "svc")
    events = synthetic_fares(3000, seed=41)
    bad = [b'{"not": "json"', json.dumps({**events[5], "event_id": "BAD-X", "station": "Atlantis"})]
    replay(broker.bootstrap, cfg.stream.input_topic, events, "journey_id", progress=False, raw_payloads=bad)
    port = free_port()
    w = start_worker_process(path, broker.bootstrap, tmp_path / "state", "svc-app", 1.0, tmp_path / "w.log",
                             extra=["--web-port", str(port), "--metrics-interval", "1"])
    try:
        wait_for(lambda: _get(port, "/livez")[0] == 200, 60, "/livez")
        wait_for(lambda: _get(port, "/readyz")[0] == 200, 60, "/readyz ready (partitions assigned, recovered)")
        reader = OutputReader(broker.bootstrap, "svc")
        try:
            def done():
                reader.poll(300)
                a = reader.accounting()
                return a if a["accounted"] >= 3002 and a["deferred"] == 0 else None
            acc = wait_for(done, 90, "3002 events accounted")
        finally:
            reader.close()
        time.sleep(2.5)                                    # one more throughput metric after the last release
        status, text = _get(port, "/metrics")
        assert status == 200
        ready = json.loads(_get(port, "/readyz")[1])
    finally:
        stop_worker_process(w)
    assert ready["ready"] and sorted(ready["assigned"]) == [0, 1, 2, 3] and not ready["halted"]
    metrics = [d for _, d, _, _ in read_all(broker.bootstrap, "anon.metrics", stream="svc")]
    releases = {d["release_id"]: d for d in metrics if d["type"] == "release"}
    latest = max((d for d in metrics if d["type"] == "throughput"), key=lambda d: d["ts"])
    # one source: the endpoint and the topic agree with each other and with the output topics
    assert _metric(text, "stream_anon_events_in_total", stream="svc") == latest["events_in"] == 3002
    assert _metric(text, "stream_anon_published_total", stream="svc") == latest["published"] \
        == sum(d["published"] for d in releases.values()) == acc["published"]
    assert _metric(text, "stream_anon_releases_total", stream="svc") == latest["releases"] == len(releases)
    assert _metric(text, "stream_anon_dead_letters_total", stream="svc") == latest["dead_letters"] == 2
    assert _metric(text, "stream_anon_dead_letters_total", reason="malformed JSON") == 1
    assert _metric(text, "stream_anon_partition_events_in") == 3002
    assert _metric(text, "stream_anon_deferred") == 0
    assert _metric(text, "stream_anon_broker_connected") == 1
    assert "stream_anon_release_ncp_mean" in text
    # processing latency (arrival at the worker to commit) is a histogram of the committed batches, apart from
    # the event-time lag (synthetic 2009 events: years behind the clock)
    n_lat = _metric(text, "stream_anon_processing_latency_seconds_count")
    assert 0 < n_lat <= _metric(text, "stream_anon_transactions_total")
    assert _metric(text, "stream_anon_processing_latency_seconds_sum") / n_lat < 30
    lags = [float(v) for v in re.findall(r"^stream_anon_event_time_lag_seconds\{[^}]*\} (\S+)$", text, re.M)]
    assert lags and min(lags) > 10 * 365 * 86400


def test_sigterm_mid_stream_then_restart_loses_and_duplicates_nothing(broker, tmp_path, secret_env):
    path, cfg = setup_stream(tmp_path, broker.bootstrap, "term")
    events = synthetic_fares(6000, seed=42)
    replay(broker.bootstrap, cfg.stream.input_topic, events[:3000], "journey_id", progress=False)
    state, app_id = tmp_path / "state", "term-app"
    w = start_worker_process(path, broker.bootstrap, state, app_id, 2.0, tmp_path / "w1.log",
                             extra=["--batch-max", "50", "--batch-within", "0.1"])
    wait_for(lambda: sum(v + 1 for v in state_offsets(broker.bootstrap, app_id, "term").values()) > 0, 60,
             "first commits")
    # SIGTERM while a backlog is read; the rest of the stream is produced only after the stop, so the signal lands
    # mid-stream however fast the worker is
    replay(broker.bootstrap, cfg.stream.input_topic, events[3000:4500], "journey_id", progress=False)
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=60)
    stopped_s = time.monotonic() - t0
    assert w.returncode == 0, (w.returncode, (tmp_path / "w1.log").read_text()[-2000:])
    mid = sum(v + 1 for v in state_offsets(broker.bootstrap, app_id, "term").values())
    assert 0 < mid <= 4500, "SIGTERM landed in the middle of the stream"
    replay(broker.bootstrap, cfg.stream.input_topic, events[4500:], "journey_id", progress=False)
    acc = run_until_accounted(path, broker.bootstrap, state, 6000, timeout_s=90, app_id=app_id,
                              log_path=tmp_path / "w2.log")
    assert acc["accounted"] == 6000
    manifests, copies, records, dead = collect(broker.bootstrap, "term")     # one content per release id
    resolved, missing = account(events, secret_env, manifests, records, dead)
    assert not missing and len(resolved) == 6000
    assert stopped_s < 30
